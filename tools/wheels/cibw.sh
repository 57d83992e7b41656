#!/usr/bin/env bash
# cibuildwheel steps for one (CUDA, torch) entry of .github/workflows/wheels.yml, run inside the
# manylinux_2_28 container (see [tool.cibuildwheel] in pyproject.toml):
#   cibw.sh install-cuda           before-all: the CUDA toolkit EDSC_EXT_CUDA_VERSION (nvcc, cudart, CCCL)
#   cibw.sh install-torch [build]  before-build / before-test: torch==EDSC_EXT_TORCH_VERSION from the
#                                  PyTorch index for that CUDA ('build': also setuptools, wheel, ninja)
#   cibw.sh arch-list              the TORCH_CUDA_ARCH_LIST for that CUDA version
#   cibw.sh host-compiler          the host C/C++ compiler nvcc of that version accepts
set -euo pipefail

cuda="${EDSC_EXT_CUDA_VERSION:?set EDSC_EXT_CUDA_VERSION, e.g. 13.0}"
cuda_tag="cu${cuda//./}"

arch_list() {
  # Real SASS for every architecture from Turing that this CUDA supports, PTX for the newest.
  # Keep in step with edsc_ext/_build_support.py:wheel_arch_list (tests/test_build.py checks).
  case "$cuda" in
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

case "${1:-}" in
  install-cuda)
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
    python -m pip install "torch==${EDSC_EXT_TORCH_VERSION:?set EDSC_EXT_TORCH_VERSION, e.g. 2.14.1}" \
      --index-url "https://download.pytorch.org/whl/$cuda_tag"
    if [ "${2:-}" = build ]; then
      python -m pip install "setuptools>=64" wheel ninja
    fi
    python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
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
  *)
    echo "usage: cibw.sh install-cuda | install-torch [build] | arch-list | host-compiler [gcc|g++]" >&2
    exit 2
    ;;
esac
