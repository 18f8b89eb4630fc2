set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/res10g
XLOG_CUDA_LIBRARY=$PWD/.gpu/p2.so PYTHONPATH=$PWD/python timeout 100 python3 benches/w12_shared_gpu.py --out /tmp/w12 --budget 16GiB --seconds 12 --timeout 60 > /tmp/res10g/w12.log 2>&1; echo rc=$?
cp /tmp/w12/results.md /tmp/res10g/w12-results.md; cp /tmp/w12/*.json /tmp/res10g/ 2>/dev/null; grep -E '^\||PASS|FAIL' /tmp/w12/results.md | head -20
tar czf $OUT/res10g.tgz -C /tmp res10g
