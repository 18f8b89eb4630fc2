set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/c; mkdir -p $R; W=/tmp/c; mkdir -p $W
export PYTHONPATH=$PWD/python
# d64 = h1 with the soft cap at 1/64 of the live peak (SLACK_DIV 64): footprint beside expandable segments
XLOG_CUDA_LIBRARY=$PWD/.gpu/d64.so timeout 300 python3 benches/w7_training.py --out $W/w7 --models det_dyn,kv_serve,gpt2,gpt2_dyn,mlm_dyn \
  --allocators xlog,expandable --steps 10 --gen-kv-steps 5 --shapes-warm --no-w8 --time-budget 290 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\| (det|kv|gpt2|mlm)" $R/w7.log | head -12; tail -2 $R/w7.log; cp $W/w7/results.json $R/w7.json; el w7
# step time in turns with the caching allocator, d64
XLOG_CUDA_LIBRARY=$PWD/.gpu/d64.so timeout 250 python3 benches/w7_ab.py --out $W/ab --cpus 4,5 --models gpt2,kv_serve --arms caching,xlog --steps 5 --passes 2 > $R/ab.log 2>&1; echo ab rc=$?
grep -E "^\||ratio|median|pages" $R/ab.log | head -16; tail -3 $R/ab.log; el ab
