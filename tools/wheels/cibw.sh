#!/usr/bin/env bash
# cibuildwheel steps for one flavour of .github/workflows/wheels.yml, run inside the manylinux_2_28
# container (see [tool.cibuildwheel] in pyproject.toml). The flavour is EDSC_EXT_CUDA_VERSION: the CUDA
# toolkit the kernels are compiled with (13.0 -> the cu130 wheel, 12.8 -> cu128), or 'cpu' (CPU kernels
# only, label cpu).
#   cibw.sh install-cuda            before-all: the CUDA toolkit (nvcc, cudart, CCCL); nothing for cpu
#   cibw.sh install-torch build     before-build: torch==EDSC_EXT_TORCH_VERSION (the oldest torch >= the
#                                   stable-ABI floor of this flavour) plus setuptools, wheel and ninja
#   cibw.sh install-torch [newest]  before-test: the newest torch of the flavour's PyTorch index (or
#                                   torch==EDSC_EXT_TEST_TORCH_VERSION when set)
#   cibw.sh install-torch oldest    the cp310 test's second round: torch==EDSC_EXT_TORCH_VERSION again
#   cibw.sh arch-list               the TORCH_CUDA_ARCH_LIST for that CUDA version (empty for cpu)
#   cibw.sh host-compiler [gcc|g++] the host C/C++ compiler nvcc of that version accepts
#   cibw.sh force-cuda | cpu-only   EDSC_EXT_FORCE_CUDA / EDSC_EXT_CPU_ONLY for the build: 1 or 0
# The torch index is https://download.pytorch.org/whl/<tag>, tag cu130, cu128 or cpu. The binary uses
# torch only through its stable ABI, so one wheel per flavour runs with every torch of that flavour
# from the floor on, and the tests install a torch other than the build's on purpose.
set -euo pipefail

cuda="${EDSC_EXT_CUDA_VERSION:?set EDSC_EXT_CUDA_VERSION: 13.0, 12.8 (the CUDA toolkit) or cpu}"
if [ "$cuda" = cpu ]; then
  cuda=""
  tag="cpu"
else
  tag="cu${cuda//./}"
fi
index_url="https://download.pytorch.org/whl/$tag"

arch_list() {
  # Real SASS for every architecture from Turing that this CUDA supports, PTX for the newest.
  # Keep in step with edsc_ext/_build_support.py:wheel_arch_list (tests/test_build.py checks).
  case "$cuda" in
    "") echo "" ;;
    12.[0-7]) echo "7.5;8.0;8.6;8.9;9.0+PTX" ;;
    12.*) echo "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX" ;;
    13.*) echo "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX" ;;
    *) echo "cibw.sh: no architecture list for CUDA $cuda" >&2; exit 1 ;;
  esac
}

# nvcc rejects host compilers newer than it knows: CUDA 12.6 takes GCC <= 13, the image's default
# is gcc-toolset-14. Later CUDA versions take it.
gcc_toolset() {
  case "$cuda" in
    12.[0-7]) echo 13 ;;
    *) echo "" ;;
  esac
}

# torch of this flavour, then a check that it is one (a cu130 wheel's tests under a CUDA 12 or CPU
# torch would test the wrong thing).
install_torch() {
  python -m pip install "$1" --index-url "$index_url"
  python - "$tag" <<'EOF'
import sys

import torch

tag = sys.argv[1]
cuda = torch.version.cuda
print("torch", torch.__version__, "CUDA", cuda)
if (cuda is not None) if tag == "cpu" else (cuda is None or cuda.split(".")[0] != tag[2:-1]):
    sys.exit(f"cibw.sh: torch {torch.__version__} (CUDA {cuda}) is not a {tag} torch")
EOF
}

case "${1:-}" in
  install-cuda)
    if [ -z "$cuda" ]; then
      echo "cibw.sh: cpu wheel, no CUDA toolkit"
      exit 0
    fi
    dash="${cuda//./-}"
    dnf install -y -q dnf-plugins-core
    dnf config-manager --add-repo https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo
    dnf install -y -q --setopt=install_weak_deps=False \
      "cuda-nvcc-$dash" "cuda-cudart-devel-$dash" "cuda-cccl-$dash"
    toolset="$(gcc_toolset)"
    if [ -n "$toolset" ]; then
      dnf install -y -q "gcc-toolset-$toolset-gcc-c++"
    fi
    ln -sfn "/usr/local/cuda-$cuda" /usr/local/cuda
    /usr/local/cuda/bin/nvcc --version
    ;;
  install-torch)
    oldest="torch==${EDSC_EXT_TORCH_VERSION:?set EDSC_EXT_TORCH_VERSION, e.g. 2.11.0 (the build torch)}"
    case "${2:-newest}" in
      build)
        install_torch "$oldest"
        python -m pip install "setuptools>=64" wheel ninja
        ;;
      oldest)
        install_torch "$oldest"
        ;;
      newest)
        # Unpinned: pip takes the newest on the flavour's index that this Python has (the wheel itself
        # then requires torch >= the floor).
        install_torch "torch${EDSC_EXT_TEST_TORCH_VERSION:+==$EDSC_EXT_TEST_TORCH_VERSION}"
        ;;
      *)
        echo "cibw.sh: install-torch build | newest | oldest, not '$2'" >&2
        exit 2
        ;;
    esac
    ;;
  arch-list)
    arch_list
    ;;
  host-compiler)
    toolset="$(gcc_toolset)"
    if [ -n "$toolset" ]; then
      echo "/opt/rh/gcc-toolset-$toolset/root/usr/bin/${2:-gcc}"
    else
      command -v "${2:-gcc}"
    fi
    ;;
  force-cuda)
    if [ -n "$cuda" ]; then echo 1; else echo 0; fi
    ;;
  cpu-only)
    if [ -n "$cuda" ]; then echo 0; else echo 1; fi
    ;;
  *)
    echo "usage: cibw.sh install-cuda | install-torch [build|newest|oldest] | arch-list | host-compiler [gcc|g++]" \
      "| force-cuda | cpu-only" >&2
    exit 2
    ;;
esac
