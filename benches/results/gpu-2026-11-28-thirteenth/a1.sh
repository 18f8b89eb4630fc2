set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
R=$OUT/a; mkdir -p $R
export PYTHONPATH=$PWD/python XLOG_CUDA_LIBRARY=$PWD/.gpu/n3.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 - > $R/enable.log 2>&1 <<'PY'
import json, xlog_cuda.torch as xt
xt.enable(backend="cuda")
import torch
x = torch.randn(1000, 1000, device="cuda"); y = x @ x
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    z = y * 2
z.record_stream(torch.cuda.current_stream())
w = torch.empty(0, device="cuda")
r = torch.cuda.caching_allocator_alloc(1 << 20)
torch.cuda.caching_allocator_delete(r)
del x, y, z
torch.cuda.synchronize()
info = xt.enable_info(); print(json.dumps(info, indent=1))
print("live_blocks", xt.live_blocks(0) if hasattr(xt, "live_blocks") else None, "stats live", xt.stats(0).live_bytes)
print("allocator name", torch.cuda.memory.get_allocator_backend())
PY
echo enable rc=$?; cat $R/enable.log | head -40
el enable
timeout 240 python3 benches/torch_alloc_cost.py --turns 3 --cpus 4,5 --out $R/cost.json > $R/cost.log 2>&1; echo cost rc=$?
tail -8 $R/cost.log
el cost
OUT=$R timeout 200 bash scripts/gpu-frameworks > $R/fw.log 2>&1; echo fw rc=$?
grep -ciE "pass" $R/fw.log; grep -iE "fail|error" $R/fw.log | head -10 | cut -c1-250
el fw
