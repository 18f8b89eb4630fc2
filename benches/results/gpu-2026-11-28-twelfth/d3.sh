export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export XLOG_CUDA_LIBRARY=$PWD/.gpu/new.so PYTHONPATH=$PWD/python
for a in caching xlog; do taskset -c 4,5 timeout 100 python3 .gpu/prof_kern.py $a mlm_dyn 2>&1 | grep -E "^ +[0-9]+ cuda|kernels"; done
