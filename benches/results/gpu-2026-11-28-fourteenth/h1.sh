set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/h; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/t2b.so
timeout 75 python3 benches/w7_ab.py --out $R/ab1 --cpus 4,5 --models gpt2 --arms caching,xlog --steps 10 --passes 10 > $R/ab1.log 2>&1; echo ab1 rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab1/results.md; el ab1
timeout 75 python3 benches/w7_ab.py --out $R/ab2 --cpus 4,5 --models gpt2 --arms xlog,caching --steps 10 --passes 10 > $R/ab2.log 2>&1; echo ab2 rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab2/results.md; el ab2
