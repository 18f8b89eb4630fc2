set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R
export PYTHONPATH=$PWD/python
for i in 1 2; do
  OUT=$R/w1-$i XLOG_BENCH_WORKLOADS=W1 timeout 200 bash scripts/bench-gpu > $R/w1-$i.log 2>&1; echo w1 $i rc=$?
  grep -iE "turns|W1 " $R/w1-$i/bench/results.md 2>/dev/null | head -8; tail -2 $R/w1-$i.log; el w1 $i
done
