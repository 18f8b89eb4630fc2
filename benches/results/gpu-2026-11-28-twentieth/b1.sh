set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/b; mkdir -p $R; W=/tmp/b; mkdir -p $W
export PYTHONPATH=$PWD/python
# kv_serve under xlog: which mechanism the illegal address comes from
run() { # name, allocator, env...
  local name=$1 alloc=$2; shift 2
  env "$@" XLOG_CUDA_LIBRARY=$PWD/.gpu/dbg.so timeout 170 python3 benches/w7_training.py --out $W/$name --models kv_serve \
    --allocators $alloc --gen-kv-steps 5 --shapes-warm --no-w8 > $W/$name.log 2>&1; echo "$name rc=$?"
  grep -E "^\| kv_serve" $W/$name.log | cut -c1-250
  cat $W/$name/runs/*.log 2>/dev/null | grep -v "^\s*$" | grep -E -A70 "XLOG_DEBUG_VM|Error|error" | head -150 > $R/$name.txt
  el $name
}
run check xlog XLOG_DEBUG_VM=check
run sync xlog XLOG_DEBUG_VM=sync
run nolend xlog XLOG_DEBUG_VM=nolend
run pool xlog_pool XLOG_DEBUG_VM=
run blocking xlog CUDA_LAUNCH_BLOCKING=1
ls -la $R
