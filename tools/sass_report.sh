#!/usr/bin/env bash
# Compiles src/cuda/deform_sepconv_*_cuda.cu for one architecture (no GPU needed) and prints, per
# kernel, registers, spills and the SASS instruction mix that matters for this op: gathers (LDG),
# stores, shared-memory atomics (native ATOMS.ADD vs CAS loops), global reductions.
#   tools/sass_report.sh [ARCH=90] [FILTER=regex on kernel names]
# Needs torch (for its headers) and nvcc; uses Triton's cuobjdump when the toolkit has none.
set -euo pipefail
arch=${1:-90}
filter=${2:-.}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap '[ -n "${KEEP_SASS:-}" ] && cp "$work/k.sass" "$KEEP_SASS"; rm -rf "$work"' EXIT
cuda_home=$(python -c "from edsc_ext._build_support import find_cuda_home; print(find_cuda_home() or "/usr/local/cuda")" 2>/dev/null || echo /usr/local/cuda)
incs=$(python - <<'PY'
import os, glob
from torch.utils.cpp_extension import include_paths
import site
dirs = include_paths(device_type="cuda")
for sp in site.getsitepackages():
    dirs += glob.glob(os.path.join(sp, "nvidia", "*", "include")) + glob.glob(os.path.join(sp, "nvidia", "cu*", "include"))
print(" ".join("-I" + d for d in dirs))
PY
)
pids=()
for source in "$root"/src/cuda/deform_sepconv_*_cuda.cu; do  # in parallel, one log each
  name=$(basename "$source" .cu)
  "$cuda_home/bin/nvcc" -std=c++20 -O3 -cubin -arch=sm_$arch -Xptxas -v -DTORCH_EXTENSION_NAME=_C \
    -I"$root/include" $incs -o "$work/$name.cubin" "$source" 2>"$work/$name.ptxas" &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid" || { cat "$work"/*.ptxas >&2; exit 1; }
done
cat "$work"/*.ptxas >"$work/ptxas.txt"
cuobjdump=$(command -v cuobjdump || true)
[ -n "$cuobjdump" ] || cuobjdump=$(python -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/cuobjdump'))")
for cubin in "$work"/*.cubin; do "$cuobjdump" -sass "$cubin"; done >"$work/k.sass"
python - "$work/k.sass" "$work/ptxas.txt" "$filter" <<'PY'
import re, sys, subprocess
sass, ptxas, filt = open(sys.argv[1]).read(), open(sys.argv[2]).read(), re.compile(sys.argv[3])
def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
        return dict(zip(names, out))
    except OSError:
        return {n: n for n in names}
regs = {}
for m in re.finditer(r"Compiling entry function '(\S+)'.*?\n(.*?)Used (\d+) registers", ptxas, re.S):
    spill = re.search(r"(\d+) bytes spill stores", m.group(2))
    stack = re.search(r"(\d+) bytes stack frame", m.group(2))
    regs[m.group(1)] = (int(m.group(3)), int(spill.group(1)) if spill else 0, int(stack.group(1)) if stack else 0)
funcs = re.split(r"\n\s*Function : ", sass)[1:]
names = demangle([f.split("\n", 1)[0].strip() for f in funcs])
kinds = [("instr", r"/\*[0-9a-f]{4,}\*/"), ("LDG", r"\bLDG\b"), ("LDS", r"\bLDS\b"), ("STG", r"\bSTG\b"),
         ("ATOMS.ADD", r"ATOMS\.ADD"), ("ATOMS.CAS", r"ATOMS\.CAS"), ("RED/ATOMG", r"\b(RED|ATOMG)\b"),
         ("F2I/I2F", r"\b(F2I|I2F)"), ("LDL/STL", r"\b(LDL|STL)\b")]
print(f"{'kernel':90s} regs spill stack " + " ".join(f"{k:>9s}" for k, _ in kinds))
for f in funcs:
    mangled = f.split("\n", 1)[0].strip()
    name = names.get(mangled, mangled)
    if not filt.search(name):
        continue
    short = re.sub(r"edsc_ext::\(anonymous namespace\)::|edsc_ext::", "", name)[:90]
    r = regs.get(mangled, (0, 0, 0))
    counts = [len(re.findall(p, f)) for _, p in kinds]
    print(f"{short:90s} {r[0]:4d} {r[1]:5d} {r[2]:5d} " + " ".join(f"{c:9d}" for c in counts))
PY
