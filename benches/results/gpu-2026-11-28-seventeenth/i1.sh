set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/i; mkdir -p $R
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# W1 with r5 (unstripped, .prebuilt), twice
for i in 1 2; do
  OUT=$R/w1-$i XLOG_BENCH_WORKLOADS=W1 timeout 120 bash scripts/bench-gpu > $R/w1-$i.log 2>&1; echo w1 $i rc=$?
  grep -iE "W1 .*(raw|cudaMalloc)" $R/w1-$i/bench/results.md 2>/dev/null | head -8; rm -rf $R/w1-$i; el w1 $i
done
# GPT-2 step time, both allocators in one process, with r5
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 150 python3 benches/w7_ab.py --out $R/ab-gpt2 --cpus 4,5 --models gpt2 --arms caching,xlog --steps 10 --passes 8 > $R/ab-gpt2.log 2>&1; echo ab rc=$?
grep -E "^\||ratio|median" $R/ab-gpt2.log | head -8; el ab
