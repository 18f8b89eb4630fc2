set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/h; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/n7.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 110 python3 benches/w7_turns.py --out /tmp/th --unit pass --cpus 4,5 --allocators caching,xlog --models mlm_dyn --steps 10 --passes 12 > $R/turns.log 2>&1; echo turns rc=$?
cp /tmp/th/results.md $R/turns.md; cp /tmp/th/results.json $R/turns.json; grep -E "^\| (gpt2|mlm)" $R/turns.md | cut -d'|' -f2-9
el turns
timeout 70 python3 benches/torch_alloc_cost.py --sizes small --turns 2 --iters 100000 --cpus 4,5 --allocators caching,xlog --out $R/cost-small.json > $R/cost-small.log 2>&1; echo cost rc=$?
tail -4 $R/cost-small.log
el cost
