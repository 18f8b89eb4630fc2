set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/i; mkdir -p $R
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print('$2', j['status'], 'bad', j.get('mismatched_rounds'), 'ms', j['round_ms_median'], 'raw-max', j.get('turns_round_ms_median'), 'ratio', j.get('turns_ratio_median'), 'misses', j.get('cache_misses'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20)
"; }
# W11 in one process against raw-max in turns: r5 (518ae0f, before the last stop's changes) and g1 (f95c059) in turn
for i in 1 2 3 4 5; do for v in r5 g1; do
  W11_LIB=$PWD/.gpu/$v.so W11_ALLOCATORS="xlog" W11_RUNS=1 W11_ARGS="--rounds 31 --turns raw-max" timeout 90 bash benches/w11_run.sh /tmp/t-$v-$i > /tmp/t-$v-$i.log 2>&1
  show /tmp/t-$v-$i/w11.jsonl $v | tee -a $R/w11-summary.txt
done; done; el w11
