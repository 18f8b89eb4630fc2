set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/b; mkdir -p $R
export PYTHONPATH=$PWD/python
for v in h0 lp1 lp32; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/$v.so timeout 100 python3 benches/gpu_memory_probe.py --sizes 64,1024,4096 --repeats 15 --reps 20 --out $R/probe-$v.json > $R/probe-$v.log 2>&1; echo probe $v rc=$?
  grep -E "copy|gather" $R/probe-$v.log; el $v
done
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True XLOG_CUDA_LIBRARY=$PWD/.gpu/h0.so timeout 100 python3 benches/gpu_memory_probe.py --sizes 64,1024,4096 --repeats 15 --reps 20 --out $R/probe-exp.json > $R/probe-exp.log 2>&1; echo probe exp rc=$?
grep -E "copy|gather|matmul" $R/probe-exp.log; el exp
export XLOG_CUDA_LIBRARY=$PWD/.gpu/h0.so
timeout 80 python3 benches/w7_ab.py --out $R/ab1 --cpus 4,5 --models gpt2 --arms caching,xlog --steps 10 --passes 10 > $R/ab1.log 2>&1; echo ab1 rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab1/results.md; el ab1
timeout 80 python3 benches/w7_ab.py --out $R/ab2 --cpus 4,5 --models gpt2 --arms xlog,caching --steps 10 --passes 10 > $R/ab2.log 2>&1; echo ab2 rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab2/results.md; rm -f $R/ab2/results.json; el ab2
