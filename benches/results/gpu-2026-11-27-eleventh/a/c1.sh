set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
R=/tmp/res11a; mkdir -p $R
export XLOG_CUDA_LIBRARY=$PWD/.gpu/cur.so PYTHONPATH=$PWD/python
for a in caching xlog caching xlog; do timeout 60 python3 .gpu/pair.py $a 2>&1 | tail -1 | tee -a $R/pair.txt; done
el pair
timeout 300 python3 benches/w7_training.py --out /tmp/w7a --models gpt2_dyn,mlm_dyn --allocators caching,xlog --steps 10 --warmup 0 --shapes-warm --repeat 2 --timeout 100 --no-w8 > $R/w7a.log 2>&1; echo rc=$?
cp /tmp/w7a/results.json $R/w7a.json; cp /tmp/w7a/results.md $R/w7a.md
python3 - <<'PY'
import json; d=json.load(open('/tmp/w7a/results.json'))
for r in d['runs']:
    print(r['model'], r['allocator'], r.get('repeat'), round(r.get('median_step_ms') or 0,2), [round(x,1) for x in r.get('step_ms',[])])
    ps=r.get('xlog_per_step')
    if ps: print('   maps', [p['pages_mapped'] for p in ps], 'unmaps', [p['pages_unmapped'] for p in ps], 'miss', [p['cache_misses'] for p in ps], 'allocs', [p['allocations'] for p in ps])
PY
el w7
for rep in 1 2 3; do
  W11_BUILD=build-w11 W11_LIB=$PWD/.gpu/cur.so W11_RUNS=1 W11_ARGS="--rounds 31 --fact-log2 13:20" W11_ALLOCATORS="xlog" W11_TIMEOUT=40 timeout 150 bash benches/w11_run.sh /tmp/w11s-$rep > $R/w11s-$rep.log 2>&1
  echo "small $rep: $(grep -h 'w11_engine \[' $R/w11s-$rep.log | sed 's/(median.*peak/peak/' | tr '\n' ' ')"
  cp /tmp/w11s-$rep/w11.jsonl $R/w11s-$rep.jsonl
done
el w11
tar czf $OUT/res11a.tgz -C /tmp res11a
