set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/c; mkdir -p $R
export PYTHONPATH=$PWD/python
# t5_dyn step time, both allocators in one process, twice
for k in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 150 python3 benches/w7_ab.py --out $R/ab-t5-$k --cpus 4,5 --models t5_dyn --arms caching,xlog --steps 10 --passes 6 > $R/ab-t5-$k.log 2>&1; echo ab t5 $k rc=$?
  grep -E "^\|" $R/ab-t5-$k.log | head -6; el ab t5 $k
done
# llama_gen memory again: caching, expandable, xlog, separate processes, two repeats
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 300 python3 benches/w7_training.py --out $R/w7 --models llama_gen \
  --allocators caching,expandable,xlog --gen-kv-steps 6 --shapes-warm --no-w8 --repeat 2 --time-budget 280 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\|" $R/w7.log | head -8; el w7
rm -rf $R/w7/runs
# one xlog llama_gen run that logs its calls (a trace to replay on sim; not timed)
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 150 python3 benches/w7_training.py --out $R/tr --models llama_gen \
  --allocators xlog --gen-kv-steps 6 --shapes-warm --no-w8 --trace-dir $R/traces > $R/tr.log 2>&1; echo trace rc=$?
grep -E "^\| llama" $R/tr.log | head -3; ls -la $R/traces; gzip -9 $R/traces/*.csv; rm -rf $R/tr/runs; el trace
