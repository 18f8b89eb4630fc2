set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/j; mkdir -p $R
export PYTHONPATH=$PWD/python
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print('$2', j['label'], j['status'], 'bad', j.get('mismatched_rounds'), j.get('wrong_queries'), 'ms', j['round_ms_median'], 'turns', j.get('turns_round_ms_median'), 'ratio', j.get('turns_ratio_median'), 'misses', j.get('cache_misses'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20, 'device', j['device_peak_bytes']>>20)
"; }
W11_LIB=$PWD/.gpu/e7c.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=3 W11_ARGS="--rounds 31" timeout 120 bash benches/w11_run.sh $R/w11 > $R/w11.log 2>&1; echo w11 rc=$?
grep -E "^\| |Results" $R/w11.log; show $R/w11/w11.jsonl sep | tee $R/summary.txt; rm -rf $R/w11/logs; el w11
W11_LIB=$PWD/.gpu/e7c.so W11_ALLOCATORS="xlog" W11_RUNS=3 W11_ARGS="--rounds 31 --turns raw-max" timeout 90 bash benches/w11_run.sh $R/w11t > $R/w11t.log 2>&1; echo w11t rc=$?
show $R/w11t/w11.jsonl turns | tee -a $R/summary.txt; rm -rf $R/w11t/logs; el w11t
W11_LIB=$PWD/.gpu/e7c.so W11_ALLOCATORS="xlog" W11_RUNS=2 W11_ARGS="--rounds 31 --fact-log2 13:20" timeout 60 bash benches/w11_run.sh $R/w11s > $R/w11s.log 2>&1; echo w11s rc=$?
show $R/w11s/w11.jsonl small | tee -a $R/summary.txt; rm -rf $R/w11s/logs; el w11s
