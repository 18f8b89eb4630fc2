set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/h; mkdir -p $R
# The sanitizer runs call f's time limit cut, with the stop's library (unstripped, .prebuilt)
cmake -S . -B /tmp/bh -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXLOG_PREBUILT_LIB=$PWD/.prebuilt/libxlog_cuda.so > $R/configure.log 2>&1; echo configure rc=$?
tests="cuda_stream_churn_test cuda_ordering_test cuda_pipeline_test cuda_stale_handle_test cuda_free_while_reading_test cuda_host_callback_test cuda_mr_test cuda_shmem_allocator_test"
ninja -C /tmp/bh $tests > $R/build.log 2>&1; echo build rc=$?; el build
for t in $tests; do
  exe=$(find /tmp/bh -name $t -type f | head -1)
  for tool in memcheck racecheck synccheck; do
    [[ $t == cuda_free_while_reading_test && $tool == memcheck ]] && continue
    args=(--tool $tool --error-exitcode 1 --require-cuda-init no); [[ $tool == memcheck ]] && args+=(--leak-check full)
    (cd $(dirname $exe) && XLOG_UNDER_SANITIZER=1 XLOG_SANITIZER_TOOL=$tool timeout 120 compute-sanitizer "${args[@]}" ./$t > $R/run.log 2>&1; rc=$?
     echo "$t $tool rc=$rc | $(grep -E '(ERROR|RACECHECK) SUMMARY' $R/run.log | tail -1 | sed -E 's/^=+ *//') | $(grep -E '^[0-9]+ passed, [0-9]+ failed$' $R/run.log | tail -1)") | tee -a $R/summary.txt
  done
done
el done
