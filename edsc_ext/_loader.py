"""Finds and loads the compiled extension, and explains in words when it cannot.

A compiled PyTorch extension runs only with the torch major.minor (and CUDA major) it was built
against; a mismatched binary typically fails with ``undefined symbol: _ZN3c10...``. So the build
facts are read first from the generated ``_build_meta.py`` (plain Python, readable whatever torch
is installed) and checked against the running torch before the binary is touched. Only then is the
binary loaded; if loading still fails, the error says the same things and keeps the original one.

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


def mismatch(built_torch, built_cuda, with_cuda, running_torch=None, running_cuda=None):
    """Why a binary built against torch `built_torch` (CUDA `built_cuda` when `with_cuda`) cannot run
    with the running torch, or None when it can."""
    running_torch = running_torch or torch.__version__
    running_cuda = running_cuda if running_cuda is not None else torch.version.cuda
    if bs.major_minor(built_torch) != bs.major_minor(running_torch):
        return "torch {}.{} vs {}.{}".format(*bs.major_minor(built_torch), *bs.major_minor(running_torch))
    if with_cuda and built_cuda:
        if not running_cuda:
            return "it has CUDA kernels but the installed torch has no CUDA"
        if bs.major_minor(built_cuda)[0] != bs.major_minor(running_cuda)[0]:
            return f"CUDA {built_cuda} vs {running_cuda} (the CUDA major versions differ)"
    return None


def explain(problem, meta=None, binary_info=None, cause=None):
    """The ImportError text: what was built, what is installed, and the exact fixes."""
    facts = dict(binary_info or {})
    facts.update({k: v for k, v in (meta or {}).items() if v is not None})
    built_torch = facts.get("torch_version")
    built_cuda = facts.get("torch_cuda_version") or facts.get("cuda_version")
    with_cuda = facts.get("with_cuda")
    index = facts.get("wheel_index") or WHEEL_INDEX
    wanted = bs.local_version_label(torch.__version__, torch.version.cuda)
    lines = [f"edsc_ext cannot load its compiled kernels: {problem}."]
    if built_torch:
        archs = ",".join(facts.get("cuda_sass_archs") or []) or "-"
        lines.append(f"  built for: {_describe_torch(built_torch, built_cuda if with_cuda else None)}"
                     + (f", kernels for sm {archs}" if with_cuda else "")
                     + f"  [edsc-ext {facts.get('version', BASE_VERSION)}, {facts.get('build', 'unknown')} build]")
    lines.append(f"  installed: {_describe_torch(torch.__version__, torch.version.cuda)}, "
                 f"Python {platform.python_version()}")
    lines += [
        "A compiled PyTorch extension only runs with the torch major.minor (and CUDA major) it was built against.",
        "Fix it with one of:",
        "  * rebuild it from source against the installed torch (C++ compiler; nvcc matching torch's CUDA "
        "for the GPU kernels), in the checkout it came from:",
        "      pip install --no-build-isolation --force-reinstall --no-deps .",
    ]
    if index:  # a wheel of a published release knows where its siblings are
        lines += [f"  * or install the edsc-ext wheel built for your torch ({wanted}), where one is published "
                  f"({index}/ lists them):",
                  f'      pip install --force-reinstall --no-deps "{PYPI_NAME}=={BASE_VERSION}" '
                  f'-f {index}/{wanted}.html']
    if built_torch:
        mm = "{}.{}".format(*bs.major_minor(built_torch))
        tag = bs.cuda_tag(built_cuda if with_cuda else None)
        lines += ["  * or install the torch this build is for:",
                  f'      pip install "torch=={mm}.*" --index-url https://download.pytorch.org/whl/{tag}']
    lines += [
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
    """ImportError with the explanation when build facts say the binary is for another torch."""
    if meta is not None and meta.get("torch_version"):
        problem = mismatch(meta["torch_version"], meta.get("torch_cuda_version"), meta.get("with_cuda"))
        if problem:
            raise ImportError(explain(f"it was built for another torch ({problem})", meta))


def checkout_root():
    """The source checkout this package is imported from (its root folder), or None when the
    package is an installed one."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    markers = ("setup.py", "pyproject.toml", os.path.join("src", "deform_sepconv.cpp"))
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
    problem = mismatch(info["torch_version"], info.get("cuda_version"), info.get("with_cuda"))
    if problem:
        raise ImportError(explain(f"it was built for another torch ({problem})", meta, info))
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
