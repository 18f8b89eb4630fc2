set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/g; mkdir -p $R
for lib in n3 n6 n3 n6 n3 n6; do
W11_LIB=$PWD/.gpu/$lib.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=1 W11_ARGS="--rounds 31" timeout 100 bash benches/w11_run.sh $R/w11-$lib > $R/w11-$lib.log 2>&1; echo w11 $lib rc=$?
grep -E "^\| (xlog|raw)" $R/w11-$lib/w11_table.md | cut -d'|' -f2-8
cp $R/w11-$lib/w11.jsonl $R/w11-$lib-$(date +%s).jsonl
el $lib
done
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/n6.so
timeout 200 python3 benches/torch_alloc_cost.py --sizes mixed --turns 3 --iters 100000 --cpus 4,5 --allocators caching,xlog,xlog+XLOG_CUDA_LIBRARY=$PWD/.gpu/n4.so --out $R/cost-mixed.json > $R/cost-mixed.log 2>&1; echo cost rc=$?
tail -5 $R/cost-mixed.log
el cost
