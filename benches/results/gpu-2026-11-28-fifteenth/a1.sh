set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/a; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt; cat $R/gpu.txt
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/h0.so
timeout 150 python3 benches/gpu_memory_probe.py --sizes 128,1024,4096 --repeats 15 --out $R/probe.json > $R/probe.log 2>&1; echo probe rc=$?
tail -12 $R/probe.log; el probe
timeout 80 python3 benches/w7_ab.py --out $R/ab1 --cpus 4,5 --models gpt2 --arms caching,xlog --steps 10 --passes 10 > $R/ab1.log 2>&1; echo ab1 rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab1/results.md; el ab1
timeout 80 python3 benches/w7_ab.py --out $R/ab2 --cpus 4,5 --models gpt2 --arms xlog,caching --steps 10 --passes 10 > $R/ab2.log 2>&1; echo ab2 rc=$?
grep -E "^\| (gpt2|mlm)|inside" $R/ab2/results.md; el ab2
W11_LIB=$PWD/.gpu/h0.so W11_ALLOCATORS="xlog" W11_RUNS=3 W11_ARGS="--rounds 31 --fact-log2 13:20 --turns raw-max" timeout 100 bash benches/w11_run.sh $R/w11ts > $R/w11ts.log 2>&1; echo w11ts rc=$?
grep -E "w11_engine \[" $R/w11ts.log; rm -rf $R/w11ts/logs; el w11ts
