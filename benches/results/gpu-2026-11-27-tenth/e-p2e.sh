set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
R=/tmp/res10e; mkdir -p $R
for rep in 1 2 3; do for lib in t0 p2; do
  al="xlog"; [[ $lib == t0 ]] && al="xlog raw-max"
  W11_BUILD=build-w11-$lib W11_LIB=$PWD/.gpu/$lib.so W11_RUNS=1 W11_ARGS="--rounds 31" W11_ALLOCATORS="$al" W11_TIMEOUT=40 timeout 150 bash benches/w11_run.sh /tmp/w11-$lib-$rep > $R/w11-$lib-$rep.log 2>&1
  echo "$lib $rep: $(grep -h 'w11_engine \[' $R/w11-$lib-$rep.log | sed 's/(median.*peak/peak/' | tr '\n' ' ')"
  cp /tmp/w11-$lib-$rep/w11.jsonl $R/w11-$lib-$rep.jsonl
done; done
el "w11 small"
for rep in 1 2; do
  W11_BUILD=build-w11-p2 W11_LIB=$PWD/.gpu/p2.so W11_RUNS=1 W11_ARGS="--rounds 31 --fact-log2 13:20" W11_ALLOCATORS="xlog" W11_TIMEOUT=40 timeout 150 bash benches/w11_run.sh /tmp/w11s-$rep > $R/w11s-p2-$rep.log 2>&1
  echo "p2 small $rep: $(grep -h 'w11_engine \[' $R/w11s-p2-$rep.log | sed 's/(median.*peak/peak/' | tr '\n' ' ')"
  cp /tmp/w11s-$rep/w11.jsonl $R/w11s-p2-$rep.jsonl
done
el "w7"
XLOG_CUDA_LIBRARY=$PWD/.gpu/p2.so PYTHONPATH=$PWD/python timeout 200 python3 benches/w7_training.py --out /tmp/w7e --models gpt2,gpt2_dyn --allocators xlog --steps 12 --warmup 3 --repeat 1 --timeout 120 --no-w8 > $R/w7e.log 2>&1; echo rc=$?
cp /tmp/w7e/results.json $R/w7e.json
python3 -c "
import json; d=json.load(open('/tmp/w7e/results.json')); runs=d.get('runs') or d['w7']['runs']
for r in runs:
    x=r.get('xlog') or {}
    print(r['model'], r['allocator'], round(r.get('median_step_ms') or 0,2), round((r.get('device_peak_bytes') or 0)/1e9,3), round((r.get('peak_live_bytes') or 0)/1e9,3), x.get('pages_mapped'), x.get('peak_outstanding_bytes'))"
tar czf $OUT/res10e.tgz -C /tmp res10e
el done
