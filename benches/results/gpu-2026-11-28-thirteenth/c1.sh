set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/${TAG:-c}; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/n5.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 benches/torch_alloc_cost.py --sizes small --turns 3 --iters 100000 --cpus 4,5 --allocators caching,xlog,xlog+XLOG_TORCH_ALLOCATOR=pluggable,xlog+XLOG_CUDA_LIBRARY=$PWD/.gpu/n4.so --out $R/cost-small.json > $R/cost-small.log 2>&1; echo cost rc=$?
tail -6 $R/cost-small.log
el cost
timeout 330 python3 benches/w7_turns.py --out /tmp/tc --unit pass --cpus 4,5 --allocators caching,xlog,xlog+XLOG_TORCH_ALLOCATOR=pluggable,caching_pluggable --models mlm_dyn,gpt2 --steps 10 --passes 10 > $R/turns.log 2>&1; echo turns rc=$?
cp /tmp/tc/results.md $R/turns.md; cp /tmp/tc/results.json $R/turns.json; grep -E "^\| (gpt2|mlm)" $R/turns.md | cut -d'|' -f2-9
el turns
