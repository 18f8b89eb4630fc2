set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/a; mkdir -p $R; W=/tmp/a; mkdir -p $W
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# kv_serve with the fixed library (h1 = bdb1c3b): every allocator, separate processes
XLOG_CUDA_LIBRARY=$PWD/.gpu/h1.so timeout 280 python3 benches/w7_training.py --out $W/w7 --models kv_serve \
  --allocators caching,async,expandable,xlog --gen-kv-steps 5 --shapes-warm --no-w8 --time-budget 270 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\|" $R/w7.log | head -30; tail -3 $R/w7.log; cp $W/w7/results.json $R/w7.json; el w7
# step time, both allocators in one process
XLOG_CUDA_LIBRARY=$PWD/.gpu/h1.so timeout 150 python3 benches/w7_ab.py --out $W/ab --cpus 4,5 --models kv_serve --arms caching,xlog --steps 5 --passes 2 > $R/ab.log 2>&1; echo ab rc=$?
grep -E "^\||ratio|median|pages" $R/ab.log | head -16; tail -3 $R/ab.log; el ab
# W1 with the head library (unstripped, .prebuilt)
OUT=$W/w1-1 XLOG_BENCH_WORKLOADS=W1 timeout 100 bash scripts/bench-gpu > $R/w1-1.log 2>&1; echo w1 rc=$?
grep -iE "turns|W1 " $W/w1-1/bench/results.md 2>/dev/null | head -8; el w1
