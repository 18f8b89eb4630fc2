set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R; W=/tmp/d; mkdir -p $W
export PYTHONPATH=$PWD/python
# CuPy step time: CuPy's pool and xlog in one process, in turns
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 150 python3 benches/cupy_dyn.py --ab --out $W/ab --steps 40 --passes 6 > $R/cupy-ab.log 2>&1; echo cupy ab rc=$?
tail -3 $R/cupy-ab.log; cp $W/ab/ab.json $R/cupy-ab.json; el cupy ab
# W8 on det_dyn: budget 1.05 x the smallest peer's device peak (expandable segments, measured in the same run)
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 300 python3 benches/w7_training.py --out $W/w8 --models det_dyn \
  --allocators expandable,xlog --steps 10 --shapes-warm --w8-models det_dyn --time-budget 280 > $R/w8.log 2>&1; echo w8 rc=$?
grep -E "^\|" $R/w8.log | head -20; cp $W/w8/results.json $R/w8.json; el w8
