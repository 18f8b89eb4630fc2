#!/usr/bin/env bash
# scripts/install-nvcc.sh — a CUDA 13 compiler toolchain from PyPI wheels, for
# machines without a system CUDA toolkit (developers' machines and CI here have
# no GPU and no /usr/local/cuda). It is enough to compile and link .cu files
# (nvcc, cicc, ptxas, the runtime headers, CCCL, static and shared cudart);
# running the result needs a GPU and its driver.
#
# Usage:
#   scripts/install-nvcc.sh              install if needed, check, and print the
#                                        toolkit root as the last stdout line
#   scripts/install-nvcc.sh --env        print eval-able export lines instead
#   scripts/install-nvcc.sh --no-check   skip the smoke compile
#
#   root="$(scripts/install-nvcc.sh | tail -n 1)"
#   cmake -S . -B build -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" \
#         -DCUDAToolkit_ROOT="$root" -DCMAKE_CUDA_ARCHITECTURES=90
#
#   eval "$(scripts/install-nvcc.sh --env)"   # sets CUDACXX, CUDAToolkit_ROOT,
#                                              # PATH; CMake reads the first two
#
# Environment:
#   PYTHON                 interpreter whose pip installs the wheels (python3)
#   XLOG_NVCC_ROOT_FILE    if set, the toolkit root is also written to this file
#   XLOG_NVCC_NO_INSTALL=1 never run pip; only locate and fix up an install
#
# Idempotent: when the wheels are already installed pip is not called at all
# (so no network is needed), and the fix-ups below are only made when missing.
# Progress and errors go to stderr; stdout carries only the result.
#
# What the pip layout needs (found with nvcc 13.5 from these wheels):
#   * everything lands in <site-packages>/nvidia/cu13, with bin/nvcc.profile
#     already adding include/ and include/cccl, so nvcc needs no -I or -ccbin
#     flags (it uses g++ from PATH as the host compiler);
#   * lib/ has libcudart.so.13 but no unversioned libcudart.so, which CMake's
#     FindCUDAToolkit requires to find CUDA::cudart: this script adds the link.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
PACKAGES=(
  "nvidia-cuda-nvcc>=13,<14"
  "nvidia-cuda-runtime>=13,<14"
  "nvidia-cuda-crt>=13,<14"
  "nvidia-nvvm>=13,<14"
  "nvidia-cuda-cccl>=13,<14"
)

mode=root
check=1
for arg in "$@"; do
  case "$arg" in
    --env) mode=env ;;
    --no-check) check=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) echo "install-nvcc: unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

log() { echo "install-nvcc: $*" >&2; }
die() { log "error: $*"; exit 1; }

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON)"

# Are all wheels installed, each at major version 13?
wheels_installed() {
  "$PYTHON" - <<'EOF'
import importlib.metadata as metadata
import sys
names = ["nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-crt",
         "nvidia-nvvm", "nvidia-cuda-cccl"]
for name in names:
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        sys.exit(1)
    if version.split(".")[0] != "13":
        sys.exit(1)
EOF
}

# Prints the cu13 directory that holds bin/nvcc, if any.
find_root() {
  "$PYTHON" - <<'EOF'
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
for base in list(getattr(nvidia, "__path__", [])):
    root = os.path.join(base, "cu13")
    if os.path.isfile(os.path.join(root, "bin", "nvcc")):
        print(os.path.realpath(root))
        break
EOF
}

if ! wheels_installed; then
  if [[ "${XLOG_NVCC_NO_INSTALL:-0}" == 1 ]]; then
    die "CUDA wheels missing and XLOG_NVCC_NO_INSTALL=1"
  fi
  log "installing ${PACKAGES[*]}"
  PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --disable-pip-version-check \
    "${PACKAGES[@]}" >&2 || die "pip install failed"
fi

root="$(find_root)"
[[ -n "$root" ]] || die "no nvidia/cu13/bin/nvcc under the 'nvidia' package of $PYTHON"
log "toolkit root: $root"

# Everything nvcc runs or reads; a missing piece means a wheel is broken or
# from an unexpected layout, better said here than as a cryptic nvcc error.
for needed in bin/nvcc bin/ptxas bin/fatbinary bin/nvlink bin/nvcc.profile nvvm/bin/cicc \
              nvvm/libdevice include/cuda_runtime.h include/crt/host_config.h \
              lib/libcudart_static.a; do
  [[ -e "$root/$needed" ]] || die "$root/$needed is missing"
done

# CCCL (cuda/std, cub, thrust): nvcc.profile adds include/cccl as a system
# include directory. Older wheels put the headers elsewhere; link them in.
if [[ ! -e "$root/include/cccl/cuda/std/version" && ! -e "$root/include/cuda/std/version" ]]; then
  cccl_dir="$("$PYTHON" - <<'EOF'
import os, nvidia
for base in nvidia.__path__:
    for dirpath, dirnames, filenames in os.walk(base):
        if os.path.isfile(os.path.join(dirpath, "cuda", "std", "version")):
            print(dirpath)
            raise SystemExit(0)
EOF
)"
  [[ -n "$cccl_dir" ]] || die "CCCL headers (cuda/std/version) not found; is nvidia-cuda-cccl installed?"
  log "linking CCCL headers: $root/include/cccl -> $cccl_dir"
  ln -sfn "$cccl_dir" "$root/include/cccl" || die "cannot write to $root/include"
fi

# FindCUDAToolkit looks for the unversioned name only.
if [[ ! -e "$root/lib/libcudart.so" ]]; then
  versioned="$(cd "$root/lib" && ls libcudart.so.13* 2>/dev/null | sort | head -n 1)"
  [[ -n "$versioned" ]] || die "$root/lib/libcudart.so.13 is missing"
  log "linking $root/lib/libcudart.so -> $versioned"
  ln -s "$versioned" "$root/lib/libcudart.so" || die "cannot write to $root/lib"
fi

command -v g++ >/dev/null 2>&1 || die "g++ not found: nvcc needs a host C++ compiler on PATH"

if [[ "$check" == 1 ]]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  cat >"$scratch/smoke.cu" <<'EOF'
#include <cuda/std/cstdint>
#include <cuda_runtime.h>
__global__ void smoke(cuda::std::uint32_t* out) { out[threadIdx.x] = threadIdx.x; }
int main() { int count = 0; (void)cudaGetDeviceCount(&count); return 0; }
EOF
  "$root/bin/nvcc" -arch=sm_90 -std=c++17 -o "$scratch/smoke" "$scratch/smoke.cu" >&2 ||
    die "smoke compile with $root/bin/nvcc failed"
  log "smoke compile ok ($("$root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
fi

if [[ -n "${XLOG_NVCC_ROOT_FILE:-}" ]]; then
  printf '%s\n' "$root" >"$XLOG_NVCC_ROOT_FILE"
fi

if [[ "$mode" == env ]]; then
  printf 'export CUDACXX=%q\n' "$root/bin/nvcc"
  printf 'export CUDAToolkit_ROOT=%q\n' "$root"
  printf 'export PATH=%q:"$PATH"\n' "$root/bin"
else
  printf '%s\n' "$root"
fi
