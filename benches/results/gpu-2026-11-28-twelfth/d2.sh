set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/d2; mkdir -p $R
export XLOG_CUDA_LIBRARY=$PWD/.gpu/new.so PYTHONPATH=$PWD/python
for a in caching xlog; do taskset -c 4,5 timeout 100 python3 .gpu/prof_kern.py $a mlm_dyn 2>&1 | grep -v Warning | tail -22 | tee -a $R/prof.txt; done
XLOG_MEMORY=pool taskset -c 4,5 timeout 100 python3 .gpu/prof_kern.py xlog mlm_dyn 2>&1 | tail -22 | sed 's/^xlog/xlog-pool/' | tee -a $R/prof.txt
el prof
timeout 240 python3 benches/w7_turns.py --out /tmp/t2 --unit pass --cpus 4,5 --allocators caching,xlog,xlog+XLOG_MEMORY=pool --models mlm_dyn,gpt2 --steps 10 --passes 10 > $R/t2.log 2>&1; echo rc=$?
cp /tmp/t2/results.json $R/t2.json; cp /tmp/t2/results.md $R/t2.md; grep -E "^\| (gpt2|mlm|resnet)" $R/t2.md | cut -d'|' -f2-9
el turns
