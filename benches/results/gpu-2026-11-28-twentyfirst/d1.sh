set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R; W=/tmp/d; mkdir -p $W
export PYTHONPATH=$PWD/python
# i1 = the soft cap at 1/64, as committed: the second run of call c's two closest models
XLOG_CUDA_LIBRARY=$PWD/.gpu/i1.so timeout 240 python3 benches/w7_training.py --out $W/w7 --models kv_serve,det_dyn \
  --allocators xlog,expandable --steps 10 --gen-kv-steps 5 --shapes-warm --no-w8 --time-budget 235 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\| (det|kv)" $R/w7.log | head -12; tail -2 $R/w7.log; cp $W/w7/results.json $R/w7.json; el w7
XLOG_CUDA_LIBRARY=$PWD/.gpu/i1.so timeout 100 python3 benches/w7_ab.py --out $W/ab --cpus 4,5 --models det_dyn,gpt2_dyn --arms caching,xlog --steps 5 --passes 2 > $R/ab.log 2>&1; echo ab rc=$?
grep -E "^\||ratio|median|pages" $R/ab.log | head -16; tail -3 $R/ab.log; el ab
