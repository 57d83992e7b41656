"""The test suite without each optional package of the ``test`` extra: every test must pass, or skip and
say which package it needs; none may fail or error because a package is missing.

For each package it runs pytest in a fresh process in which that package looks uninstalled
(tools/hide_packages/sitecustomize.py, which the processes the tests start inherit too) and prints one
row: passed, skipped for the hidden package, skipped otherwise, failed, errors. Exit code 1 if any run
had a failure or an error.

    python tools/optional_packages.py                          # every package, the whole CPU suite
    python tools/optional_packages.py --packages av PIL -- tests/test_interpolate.py -n 2
    python tools/optional_packages.py --packages tqdm -- -m "not cuda" tests/test_models.py
    python tools/optional_packages.py --packages av,PIL,tqdm,onnx,onnxscript,onnxruntime,skimage   # all at once

Arguments after ``--`` go to pytest (default: ``-m "not cuda and not build" tests``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HIDER = REPO / "tools" / "hide_packages"
# The test extra's optional packages (pyproject.toml), by import name; tests/conftest.py's OPTIONAL_PACKAGES.
PACKAGES = ("av", "PIL", "tqdm", "onnx", "onnxscript", "onnxruntime", "skimage")
DEFAULT_PYTEST_ARGS = ["-m", "not cuda and not build", "tests"]


def run_without(package: str, pytest_args: list) -> dict:
    """Runs pytest with ``package`` hidden; returns the counts and the failing tests."""
    env = dict(os.environ, EDSC_EXT_HIDE_PACKAGES=package,
               PYTHONPATH=os.pathsep.join(filter(None, [str(HIDER), str(REPO), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-q", "-rsfE", "-p", "no:cacheprovider", *pytest_args]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    out = result.stdout
    last = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    # -rs lines: "SKIPPED [count] path:line: reason"; a skip for the package names it.
    skips = re.findall(r"^SKIPPED \[(\d+)\] \S+: (.*)$", out, re.M)
    names = "|".join(re.escape(name) for name in package.split(","))
    hidden = sum(int(n) for n, reason in skips if re.search(rf"\b({names})\b", reason))
    problems = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    return {"passed": counts.get("passed", 0), "skipped for it": hidden,
            "skipped otherwise": counts.get("skipped", 0) - hidden, "failed": counts.get("failed", 0),
            "errors": counts.get("errors", 0) + counts.get("error", 0), "problems": problems,
            "returncode": result.returncode, "tail": out[-2000:] + result.stderr[-2000:]}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = DEFAULT_PYTEST_ARGS
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog="python tools/optional_packages.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES), metavar="NAME",
                        help=f"import names to hide, one run each; NAME,NAME hides several in one run (default: "
                             f"{' '.join(PACKAGES)})")
    args = parser.parse_args(argv)
    print(f"pytest {' '.join(pytest_args)}, one run per hidden package")
    print("| hidden | passed | skipped for it | skipped otherwise | failed | errors |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    status = 0
    for package in args.packages:
        row = run_without(package, pytest_args)
        print(f"| {package} | {row['passed']} | {row['skipped for it']} | {row['skipped otherwise']} | "
              f"{row['failed']} | {row['errors']} |", flush=True)
        if row["failed"] or row["errors"] or row["returncode"] not in (0, 5):
            status = 1
            for name in row["problems"]:
                print(f"    {package} hidden: {name}", flush=True)
            if not row["problems"]:
                print(row["tail"], flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
