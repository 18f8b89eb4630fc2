set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
R=$OUT/d1; mkdir -p $R
export XLOG_CUDA_LIBRARY=$PWD/.gpu/base.so PYTHONPATH=$PWD/python
timeout 400 python3 benches/w7_turns.py --out /tmp/t1 --unit pass --cpus 4,5 --allocators caching,xlog,xlog+XLOG_CUDA_LIBRARY=$PWD/.gpu/new.so --models gpt2,mlm_dyn,gpt2_dyn,resnet50 --steps 10 --passes 10 > $R/t1.log 2>&1; echo rc=$?
cp /tmp/t1/results.json $R/t1.json; cp /tmp/t1/results.md $R/t1.md; grep -E "^\| (gpt2|mlm|resnet)" $R/t1.md | cut -d'|' -f2-9
python3 - <<'PY'
import json
d=json.load(open('/tmp/t1/results.json'))
for m in d['models']:
    if not m.get('ok'): print(m['model'], m.get('error')); continue
    print(m['model'], {a: {k: (s or {}).get(k) for k in ('pages_mapped','pages_unmapped','cache_misses')} for a, s in m['child_stats'].items()})
PY
el turns
export XLOG_CUDA_LIBRARY=$PWD/.gpu/new.so
timeout 150 python3 benches/w7_training.py --out /tmp/w1 --models gpt2 --allocators caching,expandable,xlog --steps 10 --no-w8 > $R/w7.log 2>&1; echo rc=$?
cp /tmp/w1/results.md $R/w7.md; grep -E "^\| gpt2" $R/w7.md
el w7
