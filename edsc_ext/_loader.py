"""Finds and loads the compiled extension, and explains in one line when it cannot.

The binary uses torch only through the LibTorch stable ABI, so it runs with every torch from the
floor it targets (``_build_support.STABLE_ABI_FLOOR``) on; its CUDA kernels need a torch of the CUDA
major they were compiled with (a CUDA build also runs, on the CPU, with a CPU-only torch). So the
build facts are read first from the generated ``_build_meta.py`` (plain Python, readable whatever
torch is installed) and checked against the running torch before the binary is touched: a torch
below the floor and a CUDA-major mismatch are each refused in one line that says what to install.
Only then is the binary loaded; if loading still fails, the error explains and keeps the original one.

A source checkout that was not built itself (``pip install .`` puts the build into site-packages, but
Python run from the checkout's root imports the checkout) uses the build installed from the same
sources: a digest of the C++/CUDA sources recorded at build time tells which one that is.

``EDSC_EXT_JIT=1`` compiles the shipped sources for the running torch instead (:mod:`edsc_ext.jit`);
``EDSC_EXT_JIT=auto`` does that only when no prebuilt binary fits.
"""

import ast
import importlib
import importlib.machinery
import importlib.util
import os
import platform
import sys

import torch

from . import _build_support as bs
from ._version import WHEEL_INDEX
from ._version import __version__ as BASE_VERSION

PYPI_NAME = "edsc-ext"


def read_build_meta():
    """The build facts written by setup.py (dict, lower-case keys), or None when absent."""
    return _read_meta_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_meta.py"))


def _describe_torch(version, cuda):
    return f"torch {version} ({'CUDA ' + cuda if cuda else 'CPU only'})"


def _floor(facts):
    """The oldest torch (major, minor) a build with these facts runs with."""
    floor = (facts or {}).get("torch_floor")
    return bs.major_minor(floor) if floor else bs.STABLE_ABI_FLOOR


def mismatch(torch_floor, built_cuda, with_cuda, running_torch=None, running_cuda=None):
    """Why a binary for torch >= `torch_floor` (CUDA kernels of CUDA `built_cuda` when `with_cuda`)
    cannot run with the running torch, or None when it can."""
    running_torch = running_torch or torch.__version__
    running_cuda = running_cuda if running_cuda is not None else torch.version.cuda
    floor = bs.major_minor(torch_floor)
    if bs.major_minor(running_torch) < floor:
        return "torch {} is older than {}.{}, the oldest it runs with".format(running_torch, *floor)
    if with_cuda and built_cuda and running_cuda:
        if bs.major_minor(built_cuda)[0] != bs.major_minor(running_cuda)[0]:
            return f"its kernels are for CUDA {built_cuda} but the installed torch uses CUDA {running_cuda}"
    return None


def remedy(problem_floor, facts):
    """The one command that fixes a mismatch: a newer torch, or the edsc-ext build of torch's CUDA."""
    if problem_floor:
        return 'pip install "torch>={}.{}"'.format(*_floor(facts))
    wanted = bs.release_label(torch.version.cuda)
    index = facts.get("wheel_index") or WHEEL_INDEX
    if index:
        return (f'pip install --force-reinstall --no-deps "{PYPI_NAME}=={BASE_VERSION}+{wanted}" '
                f'-f {index}/{wanted}.html')
    return "pip install --no-build-isolation --force-reinstall --no-deps .   (in the checkout, rebuilds it)"


def refusal(problem, facts):
    """The one-line ImportError text of a binary that does not fit the installed torch."""
    below_floor = "older than" in problem
    return (f"edsc_ext {facts.get('version', BASE_VERSION)} cannot run here: {problem}; install what fits: "
            f"{remedy(below_floor, facts)}")


def explain(problem, meta=None, binary_info=None, cause=None):
    """The ImportError text of a binary that does not load: what was built, what is installed, the fixes."""
    facts = dict(binary_info or {})
    facts.update({k: v for k, v in (meta or {}).items() if v is not None})
    built_torch = facts.get("torch_version")
    built_cuda = facts.get("torch_cuda_version") or facts.get("cuda_version")
    with_cuda = facts.get("with_cuda")
    lines = [f"edsc_ext cannot load its compiled kernels: {problem}."]
    if built_torch:
        archs = ",".join(facts.get("cuda_sass_archs") or []) or "-"
        lines.append("  built for: torch >= {}.{}".format(*_floor(facts))
                     + (f" with CUDA {built_cuda}, kernels for sm {archs}" if with_cuda else " (CPU kernels)")
                     + f" (headers of torch {built_torch})"
                     + f"  [edsc-ext {facts.get('version', BASE_VERSION)}, {facts.get('build', 'unknown')} build]")
    lines.append(f"  installed: {_describe_torch(torch.__version__, torch.version.cuda)}, "
                 f"Python {platform.python_version()}")
    lines += [
        "Fix it with one of:",
        "  * rebuild it from source against the installed torch (C++ compiler; nvcc matching torch's CUDA "
        "for the GPU kernels), in the checkout it came from:",
        "      pip install --no-build-isolation --force-reinstall --no-deps .",
        f"  * or reinstall the published build for your torch: {remedy(False, facts)}",
        "  * or compile it on import: EDSC_EXT_JIT=1 python ...   (cached after the first time)",
        "See the README, sections 'Install' and 'Troubleshooting'.",
    ]
    if cause is not None:
        lines.append(f"Underlying error: {type(cause).__name__}: {cause}")
    return "\n".join(lines)


