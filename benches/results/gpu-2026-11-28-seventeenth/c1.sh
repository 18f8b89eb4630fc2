set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/c; mkdir -p $R
OUT=$R timeout 430 bash scripts/gpu-check .prebuilt > $R/gpu-check.log 2>&1; echo gpu-check rc=$?
cat $R/gpu-check/summary.txt 2>/dev/null | tail -45
grep -B2 -A12 "stream_churn" $R/gpu-check/sanitizer.log | grep -E "NOTE|passed|FAIL|SUMMARY" | head -10
rm -f $R/gpu-check/sanitizer.log $R/gpu-check/build.log $R/gpu-check/configure.log
el gpu-check
# The churn test against the last stop's library (s2), plain and under memcheck
mkdir -p /tmp/oldlib && cp .gpu/s2.so /tmp/oldlib/libxlog_cuda.so
cmake -S . -B /tmp/old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXLOG_PREBUILT_LIB=/tmp/oldlib/libxlog_cuda.so > $R/old-configure.log 2>&1; echo configure rc=$?
ninja -C /tmp/old cuda_stream_churn_test > $R/old-build.log 2>&1; echo build rc=$?
exe=$(find /tmp/old -name cuda_stream_churn_test -type f | head -1); echo exe=$exe
(cd $(dirname $exe) && timeout 60 ./cuda_stream_churn_test 2>&1 | tail -8; echo plain rc=${PIPESTATUS[0]})
(cd $(dirname $exe) && XLOG_UNDER_SANITIZER=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./cuda_stream_churn_test > $R/old-memcheck.log 2>&1; echo memcheck rc=$?)
grep -E "Program hit|ERROR SUMMARY|passed" $R/old-memcheck.log | sort | uniq -c | head -10
el done
