set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print('$2', j['label'], j['status'], 'bad', j.get('mismatched_rounds'), 'ms', j['round_ms_median'], 'misses', j.get('cache_misses'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20, 'device', j['device_peak_bytes']>>20)
"; }
# GPT-2 and mlm_dyn step time, both allocators in one process, with r3
for m in gpt2 gpt2 mlm_dyn; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/r3.so timeout 200 python3 benches/w7_ab.py --out $R/ab-$m-$SECONDS --cpus 4,5 --models $m --arms caching,xlog --steps 10 --passes 8 > $R/ab-$m.log 2>&1; echo ab $m rc=$?
  grep -E "^\||ratio|median" $R/ab-$m.log | head -12; el ab $m
done
# W11 default sizes, separate processes: r3 and raw-max
W11_LIB=$PWD/.gpu/r3.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=3 W11_ARGS="--rounds 31" timeout 200 bash benches/w11_run.sh $R/w11 > $R/w11.log 2>&1; echo w11 rc=$?
grep -E "^\| |Results" $R/w11.log; show $R/w11/w11.jsonl sep-r3 | tee -a $R/summary.txt; rm -rf $R/w11/logs; el w11
