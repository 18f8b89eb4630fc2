set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/h; mkdir -p $R
export PYTHONPATH=$PWD/python
show() { python3 -c "
import json
for l in open('$1'):
    j=json.loads(l)
    print('$2', j['label'], j['status'], 'bad', j.get('mismatched_rounds'), 'ms', j['round_ms_median'], 'turns', j.get('turns_round_ms_median'), 'ratio', j.get('turns_ratio_median'), 'held', (j.get('peak_outstanding_bytes') or 0)>>20, 'live', (j.get('peak_live_bytes') or 0)>>20, 'device', j['device_peak_bytes']>>20)
"; }
# W12: two processes share the GPU, each with half of a 16 GiB budget
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 120 python3 benches/w12_shared_gpu.py --out $R/w12 --budget 16GiB --seconds 12 --timeout 60 > $R/w12.log 2>&1; echo w12 rc=$?
grep -E "^\||Pass|pass|FAIL" $R/w12/results.md 2>/dev/null | head -12; rm -f $R/w12/*.json; el w12
# W11 in one process against raw-max in turns, three runs
for i in 1 2 3; do
  W11_LIB=$PWD/.gpu/g1.so W11_ALLOCATORS="xlog" W11_RUNS=1 W11_ARGS="--rounds 31 --turns raw-max" timeout 90 bash benches/w11_run.sh /tmp/t-$i > /tmp/t-$i.log 2>&1; echo w11 $i rc=$?
  show /tmp/t-$i/w11.jsonl turns | tee -a $R/w11-summary.txt; tail -2 /tmp/t-$i.log; el w11 $i
done
