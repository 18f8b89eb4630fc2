set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/c; mkdir -p $R
export PYTHONPATH=$PWD/python
for lib in t1 cur t1; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/$lib.so timeout 200 python3 benches/w7_ab.py --out $R/ab-$lib --cpus 4,5 --models mlm_dyn,gpt2,gpt2_dyn --arms caching,xlog --steps 10 --passes 8 > $R/ab-$lib.log 2>&1; echo ab $lib rc=$?
  grep -E "^\| (gpt2|mlm)|inside" $R/ab-$lib/results.md; cp -r $R/ab-$lib $R/ab-$lib-$(date +%s)
  el ab $lib
done
