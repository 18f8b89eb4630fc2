set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/e; mkdir -p $R
export PYTHONPATH=$PWD/python
XLOG_CUDA_LIBRARY=$PWD/.gpu/t2.so timeout 250 python3 benches/w7_training.py --out $R/w7 --models gpt2_dyn,mlm_dyn --allocators caching,expandable,xlog --steps 10 --shapes-warm --no-w8 > $R/w7.log 2>&1; echo w7 rc=$?
cp $R/w7/results.md $R/w7-results.md 2>/dev/null; grep -E "^\|" $R/w7/results.md 2>/dev/null | head -30; el w7
XLOG_CUDA_LIBRARY=$PWD/.gpu/t2.so timeout 75 python3 benches/w7_ab.py --out $R/ab --cpus 4,5 --models gpt2,mlm_dyn --arms caching,xlog --steps 10 --passes 8 > $R/ab.log 2>&1; echo ab rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab/results.md; el ab
W11_LIB=$PWD/.gpu/t2.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=2 W11_ARGS="--rounds 31" timeout 100 bash benches/w11_run.sh $R/w11 > $R/w11.log 2>&1; echo w11 rc=$?
grep -E "w11_engine \[|^\| (xlog|raw)" $R/w11.log; cp $R/w11/w11_table.md $R/w11-table.md 2>/dev/null; el w11
