set -u
R=$OUT/b; mkdir -p $R
OUT=$R timeout 540 bash scripts/gpu-check .prebuilt > $R/gpu-check.log 2>&1; echo gpu-check rc=$?
cat $R/gpu-check/summary.txt 2>/dev/null | tail -40
rm -f $R/gpu-check/sanitizer.log $R/gpu-check/build.log $R/gpu-check/configure.log
