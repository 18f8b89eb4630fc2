set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R; W=/tmp/e; mkdir -p $W
export PYTHONPATH=$PWD/python
# i1 (soft cap 1/64) on the models calls c and d did not run, beside expandable segments
XLOG_CUDA_LIBRARY=$PWD/.gpu/i1.so timeout 185 python3 benches/w7_training.py --out $W/w7 --models bert_serve,t5_dyn,cnn_dyn,resnet50,llama_gen \
  --allocators xlog,expandable --steps 10 --shapes-warm --no-w8 --time-budget 178 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\| (bert|t5|cnn|resnet|llama)" $R/w7.log | head -12; tail -2 $R/w7.log; cp $W/w7/results.json $R/w7.json; el w7
