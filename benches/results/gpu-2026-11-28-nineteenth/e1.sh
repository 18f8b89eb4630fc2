set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R; W=/tmp/e; mkdir -p $W
export PYTHONPATH=$PWD/python
# step time in one process, the order now rotated with the step and the pass
for k in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 60 python3 benches/cupy_dyn.py --ab --out $W/cupy-$k --steps 40 --passes 6 > $R/cupy-ab-$k.log 2>&1; echo cupy ab $k rc=$?
  tail -1 $R/cupy-ab-$k.log; el cupy ab $k
done
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 170 python3 benches/w7_ab.py --out $W/ab-new --cpus 4,5 --models det_dyn,bert_serve --arms caching,xlog --steps 10 --passes 4 > $R/ab-new.log 2>&1; echo ab new rc=$?
grep -E "^\| (det|bert)" $R/ab-new.log | head -6; el ab new
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 250 python3 benches/w7_ab.py --out $W/ab-dyn --cpus 4,5 --models mlm_dyn,cnn_dyn,t5_dyn --arms caching,xlog --steps 10 --passes 4 > $R/ab-dyn.log 2>&1; echo ab dyn rc=$?
grep -E "^\| (mlm|cnn|t5)" $R/ab-dyn.log | head -8; el ab dyn
