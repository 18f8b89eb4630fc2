set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/f; mkdir -p $R
export PYTHONPATH=$PWD/python
XLOG_CUDA_LIBRARY=$PWD/.gpu/s2.so timeout 330 python3 benches/w7_training.py --out $R/w7 --models gpt2_dyn,mlm_dyn --allocators caching,expandable,xlog --steps 10 --shapes-warm --no-w8 > $R/w7.log 2>&1; echo w7 rc=$?
cat $R/w7/results.md 2>/dev/null | grep -E "^\|" | head -20; rm -f $R/w7/*.json; el w7
XLOG_CUDA_LIBRARY=$PWD/.gpu/s2.so timeout 120 python3 benches/w12_shared_gpu.py --out $R/w12 --budget 16GiB --seconds 12 --timeout 60 > $R/w12.log 2>&1; echo w12 rc=$?
grep -E "^\||Pass|pass|FAIL" $R/w12/results.md 2>/dev/null | head -12; el w12
