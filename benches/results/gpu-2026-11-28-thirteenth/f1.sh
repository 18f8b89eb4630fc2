set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/f; mkdir -p $R
for lib in n3 n5 n3 n5; do
W11_LIB=$PWD/.gpu/$lib.so W11_ALLOCATORS="xlog raw-max" W11_RUNS=1 W11_ARGS="--rounds 31" timeout 100 bash benches/w11_run.sh $R/w11-$lib > $R/w11-$lib.log 2>&1; echo w11 $lib rc=$?
grep -E "^\| (xlog|raw)" $R/w11-$lib/w11_table.md | cut -d'|' -f2-8
cp $R/w11-$lib/w11.jsonl $R/w11-$lib-$(date +%s).jsonl
el $lib
done
