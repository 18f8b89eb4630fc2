set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/i; mkdir -p $R
export PYTHONPATH=$PWD/python
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print('$2', 'ms', j['round_ms_median'], 'turns', j.get('turns_round_ms_median'), 'ratio', j.get('turns_ratio_median'), 'misses', j.get('cache_misses'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20)
"; }
for i in 1 2 3 4; do for v in x4c e7; do
  W11_LIB=$PWD/.gpu/$v.so W11_ALLOCATORS="xlog" W11_RUNS=1 W11_ARGS="--rounds 31 --turns raw-max" timeout 60 bash benches/w11_run.sh $R/t-$v-$i > $R/t-$v-$i.log 2>&1
  show $R/t-$v-$i/w11.jsonl $v | tee -a $R/summary.txt; rm -rf $R/t-$v-$i $R/t-$v-$i.log
done; el round $i; done
