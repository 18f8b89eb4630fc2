set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/b; mkdir -p $R; W=/tmp/b; mkdir -p $W
export PYTHONPATH=$PWD/python
# CuPy with changing sizes: CuPy's pool, the driver pool (threshold max), xlog; separate processes, two rounds
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 200 python3 benches/cupy_dyn.py --out $W/cupy --steps 40 --repeat 2 > $R/cupy.log 2>&1; echo cupy rc=$?
tail -12 $R/cupy.log; cp $W/cupy/results.json $R/cupy.json; el cupy
# det_dyn and bert_serve again, every allocator (the second run of call a's table)
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 240 python3 benches/w7_training.py --out $W/w7 --models det_dyn,bert_serve \
  --allocators caching,async,expandable,xlog --steps 10 --shapes-warm --no-w8 --time-budget 220 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\| (det|bert)" $R/w7.log | head -8; cp $W/w7/results.json $R/w7.json; el w7
# W1 with the head library (unstripped, .prebuilt), twice
for i in 1 2; do
  OUT=$W/w1-$i XLOG_BENCH_WORKLOADS=W1 timeout 120 bash scripts/bench-gpu > $R/w1-$i.log 2>&1; echo w1 $i rc=$?
  grep -iE "turns|W1 " $W/w1-$i/bench/results.md 2>/dev/null | head -8; el w1 $i
done
