set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d6; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/new2.so
for c in 4 4,5; do
timeout 130 python3 benches/w7_turns.py --out /tmp/t6-$c --unit pass --cpus $c --allocators caching,xlog --models mlm_dyn --steps 10 --passes 10 > $R/t6-$c.log 2>&1; echo rc=$?
cp /tmp/t6-$c/results.md $R/t6-$c.md; cp /tmp/t6-$c/results.json $R/t6-$c.json; echo "cpus $c"; grep -E "^\| (gpt2|mlm|resnet)" $R/t6-$c.md | cut -d'|' -f2-8
el "cpus $c"
done
