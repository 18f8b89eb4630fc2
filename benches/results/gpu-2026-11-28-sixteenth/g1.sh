set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/g; mkdir -p $R
export PYTHONPATH=$PWD/python
for i in 1 2; do for v in h1 s2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/$v.so timeout 120 python3 benches/w7_ab.py --out $R/ab-$v-$i --cpus 4,5 --models mlm_dyn --arms caching,xlog --steps 10 --passes 8 > $R/ab-$v-$i.log 2>&1; echo ab $v $i rc=$?
  grep -E "^\| mlm" $R/ab-$v-$i/results.md; rm -f $R/ab-$v-$i/results.json; el ab $v $i
done; done
