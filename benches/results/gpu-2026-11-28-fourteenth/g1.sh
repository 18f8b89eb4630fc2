set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/g; mkdir -p $R
export PYTHONPATH=$PWD/python
W11_LIB=$PWD/.gpu/t2.so W11_ALLOCATORS="xlog" W11_RUNS=3 W11_ARGS="--rounds 31 --turns raw-max" timeout 120 bash benches/w11_run.sh $R/w11t > $R/w11t.log 2>&1; echo w11t rc=$?
grep -E "w11_engine \[" $R/w11t.log; el w11t
W11_LIB=$PWD/.gpu/t2.so W11_ALLOCATORS="xlog" W11_RUNS=2 W11_ARGS="--rounds 31 --fact-log2 13:20 --turns raw-max" timeout 60 bash benches/w11_run.sh $R/w11ts > $R/w11ts.log 2>&1; echo w11ts rc=$?
grep -E "w11_engine \[" $R/w11ts.log; rm -rf $R/w11t/logs $R/w11ts/logs; el w11ts
XLOG_CUDA_LIBRARY=$PWD/.gpu/t2.so timeout 60 python3 benches/w7_ab.py --out $R/ab --cpus 4,5 --models gpt2 --arms xlog,caching --steps 10 --passes 8 > $R/ab.log 2>&1; echo ab rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab/results.md; el ab
