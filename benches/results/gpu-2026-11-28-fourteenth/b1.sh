set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/b; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/cur.so
for v in arena pool arena; do
  XLOG_MEMORY=$v timeout 150 python3 benches/w7_ab.py --out $R/ab-$v --cpus 4,5 --models mlm_dyn,gpt2 --arms caching,xlog --steps 10 --passes 8 > $R/ab-$v.log 2>&1; echo ab $v rc=$?
  grep -E "^\| (gpt2|mlm)|inside" $R/ab-$v/results.md
  el ab $v
done
