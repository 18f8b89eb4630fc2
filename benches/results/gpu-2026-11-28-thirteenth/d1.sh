set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/n5.so
timeout 300 python3 benches/w7_turns.py --out /tmp/td --unit pass --cpus 4,5 --allocators caching,xlog,xlog+XLOG_TORCH_ALLOCATOR=pluggable,caching_pluggable --models mlm_dyn,gpt2 --steps 10 --passes 10 > $R/turns.log 2>&1; echo turns rc=$?
cp /tmp/td/results.md $R/turns.md; cp /tmp/td/results.json $R/turns.json; grep -E "^\| (gpt2|mlm)" $R/turns.md | cut -d'|' -f2-9
el turns
unset XLOG_CUDA_LIBRARY
OUT=$R XLOG_BENCH_WORKLOADS=W1 timeout 240 bash scripts/bench-gpu > $R/w1.log 2>&1; echo w1 rc=$?
grep -E "W1" $R/bench/results.md 2>/dev/null | head -12; tail -3 $R/w1.log
el w1
