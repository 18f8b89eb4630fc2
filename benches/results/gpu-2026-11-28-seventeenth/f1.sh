set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/f; mkdir -p $R
export PYTHONPATH=$PWD/python
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print('$2', j['label'], j['status'], 'bad', j.get('mismatched_rounds'), 'ms', j['round_ms_median'], 'misses', j.get('cache_misses'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20, 'device', j['device_peak_bytes']>>20)
"; }
# W11 default sizes, separate processes: r3 and raw-max, again
W11_LIB=$PWD/.gpu/r3.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=3 W11_ARGS="--rounds 31" timeout 200 bash benches/w11_run.sh $R/w11 > $R/w11.log 2>&1; echo w11 rc=$?
grep -E "^\| |Results" $R/w11.log; show $R/w11/w11.jsonl sep-r3 | tee -a $R/summary.txt; rm -rf $R/w11/logs; el w11
# gpu-check with r3 (unstripped, .prebuilt)
OUT=$R timeout 400 bash scripts/gpu-check .prebuilt > $R/gpu-check.log 2>&1; echo gpu-check rc=$?
cat $R/gpu-check/summary.txt 2>/dev/null | tail -45
rm -f $R/gpu-check/sanitizer.log $R/gpu-check/build.log $R/gpu-check/configure.log
el gpu-check
