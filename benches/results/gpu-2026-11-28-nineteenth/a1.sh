set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/a; mkdir -p $R; W=/tmp/a; mkdir -p $W
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# two models not measured before, every allocator, separate processes
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 300 python3 benches/w7_training.py --out $W/w7 --models det_dyn,bert_serve \
  --allocators caching,async,expandable,xlog --steps 10 --shapes-warm --no-w8 --time-budget 280 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\|" $R/w7.log | head -30; tail -3 $R/w7.log; cp $W/w7/results.json $R/w7.json; el w7
# traces under xlog, to replay on sim (not timed)
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 150 python3 benches/w7_training.py --out $W/tr --models det_dyn,bert_serve \
  --allocators xlog --steps 10 --shapes-warm --no-w8 --trace-dir $W/traces > $W/tr.log 2>&1; echo trace rc=$?
grep -E "^\| (det|bert)" $W/tr.log | head -3; tail -3 $W/tr.log
for f in $W/traces/*.csv; do gzip -9 -c $f > $R/$(basename $f).gz; done; ls -la $R; el traces
# step time, both allocators in one process
XLOG_CUDA_LIBRARY=$PWD/.gpu/g1.so timeout 130 python3 benches/w7_ab.py --out $W/ab --cpus 4,5 --models det_dyn,bert_serve --arms caching,xlog --steps 10 --passes 4 > $R/ab.log 2>&1; echo ab rc=$?
grep -E "^\||ratio|median" $R/ab.log | head -16; tail -3 $R/ab.log; el ab
