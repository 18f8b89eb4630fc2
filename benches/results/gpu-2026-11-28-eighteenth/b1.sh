set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/b; mkdir -p $R
export PYTHONPATH=$PWD/python
# cnn_dyn step time, both allocators in one process, twice
for k in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 150 python3 benches/w7_ab.py --out $R/ab-cnn-$k --cpus 4,5 --models cnn_dyn --arms caching,xlog --steps 10 --passes 6 > $R/ab-cnn-$k.log 2>&1; echo ab cnn $k rc=$?
  grep -E "^\||ratio|median" $R/ab-cnn-$k.log | head -10; el ab cnn $k
done
# t5_dyn and llama_gen under every allocator, separate processes
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 330 python3 benches/w7_training.py --out $R/w7 --models t5_dyn,llama_gen \
  --allocators caching,async,expandable,xlog --steps 10 --gen-kv-steps 6 --shapes-warm --no-w8 --time-budget 300 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\|" $R/w7.log | head -24; tail -2 $R/w7.log; el w7
rm -rf $R/w7/runs
