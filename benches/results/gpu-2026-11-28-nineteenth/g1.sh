set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/g; mkdir -p $R; W=/tmp/g; mkdir -p $W
export PYTHONPATH=$PWD/python
# mlm_dyn and gpt2_dyn step time in one process, the order rotated with the step and the pass, twice
for k in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 150 python3 benches/w7_ab.py --out $W/ab-$k --cpus 4,5 --models mlm_dyn,gpt2_dyn --arms caching,xlog --steps 10 --passes 4 > $R/ab-$k.log 2>&1; echo ab $k rc=$?
  grep -E "^\| (mlm|gpt2)" $R/ab-$k.log | head -6; el ab $k
done
