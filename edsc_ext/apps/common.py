"""What the commands share: :class:`UserError` (printed as one line, exit code 2), the optional
dependencies of the ``apps`` extra, the progress bar (tqdm), a one-line argparse and atomic outputs."""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import importlib
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator, List

__all__ = ["UserError", "require", "progress", "OneLineParser", "atomic_path", "describe_os_error",
           "refuse_input_as_output", "signals_stop_the_run", "Stopped", "time_in_unit_interval", "EXTRA_HINT",
           "ensure_output_folder", "remove_created_folders", "MINIMUM_VERSIONS", "version_key"]

# The oldest version of an apps package the apps work with (pyproject.toml's extras say the same): PyAV 18
# added Stream.set_display_matrix (a rotated video's display matrix kept).
MINIMUM_VERSIONS = {"av": "18"}
# The apps extra's packages (pyproject.toml), installable whether edsc-ext came from a checkout or a wheel.
EXTRA_HINT = f'pip install tqdm pillow "av>={MINIMUM_VERSIONS["av"]}" (the "apps" extra)'


class UserError(ValueError):
    """Bad input or an environment problem: the commands print ``prog: error: <message>`` on one
    line and exit with code 2, without a traceback. A ValueError, so that callers that catch bad
    values (examples/train.py) catch it too."""


def version_key(version: str) -> tuple:
    """'18.1.0' -> (18, 1, 0): versions compared as numbers."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def require(module: str, what: str):
    """Imports an optional dependency of the ``apps`` extra, or raises a UserError naming the extra (also
    where the installed version is older than MINIMUM_VERSIONS asks)."""
    package = module.split(".")[0]
    try:
        imported = importlib.import_module(module)
    except ImportError:
        raise UserError(f"{what} needs the '{package}' package: {EXTRA_HINT}") from None
    minimum = MINIMUM_VERSIONS.get(package)
    if minimum is not None:
        found = str(getattr(sys.modules[package], "__version__", "0"))
        if version_key(found) < version_key(minimum):
            raise UserError(f"{what} needs '{package}' {minimum} or newer, found {found}: {EXTRA_HINT}")
    return imported


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
        return f"writing {name}: no space left on device" if name else "no space left on device"
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
    tmp = None
    try:
        # Signals wait until the name is known: one in between would leave the file behind unnamed.
        with _signals_held():
            tmp = _make_temporary(final, folder)
        yield tmp
        try:
            if folder:
                # mkdtemp's folder is private (0700): the final one gets the mode an existing empty
                # folder had, else the user's umask, as mkdir gives.
                mode = stat.S_IMODE(final.stat().st_mode) if final.is_dir() else 0o777 & ~_umask()
                os.chmod(tmp, mode)
                if final.is_dir():
                    final.rmdir()  # empty (checked by the caller before the work began)
            else:
                os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, final)
        except OSError as e:
            raise UserError(describe_os_error(e, final)) from None
    except BaseException:
        if tmp is None:
            raise
        if folder:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise


def _make_temporary(final: Path, folder: bool) -> Path:
    parent = final.parent
    try:
        if folder:
            return Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=parent))
        fd, name = tempfile.mkstemp(prefix=f".{final.stem}.partial-", suffix=final.suffix, dir=parent)
        os.close(fd)
        return Path(name)
    except OSError as e:  # its message would name the temporary file, which the user never asked for
        reason = "the folder takes no new files" if isinstance(e, FileNotFoundError) and parent.is_dir() \
            else (e.strerror or str(e)).lower()
        raise UserError(f"{final}: cannot create it in {parent} ({reason})") from None


_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP handled when the block ends rather than inside it (main thread).
    Python runs signal handlers in the main thread whichever thread the signal reached, so the
    handlers are swapped for ones that note the signal, and the noted ones are raised again after
    (blocking them in this thread would not do: torch's and FFmpeg's threads still take them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted = []
    before = {signum: signal.signal(signum, lambda signum, frame: noted.append(signum))
              for signum in _STOPPING_SIGNALS if signal.getsignal(signum) is not None}  # None: set outside Python
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        for signum in noted:
            signal.raise_signal(signum)


def refuse_input_as_output(output, inputs) -> None:
    """Raises a UserError when ``output`` is one of ``inputs`` under any spelling (relative,
    absolute, ``./``, a symbolic or a hard link): writing it would destroy that input. ``output``
    is named as given (a str keeps its ``./``)."""
    for source in inputs:
        with contextlib.suppress(OSError):  # a missing output (or input) is no input
            if os.path.samefile(output, source):
                raise UserError(f"-o {output}: is the input {source}; choose another name")


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived (:func:`signals_stop_the_run`): like Ctrl-C's KeyboardInterrupt, it
    unwinds the run, so that partial outputs are removed on the way."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise :class:`Stopped` in the main thread (their default
    would end the process at once, leaving the temporary output behind); restored after. Only where
    the default is in place (``nohup`` ignores SIGHUP: it stays ignored), and only in the main
    thread (signals cannot be caught elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in _STOPPING_SIGNALS[1:]
                if signal.getsignal(signum) == signal.SIG_DFL}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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


def ensure_output_folder(path: Path, quiet: bool = False, prog: str = "edsc-interpolate") -> List[Path]:
    """Creates the folders an output goes into where they are missing, and says so; returns those it
    created, the outermost first (:func:`remove_created_folders` takes them back)."""
    parent = Path(path).parent
    if parent.is_dir():
        return []
    if parent.exists():
        raise UserError(f"-o {path}: {parent} is not a folder")
    missing = []
    folder = parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        parent.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"-o {path}: cannot create the folder {parent}: {e.strerror or e}") from None
    note(f"{prog}: created the folder {parent}", quiet)
    return missing[::-1]


def remove_created_folders(created: List[Path]) -> None:
    """Removes the folders :func:`ensure_output_folder` created (innermost first), where they are
    still empty: a run that failed or was interrupted leaves nothing behind."""
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()
