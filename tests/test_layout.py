"""The package's layout says what depends on what (issue #37): the op at the top level, the models on it,
the apps and the benchmarks on both; the first names of moved modules are aliases of the same modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Set

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "edsc_ext"
# The first names of moved modules: each replaces itself by its target (sys.modules) and is no layer's code.
ALIASES = {"edsc_ext.compat": "edsc_ext.models.compat", "edsc_ext.onnx": "edsc_ext.models.onnx",
           "edsc_ext.benchmark": "edsc_ext.benchmarks.op", "edsc_ext.model_benchmark": "edsc_ext.benchmarks.networks"}
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
        if name in ALIASES:
            continue
        forbidden = FORBIDDEN.get(layer_of(name), ())
        for target in imported_modules(name, path):
            target = ALIASES.get(target, target)
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
            text += "\n\nimport edsc_ext.model_benchmark\n"
        return text

    monkeypatch.setattr(Path, "read_text", with_a_late_import)
    assert violations() == {"edsc_ext.reference imports edsc_ext.apps",
                            "edsc_ext.reference imports edsc_ext.apps.common",
                            "edsc_ext.models.networks imports edsc_ext.benchmarks.networks"}


def test_aliases_are_the_moved_modules():
    import importlib

    for alias, target in ALIASES.items():
        assert importlib.import_module(alias) is importlib.import_module(target), alias
    for name in ALIASES:  # each holds nothing but the alias
        tree = ast.parse(modules()[name].read_text())
        assert sum(isinstance(node, (ast.FunctionDef, ast.ClassDef)) for node in ast.walk(tree)) == 0, name


@pytest.mark.parametrize("module,prog", [("edsc_ext.benchmark", "python -m edsc_ext.benchmark"),
                                         ("edsc_ext.model_benchmark", "python -m edsc_ext.model_benchmark")])
def test_benchmark_commands_keep_their_names(module, prog):
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {prog}"), result.stdout[:200]
    assert "RuntimeWarning" not in result.stderr, result.stderr


def test_the_command_points_straight_at_the_app_and_the_shims_are_gone():
    table = (REPO / "pyproject.toml").read_text().split("[project.scripts]\n", 1)[1].split("\n\n", 1)[0]
    assert table.splitlines() == ['edsc-interpolate = "edsc_ext.apps.interpolate:main"']
    assert not (PACKAGE / "interpolate.py").exists() and not (PACKAGE / "evaluate.py").exists()


def test_the_wheel_ships_every_subpackage():
    from setuptools import find_packages

    found = set(find_packages(where=str(REPO), include=["edsc_ext", "edsc_ext.*"]))
    assert {"edsc_ext", *SUBPACKAGES} <= found
    assert "find_packages(include=[\"edsc_ext\", \"edsc_ext.*\"])" in (REPO / "setup.py").read_text()
