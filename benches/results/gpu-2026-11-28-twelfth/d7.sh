set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
R=$OUT/d7; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/new2.so
timeout 280 python3 benches/w7_turns.py --out /tmp/t7 --unit pass --cpus 4,5 --allocators caching,caching_pluggable,xlog --models mlm_dyn --steps 10 --passes 10 > $R/t7.log 2>&1; echo rc=$?
cp /tmp/t7/results.md $R/t7.md; cp /tmp/t7/results.json $R/t7.json; grep -E "^\| (gpt2|mlm|resnet)" $R/t7.md | cut -d'|' -f2-8
tail -5 /tmp/t7/*caching_pluggable*.log 2>/dev/null; cp /tmp/t7/*.log $R/ 2>/dev/null
