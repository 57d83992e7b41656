"""What the commands share: :class:`UserError` (printed as one line, exit code 2), the optional
dependencies of the ``apps`` extra, the progress bar (tqdm), a one-line argparse and atomic outputs."""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["UserError", "require", "progress", "OneLineParser", "atomic_path", "describe_os_error",
           "time_in_unit_interval", "EXTRA_HINT"]

# The apps extra's packages (pyproject.toml), installable whether edsc-ext came from a checkout or a wheel.
EXTRA_HINT = 'pip install tqdm pillow av (the "apps" extra)'


class UserError(ValueError):
    """Bad input or an environment problem: the commands print ``prog: error: <message>`` on one
    line and exit with code 2, without a traceback. A ValueError, so that callers that catch bad
    values (examples/train.py) catch it too."""


def require(module: str, what: str):
    """Imports an optional dependency of the ``apps`` extra, or raises a UserError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{what} needs the '{module.split('.')[0]}' package: {EXTRA_HINT}") from None


def progress(iterable=None, *, disable: bool = False, **kwargs):
    """A tqdm progress bar on stderr (``tqdm(iterable, **kwargs)``). With ``disable=True`` nothing is
    shown, but the bar still counts (``n``, ``postfix``), so callers may read it."""
    tqdm = require("tqdm", "the progress bar").tqdm
    if not disable:
        return tqdm(iterable, **kwargs)
    return _quiet_bar_class()(iterable, disable=True, **kwargs)


@functools.lru_cache(maxsize=None)
def _quiet_bar_class():
    from tqdm import tqdm

    class QuietBar(tqdm):
        """tqdm's disabled bar counts nothing; this one counts, and prints nothing."""

        def update(self, n=1):
            self.n += n

        def __iter__(self):
            for item in self.iterable:
                yield item
                self.n += 1

    return QuietBar


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``prog: error: ... (see --help)``), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def time_in_unit_interval(text: str) -> float:
    """argparse type of ``--time``: a float strictly between 0 and 1 (the same rule in every command)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1) (strictly between the two frames), got {text}")
    return value


@contextlib.contextmanager
def cudnn_autotuning(on: bool) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` on inside the block when ``on`` (else as the process set
    it), and restored after: the CLIs' and benchmarks' ``--cudnn-benchmark``, for their run only."""
    import torch

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before or on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def describe_os_error(error: OSError, path=None) -> str:
    """A one-line description of an OSError, naming the file."""
    name = path if path is not None else (error.filename or "")
    if error.errno == errno.ENOSPC:
        return f"writing {name}: no space left on device"
    if isinstance(error, FileNotFoundError):
        return f"{name}: no such file or folder"
    if isinstance(error, PermissionError):
        return f"{name}: permission denied"
    if isinstance(error, IsADirectoryError):
        return f"{name}: is a folder, not a file"
    reason = error.strerror or str(error)
    return f"{name}: {reason}" if name else reason


@contextlib.contextmanager
def atomic_path(final, folder: bool = False) -> Iterator[Path]:
    """Yields a temporary path beside ``final`` (same folder, same extension); when the block ends
    without an exception it is renamed to ``final``, else removed. So a failure mid-way (a full
    disk, a corrupt frame, Ctrl-C) leaves nothing under the final name. ``folder=True`` makes a
    temporary folder; the final folder must then not exist or be empty."""
    final = Path(final)
    parent = final.parent
    if folder:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{final.stem}.partial-", suffix=final.suffix, dir=parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if folder:
            if final.is_dir():
                final.rmdir()  # empty (checked by the caller before the work began)
            os.replace(tmp, final)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, final)
    except BaseException:
        if folder:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def note(message: str, quiet: bool = False) -> None:
    """A one-line note on stderr (what the command decided for the user); on a line of its own
    while a progress bar is shown (tqdm.write)."""
    if quiet:
        return
    try:
        from tqdm import tqdm
    except ImportError:
        print(message, file=sys.stderr)
    else:
        tqdm.write(message, file=sys.stderr)


def ensure_output_folder(path: Path, quiet: bool = False, prog: str = "edsc-interpolate") -> Optional[Path]:
    """Creates the folder an output goes into when it is missing, and says so; returns it if created."""
    parent = Path(path).parent
    if parent.is_dir():
        return None
    if parent.exists():
        raise UserError(f"-o {path}: {parent} is not a folder")
    try:
        parent.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"-o {path}: cannot create the folder {parent}: {e.strerror or e}") from None
    note(f"{prog}: created the folder {parent}", quiet)
    return parent
