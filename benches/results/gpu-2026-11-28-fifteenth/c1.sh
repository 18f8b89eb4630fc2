set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/c; mkdir -p $R
export PYTHONPATH=$PWD/python
XLOG_CUDA_LIBRARY=$PWD/.gpu/lb8.so timeout 100 python3 benches/gpu_memory_probe.py --sizes 16,64 --repeats 15 --reps 40 > $R/probe-lb8.log 2>&1; echo probe lb8 rc=$?
grep -E "copy" $R/probe-lb8.log; el probe
for i in 1 2; do for v in h0 lb8; do
  XLOG_CUDA_LIBRARY=$PWD/.gpu/$v.so timeout 100 python3 benches/w7_ab.py --out $R/ab-$v-$i --cpus 4,5 --models gpt2,mlm_dyn --arms caching,xlog --steps 10 --passes 8 > $R/ab-$v-$i.log 2>&1; echo ab $v $i rc=$?
  grep -E "^\| (gpt2|mlm_dyn) \| xlog|inside" $R/ab-$v-$i/results.md; rm -f $R/ab-$v-$i/results.json; el ab $v $i
done; done
