set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/b; mkdir -p $R; W=/tmp/b; mkdir -p $W
export PYTHONPATH=$PWD/python
# kv_serve again, xlog first this time (call a's time budget skipped it)
XLOG_CUDA_LIBRARY=$PWD/.gpu/h1.so timeout 300 python3 benches/w7_training.py --out $W/kv --models kv_serve \
  --allocators xlog,expandable,async,caching --gen-kv-steps 5 --shapes-warm --no-w8 --time-budget 290 > $R/kv.log 2>&1; echo kv rc=$?
grep -E "^\| kv" $R/kv.log | head -8; tail -2 $R/kv.log; cp $W/kv/results.json $R/kv.json; el kv
# the default changing-shape models: xlog, expandable segments, caching
XLOG_CUDA_LIBRARY=$PWD/.gpu/h1.so timeout 250 python3 benches/w7_training.py --out $W/dyn --models gpt2_dyn,mlm_dyn,gen_kv \
  --allocators xlog,expandable,caching --steps 10 --shapes-warm --no-w8 --time-budget 240 > $R/dyn.log 2>&1; echo dyn rc=$?
grep -E "^\| (gpt2|mlm|gen)" $R/dyn.log | head -12; tail -2 $R/dyn.log; cp $W/dyn/results.json $R/dyn.json; el dyn
