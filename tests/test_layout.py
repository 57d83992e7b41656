"""The package's layout says what depends on what (issue #37): the op at the top level, the models on it,
the apps and the benchmarks on both. Each module has one name (issue #45): the benchmarks are console
scripts and modules of their subpackage, and the first names of moved modules are gone."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set

import pytest

from conftest import subprocess_env

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "edsc_ext"
# Names that no release published, of modules that moved into the subpackages: no module answers to them.
REMOVED_ALIASES = {"edsc_ext.compat": "edsc_ext.models.compat", "edsc_ext.onnx": "edsc_ext.models.onnx",
                   "edsc_ext.benchmark": "edsc_ext.benchmarks.op",
                   "edsc_ext.model_benchmark": "edsc_ext.benchmarks.networks"}
# pyproject.toml's [project.scripts]: each command and the module whose main() it runs.
SCRIPTS = {"edsc-interpolate": "edsc_ext.apps.interpolate", "edsc-benchmark": "edsc_ext.benchmarks.op",
           "edsc-model-benchmark": "edsc_ext.benchmarks.networks", "edsc-video-benchmark": "edsc_ext.benchmarks.video"}
BENCHMARKS = {script: module for script, module in SCRIPTS.items() if ".benchmarks." in module}
SUBPACKAGES = ("edsc_ext.models", "edsc_ext.apps", "edsc_ext.benchmarks")
# Layer -> the packages it must not import. The op is every module of edsc_ext outside the subpackages.
FORBIDDEN = {
    "op": SUBPACKAGES,
    "edsc_ext.models": ("edsc_ext.apps", "edsc_ext.benchmarks"),
    "edsc_ext.apps": ("edsc_ext.benchmarks",),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> str:
    for package in SUBPACKAGES:
        if name == package or name.startswith(package + "."):
            return package
    return "op"


def imported_modules(name: str, path: Path) -> Iterator[str]:
    """Every module that ``path`` (the module ``name``) imports, at the top or inside a function, with
    relative imports resolved; ``from X import y`` yields X and X.y (y may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def violations() -> Set[str]:
    found = set()
    for name, path in modules().items():
        forbidden = FORBIDDEN.get(layer_of(name), ())
        for target in imported_modules(name, path):
            if any(target == f or target.startswith(f + ".") for f in forbidden):
                found.add(f"{name} imports {target}")
    return found


def test_the_op_and_the_models_import_no_app_and_no_benchmark():
    names = modules()
    assert {"edsc_ext.ops", "edsc_ext.models.networks", "edsc_ext.apps.interpolate",
            "edsc_ext.benchmarks.harness"} <= set(names)  # the walk sees every layer
    assert violations() == set()


def test_the_import_walk_sees_a_forbidden_import(monkeypatch):
    """The rule's own check: an op module that imports the apps inside a function is caught."""
    real = Path.read_text

    def with_a_late_import(path, *args, **kwargs):
        text = real(path, *args, **kwargs)
        if path == PACKAGE / "reference.py":
            text += "\n\ndef _late():\n    from .apps import common\n"
        if path == PACKAGE / "models" / "networks.py":
            text += "\n\nimport edsc_ext.benchmarks.networks\n"
        return text

    monkeypatch.setattr(Path, "read_text", with_a_late_import)
    assert violations() == {"edsc_ext.reference imports edsc_ext.apps",
                            "edsc_ext.reference imports edsc_ext.apps.common",
                            "edsc_ext.models.networks imports edsc_ext.benchmarks.networks"}


def test_no_alias_module_is_importable():
    for alias, target in REMOVED_ALIASES.items():
        assert importlib.util.find_spec(alias) is None, f"{alias} still importable (the module is {target})"
        assert not (REPO / (alias.replace(".", "/") + ".py")).exists(), alias


def scripts_table() -> Dict[str, str]:
    table = (REPO / "pyproject.toml").read_text().split("[project.scripts]\n", 1)[1].split("\n\n", 1)[0]
    return dict(re.fullmatch(r'([\w-]+) = "([\w.:]+)"', line).groups() for line in table.splitlines())


def test_each_console_script_runs_its_modules_main():
    table = scripts_table()
    assert table == {script: f"{module}:main" for script, module in SCRIPTS.items()}
    for script, target in table.items():
        module, attr = target.split(":")
        loaded = importlib.import_module(module)
        assert getattr(loaded, attr) is loaded.main and callable(loaded.main), script
    assert not (PACKAGE / "interpolate.py").exists() and not (PACKAGE / "evaluate.py").exists()


def run_help(command: List[str], tmp_path: Path) -> str:
    # The edsc_ext these tests imported (the checkout, or an installed wheel) is the one the command runs.
    result = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                            env=subprocess_env())
    assert result.returncode == 0, result.stderr
    assert "RuntimeWarning" not in result.stderr, result.stderr
    return result.stdout


@pytest.mark.parametrize("module", BENCHMARKS.values())
def test_python_m_runs_each_benchmark_and_its_help_says_so(module, tmp_path):
    out = run_help([sys.executable, "-m", module], tmp_path)
    assert out.startswith(f"usage: python -m {module}"), out[:200]


@pytest.mark.parametrize("script", BENCHMARKS)
def test_each_benchmark_script_names_itself_in_its_help(script, tmp_path):
    """The script as pip writes a console script (import the function, call it), under the command's name."""
    module, attr = scripts_table()[script].split(":")
    path = tmp_path / script
    path.write_text(f"import sys\nfrom {module} import {attr}\nif __name__ == '__main__':\n    sys.exit({attr}())\n")
    out = run_help([sys.executable, str(path)], tmp_path)
    assert out.startswith(f"usage: {script}"), out[:200]
    assert "python -m" not in out.split("\n\n")[0], out[:400]


def test_the_wheel_ships_every_subpackage():
    from setuptools import find_packages

    found = set(find_packages(where=str(REPO), include=["edsc_ext", "edsc_ext.*"]))
    assert {"edsc_ext", *SUBPACKAGES} <= found
    assert "find_packages(include=[\"edsc_ext\", \"edsc_ext.*\"])" in (REPO / "setup.py").read_text()
