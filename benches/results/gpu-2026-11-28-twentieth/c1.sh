set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/c; mkdir -p $R; W=/tmp/c; mkdir -p $W
export PYTHONPATH=$PWD/python
P=benches/results/gpu-2026-11-28-twentieth/kvrepro.py
REPRO_LOG=$W/plain.csv XLOG_CUDA_LIBRARY=$PWD/.gpu/dbg.so timeout 120 python3 $P > $R/plain.txt 2>&1; echo plain rc=$?; grep -v "^plan" $R/plain.txt | tail -12; el plain
tail -400 $W/plain.csv | gzip -9 > $R/plain-tail.csv.gz
XLOG_DEBUG_VM=pad XLOG_CUDA_LIBRARY=$PWD/.gpu/dbg.so timeout 120 python3 $P > $R/pad.txt 2>&1; echo pad rc=$?; grep -v "^plan" $R/pad.txt | tail -8; el pad
REPRO_STEPS=2 XLOG_CUDA_LIBRARY=$PWD/.gpu/dbg.so timeout 330 compute-sanitizer --tool memcheck --print-limit 3 --leak-check no --show-backtrace device python3 $P > $R/memcheck.txt 2>&1; echo memcheck rc=$?; grep -v "^plan" $R/memcheck.txt | head -60; el memcheck
