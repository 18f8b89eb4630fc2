set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/b; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/n4.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for sz in small mixed; do
timeout 280 python3 benches/torch_alloc_cost.py --sizes $sz --turns 3 --iters 100000 --cpus 4,5 --allocators caching,xlog,xlog+XLOG_TORCH_ALLOCATOR=pluggable,caching_pluggable,xlog+XLOG_CUDA_LIBRARY=$PWD/.gpu/n3.so --out $R/cost-$sz.json > $R/cost-$sz.log 2>&1; echo cost $sz rc=$?
tail -7 $R/cost-$sz.log
el cost $sz
done
