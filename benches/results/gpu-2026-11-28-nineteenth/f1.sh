set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/f; mkdir -p $R; W=/tmp/f; mkdir -p $W
export PYTHONPATH=$PWD/python
for k in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 100 taskset -c 4 python3 benches/cupy_alloc_cost.py --json $R/cost-$k.json > $W/cost-$k.log 2>&1; echo cost $k rc=$?; tail -2 $W/cost-$k.log; el cost $k
done
for k in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 60 taskset -c 4,5 python3 benches/cupy_dyn.py --ab --out $W/ab-$k --steps 40 --passes 6 > $W/ab-$k.log 2>&1; echo ab $k rc=$?
  tail -1 $W/ab-$k.log; cp $W/ab-$k/ab.json $R/cupy-ab-$k.json; el ab $k
done
