set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d5; mkdir -p $R
export PYTHONPATH=$PWD/python
OUT=$R timeout 100 bash scripts/gpu-frameworks --only shared > $R/fw.log 2>&1; echo fw rc=$?
grep -E "^shared" $R/fw.log | cut -c1-200
el fw
export XLOG_CUDA_LIBRARY=$PWD/.gpu/new2.so
timeout 230 python3 benches/w7_training.py --out /tmp/w5 --models gpt2,gpt2_dyn,mlm_dyn --allocators caching,expandable,xlog --steps 10 --shapes-warm --no-w8 > $R/w7.log 2>&1; echo rc=$?
cp /tmp/w5/results.md $R/w7.md; cp /tmp/w5/results.json $R/w7.json 2>/dev/null; grep -E "^\| (gpt2|mlm)" $R/w7.md | cut -d'|' -f2-12
el w7
export XLOG_CUDA_LIBRARY=$PWD/.gpu/base.so
timeout 200 python3 benches/w7_turns.py --out /tmp/t5 --unit pass --cpus 4,5 --allocators caching,xlog,xlog+XLOG_CUDA_LIBRARY=$PWD/.gpu/new2.so --models gpt2,mlm_dyn --steps 10 --passes 12 > $R/t5.log 2>&1; echo rc=$?
cp /tmp/t5/results.json $R/t5.json; cp /tmp/t5/results.md $R/t5.md; grep -E "^\| (gpt2|mlm|resnet)" $R/t5.md | cut -d'|' -f2-8
el turns
