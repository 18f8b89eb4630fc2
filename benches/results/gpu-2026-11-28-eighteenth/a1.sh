set -u
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
R=$OUT/a; mkdir -p $R
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers, torchvision; print(torch.__version__, transformers.__version__, torchvision.__version__)"
# W7 on models not measured before (cnn_dyn, t5_dyn): every allocator, separate processes, shapes warm
XLOG_CUDA_LIBRARY=$PWD/.gpu/r5.so timeout 560 python3 benches/w7_training.py --out $R/w7 --models cnn_dyn,t5_dyn \
  --allocators caching,async,expandable,xlog --steps 10 --shapes-warm --no-w8 --time-budget 520 > $R/w7.log 2>&1; echo w7 rc=$?
grep -E "^\|" $R/w7.log | head -20; tail -3 $R/w7.log
rm -rf $R/w7/runs/*/stdout 2>/dev/null; du -sh $R
