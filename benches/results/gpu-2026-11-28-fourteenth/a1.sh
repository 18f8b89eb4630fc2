set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/a; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt; cat $R/gpu.txt
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/cur.so
timeout 330 python3 benches/w7_ab.py --out $R/ab1 --cpus 4,5 --models mlm_dyn,gpt2,gpt2_dyn,resnet50 --arms caching,xlog,caching#2 --steps 10 --passes 10 > $R/ab1.log 2>&1; echo ab1 rc=$?
tail -25 $R/ab1.log
el ab1
unset XLOG_CUDA_LIBRARY
OUT=$R XLOG_BENCH_WORKLOADS=W1 timeout 150 bash scripts/bench-gpu > $R/w1.log 2>&1; echo w1 rc=$?
grep -E "W1" $R/bench/results.md 2>/dev/null | head -12; tail -3 $R/w1.log
el w1
export XLOG_CUDA_LIBRARY=$PWD/.gpu/cur.so
timeout 120 python3 benches/w7_ab.py --out $R/ab2 --cpus 4,5 --models mlm_dyn,gpt2 --arms xlog,caching --steps 10 --passes 10 > $R/ab2.log 2>&1; echo ab2 rc=$?
tail -12 $R/ab2.log
el ab2
