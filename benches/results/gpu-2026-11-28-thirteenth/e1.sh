set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/n5.so
timeout 200 python3 benches/w7_turns.py --out /tmp/te --unit pass --cpus 4,5 --allocators caching,xlog,xlog+XLOG_TORCH_ALLOCATOR=pluggable --models mlm_dyn --steps 10 --passes 14 > $R/turns.log 2>&1; echo turns rc=$?
cp /tmp/te/results.md $R/turns.md; cp /tmp/te/results.json $R/turns.json; grep -E "^\| (gpt2|mlm)" $R/turns.md | cut -d'|' -f2-9
el turns
W11_LIB=$PWD/.gpu/n5.so W11_ALLOCATORS="xlog raw-max raw" W11_RUNS=2 W11_ARGS="--rounds 31" timeout 200 bash benches/w11_run.sh $R/w11 > $R/w11.log 2>&1; echo w11 rc=$?
tail -12 $R/w11/w11_table.md 2>/dev/null || tail -5 $R/w11.log
el w11
W11_LIB=$PWD/.gpu/n5.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=2 W11_ARGS="--rounds 31 --fact-log2 13:20" timeout 120 bash benches/w11_run.sh $R/w11s > $R/w11s.log 2>&1; echo w11s rc=$?
tail -8 $R/w11s/w11_table.md 2>/dev/null || tail -5 $R/w11s.log
el w11s
