set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/f; mkdir -p $R; W=/tmp/f; mkdir -p $W
export PYTHONPATH=$PWD/python
# W7 memory, GPT-2 (fixed shape): caching, expandable and xlog r5, then xlog f2; llama_gen under f2
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 150 python3 benches/w7_training.py --out $W/g-r5 --models gpt2 --allocators caching,expandable,xlog \
  --steps 10 --warmup 5 --no-w8 --time-budget 140 > $W/g-r5.log 2>&1; echo w7 gpt2 r5 rc=$?; grep -E "^\| gpt2" $W/g-r5.log; el
XLOG_CUDA_LIBRARY=$PWD/.gpu/f2.so timeout 150 python3 benches/w7_training.py --out $W/g-f2 --models gpt2,llama_gen --allocators xlog \
  --steps 10 --warmup 5 --gen-kv-steps 6 --shapes-warm --no-w8 --time-budget 140 > $W/g-f2.log 2>&1; echo w7 f2 rc=$?; grep -E "^\| (gpt2|llama)" $W/g-f2.log; el
cp $W/g-r5/results.json $R/w7-gpt2-r5.json; cp $W/g-f2/results.json $R/w7-f2.json
# GPT-2 step time with f2, both allocators in one process
XLOG_CUDA_LIBRARY=$PWD/.gpu/f2.so timeout 120 python3 benches/w7_ab.py --out $W/ab --cpus 4,5 --models gpt2 --arms caching,xlog --steps 10 --passes 6 > $R/ab-gpt2.log 2>&1; echo ab rc=$?
grep -E "^\|" $R/ab-gpt2.log | head -5; el ab
# the ctest suite and memcheck over the CUDA tests with f2's unstripped build, as long as the call allows
XLOG_SANITIZER_TOOLS=memcheck timeout 230 scripts/gpu-check .prebuilt > $R/gpu-check.log 2>&1; echo gpu-check rc=$?
grep -E "tests passed|passed,|FAIL|ERROR SUMMARY|clean|summary" $R/gpu-check.log | tail -25; el check
