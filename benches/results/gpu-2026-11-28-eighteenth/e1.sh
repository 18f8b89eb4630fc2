set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R; W=/tmp/e; mkdir -p $W
export PYTHONPATH=$PWD/python
# llama_gen memory: expandable segments, xlog before (r5) and after (f1) the fix, separate processes, two repeats
for v in r5 f1; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/$v.so timeout 240 python3 benches/w7_training.py --out $W/w7-$v --models llama_gen \
    --allocators $( [ $v = r5 ] && echo expandable,xlog || echo xlog ) --gen-kv-steps 6 --shapes-warm --no-w8 --repeat 2 --time-budget 220 > $W/w7-$v.log 2>&1; echo w7 $v rc=$?
  grep -E "^\| llama" $W/w7-$v.log | head -4; cp $W/w7-$v/results.json $R/w7-$v.json; el w7 $v
done
# traces of cnn_dyn and t5_dyn under xlog (f1), to replay on sim (not timed)
XLOG_CUDA_LIBRARY=$PWD/.gpu/f1.so timeout 200 python3 benches/w7_training.py --out $W/tr --models cnn_dyn,t5_dyn \
  --allocators xlog --steps 10 --shapes-warm --no-w8 --trace-dir $W/traces > $W/tr.log 2>&1; echo trace rc=$?
grep -E "^\| (cnn|t5)" $W/tr.log | head -3
for f in $W/traces/*.csv; do gzip -9 -c $f > $R/$(basename $f).gz; done; ls -la $R; el traces
