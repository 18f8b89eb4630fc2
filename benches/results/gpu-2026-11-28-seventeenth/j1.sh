set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
R=$OUT/j; mkdir -p $R
export PYTHONPATH=$PWD/python
# W7 memory (NVML) for gpt2_dyn: caching, expandable segments and xlog (r5), separate processes
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 200 python3 benches/w7_training.py --out $R/w7 --models gpt2_dyn --allocators caching,expandable,xlog --steps 10 --shapes-warm --no-w8 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\|" $R/w7.log | head -12; tail -3 $R/w7.log
