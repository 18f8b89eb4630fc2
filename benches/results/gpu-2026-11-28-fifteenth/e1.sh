set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R
export PYTHONPATH=$PWD/python
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print(j['label'], 'ms', j['round_ms_median'], 'turns', j.get('turns_round_ms_median'), 'ratio', j.get('turns_ratio_median'), 'misses', j.get('cache_misses'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20, 'device', j['device_peak_bytes']>>20)
"; }
W11_LIB=$PWD/.gpu/h0.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=4 W11_ARGS="--rounds 31" timeout 240 bash benches/w11_run.sh $R/w11 > $R/w11.log 2>&1; echo w11 rc=$?
grep -E "^\| " $R/w11.log; show $R/w11/w11.jsonl; rm -rf $R/w11/logs; el w11
W11_LIB=$PWD/.gpu/h0.so W11_ALLOCATORS="xlog" W11_RUNS=4 W11_ARGS="--rounds 31 --turns raw-max" timeout 200 bash benches/w11_run.sh $R/w11t > $R/w11t.log 2>&1; echo w11t rc=$?
show $R/w11t/w11.jsonl; rm -rf $R/w11t/logs; el w11t
