set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/g; mkdir -p $R; W=/tmp/g; mkdir -p $W
export PYTHONPATH=$PWD/python
# llama_gen step time with the stop's library (f1), both allocators in one process, twice
for k in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/f1.so timeout 150 python3 benches/w7_ab.py --out $W/ab-$k --cpus 4,5 --models llama_gen --arms caching,xlog --steps 6 --passes 8 > $R/ab-llama-$k.log 2>&1; echo ab $k rc=$?
  grep -E "^\|" $R/ab-llama-$k.log | head -5; el ab $k
done
