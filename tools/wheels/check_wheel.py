"""Checks a built edsc-ext wheel: its local version label, the build facts and sources inside, the
CUDA machine code in the binary (cuobjdump), and what auditwheel says about its portability: the
glibc/libstdc++ symbols must fit the manylinux tag, and the only external libraries left must be
torch's and CUDA's own (they come with torch; repair leaves them out on purpose).

    python tools/wheels/check_wheel.py WHEEL [--label cu130torch2.14] [--sass 90 ...]
                                       [--plat manylinux_2_28_x86_64] [--cuobjdump PATH]

Needs auditwheel (and patchelf for repair) on PATH; cuobjdump from PATH, --cuobjdump, or the
nvidia-cuda-cuobjdump pip package. Exit code 1 on any failed check.
"""

import argparse
import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

# DT_NEEDED entries a wheel may keep: provided by torch (and its nvidia-* packages) at run time.
ALLOWED_EXTERNAL = ["libtorch*.so", "libc10*.so", "libshm.so", "libcudart.so.*", "libcuda.so.*", "libnvrtc*.so*",
                    "libnvToolsExt*.so*"]

failures = []


def check(ok, what):
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def glibc_of(tag):
    match = re.match(r"manylinux_(\d+)_(\d+)_", tag)
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_cuobjdump(explicit):
    if explicit:
        return explicit
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for base in nvidia.__path__:
        hits = glob.glob(os.path.join(base, "*", "bin", "cuobjdump"))
        if hits:
            return hits[0]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel")
    parser.add_argument("--label", help="expected local version label, e.g. cu130torch2.14")
    parser.add_argument("--sass", nargs="*", default=[], help="architectures that must have machine code, e.g. 90")
    parser.add_argument("--plat", default="manylinux_2_28_x86_64", help="manylinux tag the wheel must fit")
    parser.add_argument("--cuobjdump")
    args = parser.parse_args()

    name = os.path.basename(args.wheel)
    print(f"check_wheel: {name}")
    version = name.split("-")[1]
    if args.label:
        check(version.endswith("+" + args.label), f"version {version} has the local label +{args.label}")

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(args.wheel) as zf:
            zf.extractall(tmp)
            names = zf.namelist()
        binaries = glob.glob(os.path.join(tmp, "edsc_ext", "_C*.so"))
        check(len(binaries) == 1, "one compiled extension edsc_ext/_C*.so")
        check("edsc_ext/_build_meta.py" in names, "build facts edsc_ext/_build_meta.py (read before loading)")
        check("edsc_ext/_csrc/src/deform_sepconv.cpp" in names, "sources for edsc_ext.jit in edsc_ext/_csrc")
        check(not any(".libs/" in n for n in names), "no libraries grafted in (torch's and CUDA's stay out)")
        meta = {}
        if "edsc_ext/_build_meta.py" in names:
            exec(open(os.path.join(tmp, "edsc_ext", "_build_meta.py")).read(), meta)
            print(f"       built with torch {meta.get('TORCH_VERSION')}, CUDA {meta.get('CUDA_VERSION')}, "
                  f"archs {meta.get('CUDA_ARCH_LIST')}")

        if args.sass:
            tool = find_cuobjdump(args.cuobjdump)
            if tool is None or not binaries:
                check(False, "cuobjdump available to list the CUDA machine code")
            else:
                out = subprocess.run([tool, "--list-elf", binaries[0]], capture_output=True, text=True).stdout
                found = sorted(set(re.findall(r"\.sm_(\d+[af]?)\.cubin", out)))
                print(f"       cuobjdump: machine code for sm {','.join(found) or '-'}")
                for arch in args.sass:
                    check(arch in found, f"CUDA kernels for sm_{arch} inside")
                check(found == sorted(set(meta.get("CUDA_SASS_ARCHS", found))),
                      "the binary's machine code matches the recorded architectures")

    show = subprocess.run(["auditwheel", "show", "--json", args.wheel], capture_output=True, text=True)
    check(show.returncode == 0, "auditwheel show runs")
    if show.returncode == 0:
        report = json.loads(show.stdout)
        sym_tag = report["sym_tag"]
        print(f"       auditwheel show: symbol versions fit {sym_tag}; external libraries "
              f"{sorted(report['external_libs'])}")
        want = glibc_of(args.plat)
        got = glibc_of(sym_tag)
        check(got is not None and want is not None and got <= want,
              f"glibc/libstdc++ symbol versions fit {args.plat} (auditwheel: {sym_tag})")
        stray = [lib for lib in report["external_libs"] if not any(fnmatch.fnmatch(lib, p) for p in ALLOWED_EXTERNAL)]
        check(not stray, f"external libraries are only torch's and CUDA's (others: {stray or 'none'})")
    if "manylinux" in name:
        check(args.plat in name, f"platform tag {args.plat} in the file name")

    print(f"check_wheel: {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
