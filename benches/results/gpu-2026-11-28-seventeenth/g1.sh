set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/g; mkdir -p $R
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print('$2', j['label'], j['status'], 'bad', j.get('mismatched_rounds'), 'ms', j['round_ms_median'], 'turns', j.get('turns_round_ms_median'), 'ratio', j.get('turns_ratio_median'), 'misses', j.get('cache_misses'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20, 'device', j['device_peak_bytes']>>20)
"; }
# W11 at an eighth of the data, separate processes, each logging its calls
for i in 1 2 3 4; do v=r4
  XLOG_LOG_PATH=$R/small-$i.csv W11_LIB=$PWD/.gpu/$v.so W11_ALLOCATORS="xlog" W11_RUNS=1 W11_ARGS="--rounds 31 --fact-log2 13:20" timeout 60 bash benches/w11_run.sh $R/s-$v-$i > $R/s-$v-$i.log 2>&1
  show $R/s-$v-$i/w11.jsonl small-$v | tee -a $R/summary.txt; rm -rf $R/s-$v-$i $R/s-$v-$i.log
  grep ",reserve," $R/small-$i.csv > $R/reserve-$i.csv; gzip -9 $R/small-$i.csv
done; el small

ls -la $R; el done
