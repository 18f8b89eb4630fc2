set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R
# The churn test against this stop's library (unstripped, .prebuilt) and the last stop's (s2)
for v in new old; do
  if [[ $v == new ]]; then lib=$PWD/.prebuilt/libxlog_cuda.so; else mkdir -p /tmp/oldlib && cp .gpu/s2.so /tmp/oldlib/libxlog_cuda.so; lib=/tmp/oldlib/libxlog_cuda.so; fi
  cmake -S . -B /tmp/b-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXLOG_PREBUILT_LIB=$lib > $R/$v-configure.log 2>&1; echo $v configure rc=$?
  ninja -C /tmp/b-$v cuda_stream_churn_test > $R/$v-build.log 2>&1; echo $v build rc=$?
  exe=$(find /tmp/b-$v -name cuda_stream_churn_test -type f | head -1)
  (cd $(dirname $exe) && timeout 60 ./cuda_stream_churn_test > $R/$v-plain.log 2>&1; echo $v plain rc=$?; tail -4 $R/$v-plain.log)
  for tool in memcheck racecheck synccheck; do
    args=(--tool $tool --error-exitcode 1); [[ $tool == memcheck ]] && args+=(--leak-check full)
    (cd $(dirname $exe) && XLOG_UNDER_SANITIZER=1 timeout 120 compute-sanitizer "${args[@]}" ./cuda_stream_churn_test > $R/$v-$tool.log 2>&1; echo $v $tool rc=$?)
    grep -E "Program hit|SUMMARY|passed|FAIL|NOTE" $R/$v-$tool.log | sort | uniq -c | head -8
  done
  el $v
done
