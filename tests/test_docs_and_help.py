"""What the docs and the commands' help tell a user (issue #37, item 8): install commands that work, no
paths of the project's own machines, every option explained with its default, a smoke run that is one."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from pathlib import Path
from typing import Dict, List

import pytest

from edsc_ext.apps import evaluate
from edsc_ext.apps.common import EXTRA_HINT
from edsc_ext.benchmarks import networks, op, video

from conftest import requires_cuda

REPO = Path(__file__).resolve().parent.parent


def extras() -> Dict[str, List[str]]:
    """pyproject.toml's [project.optional-dependencies] (tomllib is Python 3.11's; the tests run on 3.10 too)."""
    text = (REPO / "pyproject.toml").read_text()
    table = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return {match[1]: ast.literal_eval(match[2]) for match in re.finditer(r"^([\w-]+) = (\[[^\]]*\])", table, re.M)}


def documents() -> Dict[Path, str]:
    paths = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "edsc_ext").rglob("*.py")),
             *sorted((REPO / "examples").glob("*.py"))]
    return {path: path.read_text() for path in paths}


def test_install_commands_name_what_an_index_serves():
    """edsc-ext is not on any index (README, Install): ``pip install "edsc-ext[...]"`` works only with a
    release's find-links page; elsewhere the docs give the checkout's ``.[extra]`` or the packages."""
    bare = [f"{path.relative_to(REPO)}: {line.strip()}" for path, text in documents().items()
            for line in text.splitlines()
            if re.search(r"pip install \S*edsc-ext\[", line) and "--find-links" not in line]
    assert bare == []
    readme = (REPO / "README.md").read_text()
    assert 'pip install --no-build-isolation ".[apps]"' in readme
    assert 'pip install "edsc-ext[apps]" --find-links' in readme  # once wheels exist
    # The apps' one-line error names exactly the apps extra's packages.
    assert EXTRA_HINT.startswith("pip install ") and '"apps" extra' in EXTRA_HINT
    assert sorted(word.strip('"') for word in EXTRA_HINT.split("(")[0].split()[2:]) == sorted(extras()["apps"])


def test_no_example_points_at_the_projects_own_data_folder():
    mentions = [f"{path.relative_to(REPO)}: {line.strip()}" for path, text in documents().items()
                for line in text.splitlines() if "shared/data" in line]
    assert mentions == []


def test_evaluate_needs_its_data_named(capsys, tmp_path):
    rc = evaluate.main(["--weights", str(tmp_path / "w.pth")])
    err = capsys.readouterr().err
    assert rc == 2 and "--data" in err and "required" in err and len(err.strip().splitlines()) == 1, err
    rc = evaluate.main(["--weights", str(tmp_path / "w.pth"), "--data", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--data {tmp_path / 'missing'}: no such folder" in err, err


def train_parser() -> argparse.ArgumentParser:
    spec = importlib.util.spec_from_file_location("edsc_train_example", REPO / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


PARSERS = {"model benchmark": lambda: networks.build_parser(), "op benchmark": lambda: op.build_parser(),
           "video benchmark": lambda: video.build_parser(), "evaluate": lambda: evaluate.build_parser(),
           "train.py": train_parser}


def help_problems(parser: argparse.ArgumentParser) -> List[str]:
    """Options without help, options whose help does not state their default, --device without its
    fallback to the CPU, and issue numbers (the tracker's business, not the user's)."""
    problems = []
    if re.search(r"issue #\d", parser.description or ""):
        problems.append(f"description cites an issue: {parser.description!r}")
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = action.option_strings[-1] if action.option_strings else action.dest
        text = action.help or ""
        if not text.strip():
            problems.append(f"{name}: no help")
            continue
        if re.search(r"issue #\d", text):
            problems.append(f"{name}: cites an issue")
        has_default = action.default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0
        if has_default and "default" not in text.lower():
            problems.append(f"{name}: default {action.default!r} not stated")
        if name == "--device" and not re.search(r"else cpu\b", text.lower()):
            problems.append(f"{name}: does not say it falls back to the CPU")
    return problems


@pytest.mark.parametrize("command", PARSERS)
def test_every_option_says_what_it_does_and_its_default(command):
    assert help_problems(PARSERS[command]()) == []


def test_the_help_check_finds_what_the_issue_listed():
    """The check itself: the model benchmark's help as it was (issue #37) fails it on each item."""
    parser = argparse.ArgumentParser(description="Times the EDSC networks end to end (issue #20): inference")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode of the compiled variants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    assert help_problems(parser) == ["description cites an issue: 'Times the EDSC networks end to end (issue #20): "
                                     "inference'", "--device: does not say it falls back to the CPU",
                                     "--compile-mode: default 'default' not stated", "--seed: no help"]


def test_op_benchmark_names_the_extra_that_brings_torchvision(monkeypatch):
    monkeypatch.setattr(op, "_torchvision_ops", lambda: None)
    reason = op.peer_skip_reason("deform_conv2d", op.CPU_CASES[0])
    extra = re.search(r"the (\w+) extra", reason)
    assert extra and "torchvision" in extras()[extra.group(1)], reason


