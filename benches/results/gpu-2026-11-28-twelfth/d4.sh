set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d4; mkdir -p $R
export PYTHONPATH=$PWD/python
for m in gpt2; do
  timeout 90 python3 .gpu/loss_check.py caching $m 16 2>&1 | grep -E "^caching" | tee -a $R/loss.txt
  XLOG_CUDA_LIBRARY=$PWD/.gpu/base.so timeout 90 python3 .gpu/loss_check.py xlog $m 16 2>&1 | grep -E "^xlog" | sed 's/^/base /' | tee -a $R/loss.txt
  XLOG_CUDA_LIBRARY=$PWD/.gpu/new2.so timeout 90 python3 .gpu/loss_check.py xlog $m 16 2>&1 | grep -E "^xlog" | sed 's/^/new2 /' | tee -a $R/loss.txt
done
el loss
OUT=$R timeout 200 bash scripts/gpu-frameworks --only train,oom,shared,numba,record_stream,inspect,graphs > $R/fw.log 2>&1; echo fw rc=$?
cat $R/gpu-frameworks/summary.txt 2>/dev/null | tail -25
el fw
export XLOG_CUDA_LIBRARY=$PWD/.gpu/base.so
timeout 250 python3 benches/w7_turns.py --out /tmp/t4 --unit pass --cpus 4,5 --allocators caching,xlog,xlog+XLOG_CUDA_LIBRARY=$PWD/.gpu/new2.so --models gpt2,mlm_dyn,gpt2_dyn,resnet50 --steps 10 --passes 10 > $R/t4.log 2>&1; echo rc=$?
cp /tmp/t4/results.json $R/t4.json; cp /tmp/t4/results.md $R/t4.md; grep -E "^\| (gpt2|mlm|resnet)" $R/t4.md | cut -d'|' -f2-8
el turns
