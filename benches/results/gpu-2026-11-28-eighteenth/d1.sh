set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R; W=/tmp/d; mkdir -p $W
export PYTHONPATH=$PWD/python
# one xlog llama_gen run that logs its calls (a trace to replay on sim; not timed); only the trace comes back
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 150 python3 benches/w7_training.py --out $W/tr --models llama_gen \
  --allocators xlog --gen-kv-steps 6 --shapes-warm --no-w8 --trace-dir $W/traces > $W/tr.log 2>&1; echo trace rc=$?
grep -E "^\| llama" $W/tr.log | head -3; gzip -9 -c $W/traces/llama_gen-xlog-r0.csv > $R/llama_gen-xlog.csv.gz; ls -la $R; el trace
# llama_gen step time, both allocators in one process
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 240 python3 benches/w7_ab.py --out $W/ab-llama --cpus 4,5 --models llama_gen --arms caching,xlog --steps 6 --passes 4 > $R/ab-llama.log 2>&1; echo ab llama rc=$?
grep -E "^\|" $R/ab-llama.log | head -6; el ab llama
