set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R; W=/tmp/d; mkdir -p $W
export PYTHONPATH=$PWD/python
run() { # name, env...
  local name=$1; shift
  env "$@" XLOG_CUDA_LIBRARY=$PWD/.gpu/dbg.so timeout 110 python3 benches/w7_training.py --out $W/$name --models kv_serve \
    --allocators xlog --gen-kv-steps 5 --shapes-warm --no-w8 --timeout 100 > $W/$name.log 2>&1; echo "$name rc=$?"
  grep -E "^\| kv_serve" $W/$name.log | cut -c1-200; el $name
}
run static XLOG_DEBUG_VM=static
XLOG_CUDA_LIBRARY=$PWD/.gpu/dbg.so timeout 100 python3 benches/results/gpu-2026-11-28-twentieth/kvrepro.py > $R/repro-nolog.txt 2>&1; echo repro rc=$?; grep -v "^plan" $R/repro-nolog.txt | tail -4; el repro
run logged XLOG_LOG_PATH=$W/logged.csv
