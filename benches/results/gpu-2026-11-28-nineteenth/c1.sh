set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/c; mkdir -p $R
# every ctest on the GPU with the head library, memcheck on the CUDA tests
XLOG_SANITIZER_TOOLS=memcheck timeout 290 scripts/gpu-check .prebuilt > $R/gpu-check.log 2>&1; echo gpu-check rc=$?
grep -E "tests passed|passed,|FAIL|ERROR SUMMARY|clean|summary|Not Run|Skipped" $R/gpu-check.log | tail -25; el check
