set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/f; mkdir -p $R
export PYTHONPATH=$PWD/python
XLOG_CUDA_LIBRARY=$PWD/.gpu/t2.so timeout 110 python3 benches/w7_ab.py --out $R/ab --cpus 4,5 --models gpt2,mlm_dyn,gpt2_dyn --arms caching,xlog --steps 10 --passes 8 > $R/ab.log 2>&1; echo ab rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab/results.md; el ab
OUT=$R XLOG_BENCH_WORKLOADS=W1 timeout 120 bash scripts/bench-gpu > $R/w1.log 2>&1; echo w1 rc=$?
grep -E "W1 .*in turns" $R/bench/results.md 2>/dev/null | head -4; cp $R/bench/results.md $R/w1-results.md 2>/dev/null; rm -rf $R/bench; el w1
W11_LIB=$PWD/.gpu/t2.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=2 W11_ARGS="--rounds 31 --fact-log2 13:20" timeout 100 bash benches/w11_run.sh $R/w11s > $R/w11s.log 2>&1; echo w11s rc=$?
grep -E "w11_engine \[|^\| (xlog|raw)" $R/w11s.log; cp $R/w11s/w11_table.md $R/w11s-table.md 2>/dev/null; rm -rf $R/w11s/logs; el w11s
