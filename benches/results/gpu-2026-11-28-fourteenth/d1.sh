set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d; mkdir -p $R
export PYTHONPATH=$PWD/python
XLOG_CUDA_LIBRARY=$PWD/.gpu/t2.so timeout 130 python3 benches/w7_ab.py --out $R/ab1 --cpus 4,5 --models mlm_dyn,gpt2,gpt2_dyn,resnet50 --arms caching,xlog --steps 10 --passes 8 > $R/ab1.log 2>&1; echo ab1 rc=$?
grep -E "^\| |inside" $R/ab1/results.md | grep -v "\-\-\-"; el ab1
XLOG_CUDA_LIBRARY=$PWD/.gpu/t2.so timeout 60 python3 benches/w7_ab.py --out $R/ab2 --cpus 4,5 --models mlm_dyn --arms xlog,caching --steps 10 --passes 8 > $R/ab2.log 2>&1; echo ab2 rc=$?
grep -E "^\| (mlm)|inside" $R/ab2/results.md; el ab2
XLOG_CUDA_LIBRARY=$PWD/.gpu/t2.so timeout 220 python3 benches/w7_training.py --out $R/w7 --models gpt2_dyn,mlm_dyn,gen_kv --allocators caching,expandable,xlog --steps 10 --shapes-warm --no-w8 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\|" $R/w7/results.md 2>/dev/null | head -30; el w7
W11_LIB=$PWD/.gpu/t2.so W11_ALLOCATORS="xlog raw-max raw" W11_RUNS=1 W11_ARGS="--rounds 31" timeout 140 bash benches/w11_run.sh $R/w11 > $R/w11.log 2>&1; echo w11 rc=$?
tail -25 $R/w11.log; el w11