def test_model_benchmark_quick_is_a_smoke_run(monkeypatch):
    """--quick was 12 minutes on a 2-core CPU, most of it torch.compile: now tiny sizes and the eager
    variants (under a minute there, 20 s measured idle), and its help says what it costs."""
    seen = {}

    def capture(args, models, variants, cases, device, argv):
        seen.update(variants=[v.name for v in variants], cases=[c.name for c in cases], rounds=args.rounds)
        return 0

    monkeypatch.setattr(networks, "_run", capture)
    assert networks.main(["--device", "cpu", "--quick"]) == 0
    assert seen["variants"] == list(networks.QUICK_VARIANTS)
    assert not [v for v in seen["variants"] if v.startswith("compiled")]
    assert seen["cases"] == ["inference 1x3x32x32", "training 2x3x32x32"] and seen["rounds"] == 2
    assert networks.main(["--device", "cpu", "--quick", "--variants", "compiled-fp32"]) == 0
    assert seen["variants"] == ["compiled-fp32"]  # a compile only where asked for
    quick = next(a for a in networks.build_parser()._actions if "--quick" in a.option_strings)
    assert "minute" in quick.help and "compil" in quick.help


# ---------------------------------------------------------------------------------------------
# What help() shows a user of the API (issue #45, item 7)

CROSS_REFERENCE = re.compile(r":(?:func|class|mod|meth|attr|data|obj):`~?([\w.]+)`")


def resolves(name: str) -> bool:
    """Whether a dotted name is an importable module, or an attribute chain of one."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True
    return False


def test_docstring_cross_references_resolve_where_they_are_read():
    """Every reference to an ``edsc_ext.`` name in the package names something that exists, and a bare
    name in the docstring of a function or class exported at the top level (read by ``help(edsc_ext.f)``,
    where ``edsc_ext`` is the namespace) is an attribute of ``edsc_ext``: ``deform_sepconv`` pointed at
    ``autocast_dtypes``, which lives in ``edsc_ext.ops``."""
    import edsc_ext

    dangling = [f"{path.relative_to(REPO)}: {name}" for path in sorted((REPO / "edsc_ext").rglob("*.py"))
                for name in CROSS_REFERENCE.findall(path.read_text())
                if name.startswith("edsc_ext.") and not resolves(name)]
    assert dangling == []
    bare = [f"edsc_ext.{exported}: {name}" for exported in edsc_ext.__all__
            if callable(getattr(edsc_ext, exported)) and not isinstance(getattr(edsc_ext, exported), type(edsc_ext))
            for name in CROSS_REFERENCE.findall(getattr(edsc_ext, exported).__doc__ or "")
            if "." not in name and not hasattr(edsc_ext, name)]
    assert bare == []


def test_the_module_forms_forward_says_what_it_takes():
    """help(DeformSepConv2d.forward) showed nn.Module's docstring, and its hint left out split offsets."""
    import typing

    import torch

    import edsc_ext
    from edsc_ext.nn import DeformSepConv2d

    doc = DeformSepConv2d.forward.__doc__ or ""
    assert doc and doc != torch.nn.Module.forward.__doc__
    for word in ("input", "vertical", "horizontal", "offset", "mask", "(dy, dx)", "deform_sepconv"):
        assert word in doc, word
    offset = typing.get_type_hints(DeformSepConv2d.forward)["offset"]
    assert offset == typing.get_type_hints(edsc_ext.deform_sepconv)["offset"]
    assert typing.Tuple[torch.Tensor, torch.Tensor] in typing.get_args(offset)


# ---------------------------------------------------------------------------------------------
# README's examples, as a new user pastes them (issue #45, item 7)

# A fenced python block that README marks runnable: `<!-- runnable -->` on the line before it, or
# `<!-- runnable, device "cuda:1" -->` where the block names a device that the test replaces by its own.
RUNNABLE = re.compile(r'^<!-- runnable(?:, device "(?P<device>[^"]+)")? -->\n```python\n(?P<code>.*?)^```', re.M | re.S)


def readme_examples() -> List[tuple]:
    return [(m["device"], m["code"]) for m in RUNNABLE.finditer((REPO / "README.md").read_text())]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])])
def test_readme_examples_run_when_pasted_in_order(device):
    """The runnable blocks, one after the other in one namespace, as a user pastes them: the sepconv line
    once reused the tensors the EDSC line before it had made for padding=2, and failed."""
    examples = readme_examples()
    assert len(examples) >= 2 and "edsc_ext.deform_sepconv(" in examples[0][1]
    namespace: Dict[str, object] = {}
    for placeholder, code in examples:
        if placeholder:
            assert f'"{placeholder}"' in code
            code = code.replace(f'"{placeholder}"', f'"{device}"')
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (the README's own example)


def test_readme_says_how_to_install_a_wheel_file():
    install = (REPO / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^pip install \./edsc_ext-0\.1\.0\+\w+-cp310-abi3-\S+\.whl", install, re.M), install[-2000:]
    for word in ("torch.version.cuda", "cu130", "cu128", "cpu", "torch>=2.10"):
        assert word in install, word
