set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R
export PYTHONPATH=$PWD/python
for i in 1 2; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/s1.so timeout 250 python3 benches/w7_ab.py --out $R/ab$i --cpus 4,5 --models gpt2 --arms caching,xlog --steps 10 --passes 8 > $R/ab$i.log 2>&1; echo ab$i rc=$?
  grep -E "^\||ratio|median" $R/ab$i.log | head -20; el ab$i
done