def _jit_mode():
    value = os.environ.get("EDSC_EXT_JIT", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return "force"
    if value == "auto":
        return "auto"
    return None


def _check_facts(meta):
    """ImportError, one line, when build facts say the binary does not fit the installed torch."""
    if meta is not None and meta.get("torch_version"):
        floor = "{}.{}".format(*_floor(meta))
        problem = mismatch(floor, meta.get("cuda_version") or meta.get("torch_cuda_version"), meta.get("with_cuda"))
        if problem:
            raise ImportError(refusal(problem, meta))


def checkout_root():
    """The source checkout this package is imported from (its root folder), or None when the
    package is an installed one."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    markers = ("setup.py", "pyproject.toml", os.path.join("src", "registration.cpp"))
    return root if all(os.path.isfile(os.path.join(root, m)) for m in markers) else None


def _read_meta_file(path):
    """The build facts of a _build_meta.py given by path (lower-case keys), or None."""
    try:
        with open(path) as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    facts = {}
    for node in tree.body:  # NAME = literal, as bs.build_meta_source writes them
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                try:
                    facts[name.lower()] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return facts


def installed_builds_elsewhere():
    """(binary path, build facts) of each edsc_ext package with a compiled extension on sys.path,
    other than this one (e.g. what `pip install .` put into site-packages), in sys.path order."""
    here = os.path.dirname(os.path.abspath(__file__))
    found, seen = [], {here}
    for entry in sys.path:
        folder = os.path.abspath(os.path.join(entry or os.getcwd(), __package__))
        if folder in seen or not os.path.isdir(folder):
            continue
        seen.add(folder)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            binary = os.path.join(folder, "_C" + suffix)
            if os.path.isfile(binary):
                found.append((binary, _read_meta_file(os.path.join(folder, "_build_meta.py")) or {}))
                break
    return found


def _load_binary(path):
    """Loads the extension module at `path` as <package>._C."""
    name = f"{__package__}._C"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _load_for_checkout(root):
    """(module, meta) for an unbuilt source checkout: the build installed from these very sources
    (same sources digest) elsewhere on sys.path. ImportError with the one command to run otherwise."""
    builds = installed_builds_elsewhere()
    digest = bs.sources_digest(root)
    for binary, meta in builds:
        if meta.get("sources_digest") == digest:
            _check_facts(meta)
            try:
                return _load_binary(binary), meta
            except ImportError as exc:
                raise ImportError(explain(f"the binary {binary} does not load", meta, cause=exc)) from exc
    if builds:
        why = (f"the edsc-ext installed in {os.path.dirname(builds[0][0])} was built from other sources "
               "than this checkout's")
    else:
        why = "no build of it is installed"
    raise ImportError(f"edsc_ext is imported from the source checkout {root}, which is not built, and {why}: "
                      f"run `pip install --no-build-isolation -e .` in {root} (or run Python from another folder)")


def _load_prebuilt():
    """(module, meta) of the prebuilt binary; ImportError with an explanation when it does not fit."""
    meta = read_build_meta()
    _check_facts(meta)
    try:
        module = importlib.import_module(f"{__package__}._C")
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == f"{__package__}._C"
        root = checkout_root() if missing and meta is None else None
        if root is not None:
            try:
                return _load_for_checkout(root)
            except ImportError as checkout_error:
                raise checkout_error from None  # the missing module is the expected state of a checkout
        if missing:
            problem = ("no compiled extension is installed (a source checkout that was not built? run "
                       "`pip install --no-build-isolation -e .`)")
        else:
            problem = "the binary does not load"
        raise ImportError(explain(problem, meta, cause=exc)) from exc
    info = dict(module.build_info())
    # Without _build_meta.py (another build path), check the facts the binary carries.
    problem = mismatch(info.get("torch_floor") or "{}.{}".format(*bs.STABLE_ABI_FLOOR), info.get("cuda_version"),
                       info.get("with_cuda"))
    if problem:
        raise ImportError(refusal(problem, {**(meta or {}), **info}))
    return module, meta


def load():
    """(compiled module, build facts dict, build kind) for this process."""
    mode = _jit_mode()
    if mode != "force":
        try:
            module, meta = _load_prebuilt()
            return module, meta or {}, (meta or {}).get("build", "setuptools")
        except ImportError as exc:
            # A binary that did load has registered its ops: a second (JIT) build cannot join it.
            if mode != "auto" or f"{__package__}._C" in sys.modules:
                raise
            print(f"edsc_ext: EDSC_EXT_JIT=auto: the prebuilt binary does not fit, compiling:\n{exc}",
                  file=sys.stderr)
    from . import jit

    try:
        module = jit.load(verbose=bs.flag("EDSC_EXT_JIT_VERBOSE"))
    except Exception as exc:
        raise ImportError(
            f"edsc_ext: the JIT build (EDSC_EXT_JIT={os.environ.get('EDSC_EXT_JIT')}) for torch {torch.__version__} "
            f"failed. It needs a C++ compiler and ninja (pip install ninja), and for the CUDA kernels nvcc of "
            f"CUDA {torch.version.cuda or '-'} (CUDA_HOME); EDSC_EXT_JIT_VERBOSE=1 shows the build. "
            f"Underlying error: {type(exc).__name__}: {exc}") from exc
    return module, jit.last_build_facts(), "jit"
