set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R
export PYTHONPATH=$PWD/python
W11_LIB=$PWD/.gpu/h0.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=3 W11_ARGS="--rounds 31 --fact-log2 13:20" timeout 150 bash benches/w11_run.sh $R/w11s > $R/w11s.log 2>&1; echo w11s rc=$?
grep -E "^\| |Results" $R/w11s.log; python3 -c "
import json
for l in open('$R/w11s/w11.jsonl'):
    j=json.loads(l)
    if j.get('allocator','').startswith('xlog'):
        s=j.get('stats') or j
        print('held', s.get('peak_outstanding_bytes'), 'live', s.get('peak_live_bytes'), 'ratio', round(s.get('peak_outstanding_bytes',0)/max(1,s.get('peak_live_bytes',1)),3))
" 2>&1 | tail -4; rm -rf $R/w11s/logs; el w11s
for i in 1 2; do
  OUT=$R/w1-$i XLOG_BENCH_WORKLOADS=W1 timeout 170 bash scripts/bench-gpu > $R/w1-$i.log 2>&1; echo w1 $i rc=$?
  grep -iE "turns|W1 " $R/w1-$i/bench/results.md 2>/dev/null | head -8; tail -2 $R/w1-$i.log; el w1 $i
done
export XLOG_CUDA_LIBRARY=$PWD/.gpu/h0.so
timeout 80 python3 benches/w7_ab.py --out $R/ab1 --cpus 4,5 --models gpt2 --arms caching,xlog --steps 10 --passes 10 > $R/ab1.log 2>&1; echo ab1 rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab1/results.md; rm -f $R/ab1/results.json; el ab1
