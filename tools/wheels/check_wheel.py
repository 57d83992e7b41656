"""Checks a built edsc-ext wheel: its local version label (cu130, cu128 or cpu: the CUDA of its kernels,
no torch version, since one stable-ABI binary runs with every torch from the floor on) against the build
facts inside, its tags (cp310-abi3) and torch requirement (torch>=floor, no pin), the sources inside, the
CUDA machine code in the binary (cuobjdump), and what auditwheel says about its portability: the
glibc/libstdc++ symbols must fit the manylinux tag, and the only external libraries left must be
torch's and CUDA's own (they come with torch; repair leaves them out on purpose).

    python tools/wheels/check_wheel.py WHEEL [--label cu130|cu128|cpu] [--sass 90 ...] [--recorded-sass]
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


# A label names the CUDA of the kernels only: cu130, cu128, cpu (_build_support.local_version_label).
LABEL_PATTERN = re.compile(r"cu\d{3}|cpu")


def label_of_meta(meta):
    """The label the build facts call for: cuXYZ of the torch CUDA it was built with, or cpu."""
    if not meta.get("WITH_CUDA"):
        return "cpu"
    cuda = str(meta.get("TORCH_CUDA_VERSION") or meta.get("CUDA_VERSION") or "")
    match = re.match(r"(\d+)\.(\d+)", cuda)
    return f"cu{match.group(1)}{match.group(2)}" if match else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel")
    parser.add_argument("--label", help="expected local version label: cu130, cu128 or cpu")
    parser.add_argument("--sass", nargs="*", default=[], help="architectures that must have machine code, e.g. 90")
    parser.add_argument("--recorded-sass", action="store_true",
                        help="the architectures the build recorded (_build_meta.py) must have machine code")
    parser.add_argument("--plat", default="manylinux_2_28_x86_64", help="manylinux tag the wheel must fit")
    parser.add_argument("--cuobjdump")
    args = parser.parse_args()

    name = os.path.basename(args.wheel)
    print(f"check_wheel: {name}")
    parts = name[:-len(".whl")].split("-")
    version = parts[1]
    if args.label:
        if not LABEL_PATTERN.fullmatch(args.label):
            parser.error(f"--label {args.label}: labels are cuXYZ (the kernels' CUDA, e.g. cu130, cu128) or cpu; "
                         "a torch version (cu130torch2.14) is no longer part of it")
        check(version.endswith("+" + args.label), f"version {version} has the local label +{args.label}")
    check(parts[-3:-1] == ["cp310", "abi3"], f"tags {'-'.join(parts[-3:-1])} are cp310-abi3 (one wheel per platform)")

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(args.wheel) as zf:
            zf.extractall(tmp)
            names = zf.namelist()
        binaries = glob.glob(os.path.join(tmp, "edsc_ext", "_C*.so"))
        check(len(binaries) == 1, "one compiled extension edsc_ext/_C*.so")
        check("edsc_ext/_build_meta.py" in names, "build facts edsc_ext/_build_meta.py (read before loading)")
        check("edsc_ext/_csrc/src/registration.cpp" in names, "sources for edsc_ext.jit in edsc_ext/_csrc")
        check(not any(".libs/" in n for n in names), "no libraries grafted in (torch's and CUDA's stay out)")
        meta = {}
        if "edsc_ext/_build_meta.py" in names:
            exec(open(os.path.join(tmp, "edsc_ext", "_build_meta.py")).read(), meta)
            print(f"       built with torch {meta.get('TORCH_VERSION')}, CUDA {meta.get('CUDA_VERSION')}, "
                  f"archs {meta.get('CUDA_ARCH_LIST')}")
            wanted = label_of_meta(meta)
            check(version.endswith("+" + str(wanted)), f"label +{version.partition('+')[2]} fits the build facts "
                  f"(with_cuda {meta.get('WITH_CUDA')}, torch CUDA {meta.get('TORCH_CUDA_VERSION')}: +{wanted})")
        metadata = [n for n in names if n.endswith(".dist-info/METADATA")]
        if metadata:
            with open(os.path.join(tmp, metadata[0])) as f:
                torch_reqs = [line.split(":", 1)[1].strip() for line in f
                              if line.startswith("Requires-Dist:") and re.match(r"Requires-Dist:\s*torch\b", line)]
            floor = meta.get("TORCH_FLOOR")
            good = len(torch_reqs) == 1 and re.fullmatch(r"torch\s*>=\s*" + re.escape(str(floor)), torch_reqs[0])
            check(bool(good), f"requires torch>={floor} only, no pin (Requires-Dist: {torch_reqs or 'none'})")
        if args.recorded_sass:
            args.sass = list(args.sass) + [a for a in meta.get("CUDA_SASS_ARCHS", []) if a not in args.sass]
            check(bool(meta.get("CUDA_SASS_ARCHS")), "the build recorded its CUDA architectures")

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
