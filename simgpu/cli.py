"""What every command shares: argument parsing that fails in one line, the error contract, output checks.

Every command is ``main(argv=None) -> int``. Bad input (a :class:`~simgpu.errors.SimgpuError`, or a
bad command-line argument) prints one line ``error: ...`` on stderr and returns 2; Ctrl-C returns
130; a closed stdout (``| head``) ends quietly. Output paths are checked before any work is done,
so a run that cannot write its results fails at once and leaves nothing behind. A name from an
input file (a workload's or a study's) becomes a folder name only through :func:`safe_name`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .errors import ConfigError, Interrupted, SimgpuError

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130


class UsageError(ConfigError):
    """A bad command-line argument."""


class ArgParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one-line :class:`UsageError` s."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(usage_message(message, self.prog))


def usage_message(message: str, prog: str) -> str:
    """argparse's message on one line, saying what was expected where argparse does not."""
    text = " ".join(message.split())
    m = re.fullmatch(r"argument (\S+): invalid (int|float) value: (.*)", text)
    if m:
        kind = "an integer" if m.group(2) == "int" else "a number"
        return f"argument {m.group(1)}: expected {kind}, got {m.group(3)}"
    if text.startswith("unrecognized arguments:"):
        return f"{text}; expected the options listed by {prog} -h"
    if text.startswith("the following arguments are required:") or text.startswith("one of the arguments"):
        return f"{text} (expected as {prog} -h shows)"
    return text


def one_line(error: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(error).split())


def run_command(body: Callable[[], int]) -> int:
    """Run a command's body under the error contract (see the module docstring)."""
    try:
        return body()
    except Interrupted as e:
        print(one_line(e), file=sys.stderr)
        return INTERRUPTED
    except SimgpuError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else 0


def shadowed() -> str | None:
    """One line saying that a folder named ``simgpu`` in the working folder (a checkout, run from its
    parent) stands in for the package, or None. Python imports such a folder as a namespace package
    before the installed one; where the command still starts, the line says which code ran."""
    pkg = sys.modules.get("simgpu")
    if pkg is None or getattr(pkg, "__file__", None):
        return None
    here = Path(__file__).resolve().parent
    where = ", ".join(str(p) for p in getattr(pkg, "__path__", []))
    return (f"note: the folder {where} (a checkout named simgpu?) shadows the simgpu package, which ran from "
            f"{here}; run simgpu from another folder")


def entry(main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())`` for ``python -m``, quiet when stdout is closed early (``| head``)."""
    note = shadowed()
    if note:
        print(note, file=sys.stderr)
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 1
    except KeyboardInterrupt:
        code = INTERRUPTED
    sys.exit(code)


# --------------------------------------------------------------------------- argument types


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def int_list(low: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: a comma list of integers >= ``low`` (``1,2,4``)."""
    one = int_at_least(low)

    def parse(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected a comma list of integers >= {low}, got {text!r}")
        try:
            return [one(x) for x in items]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected a comma list of integers >= {low}, got {text!r}") from None
    parse.__name__ = "integer list"
    return parse


def choice_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a comma list of some of ``choices``."""
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",")]
        bad = [x for x in items if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(choices)}, got {text!r}")
        return items
    parse.__name__ = "choice list"
    return parse


# --------------------------------------------------------------------------- output paths

_UNSAFE = re.compile(r"[^A-Za-z0-9._=+,-]+")


def safe_name(name: str, limit: int = 80) -> str:
    """``name`` as one folder name: no separators, no leading dots, at most ``limit`` characters
    (a long name keeps its start and gets a short hash of the whole)."""
    import hashlib

    s = _UNSAFE.sub("_", name).strip("._") or "run"
    if len(s) > limit:
        s = s[: limit - 9].rstrip("._") + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return s


def _nearest_existing(path: Path) -> Path:
    cur = path.absolute()
    while not cur.exists() and cur != cur.parent:
        cur = cur.parent
    return cur


def _probe(folder: Path, make_folder: bool) -> str | None:
    """Why nothing can be written into ``folder`` (None when it can): a file or folder is made there and
    removed at once, so permissions, read-only file systems and pseudo file systems (/proc) all tell."""
    import shutil
    import tempfile

    try:
        if make_folder:
            shutil.rmtree(tempfile.mkdtemp(prefix=".simgpu-probe-", dir=folder))
        else:
            fd, name = tempfile.mkstemp(prefix=".simgpu-probe-", dir=folder)
            os.close(fd)
            os.unlink(name)
    except OSError as e:
        return e.strerror or str(e)
    return None


def out_dir(given: str | Path | None, name: str) -> Path:
    """The output folder: ``given`` (``--out``), else ``out/<name>``; checked before anything is written."""
    return check_out_dir(Path(given) if given else Path("out") / safe_name(name))


def check_out_dir(path: str | Path, option: str = "--out") -> Path:
    """``path`` as an output folder that can be created or written; raises before anything is written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{p} is a file; expected a folder to write the outputs into", key=option)
    base = _nearest_existing(p)
    if not base.is_dir():
        raise UsageError(f"{p}: {base} is a file; expected a folder to write the outputs into", key=option)
    why = None if os.access(base, os.W_OK | os.X_OK) else "permission denied"
    why = why or _probe(base, make_folder=base != p.absolute())
    if why:
        raise UsageError(f"{p}: cannot write into {base} ({why}); expected a writable folder", key=option)
    return p


def check_out_file(path: str | Path, option: str) -> Path:
    """``path`` as an output file that can be written; raises before anything is written."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{p} is a folder; expected a file name to write", key=option)
    parent = p.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{p}: folder {parent} does not exist; expected a file in an existing folder", key=option)
    why = None if os.access(parent, os.W_OK | os.X_OK) else "permission denied"
    if p.exists() and not os.access(p, os.W_OK):
        why = "permission denied"
    why = why or _probe(parent, make_folder=False)
    if why:
        raise UsageError(f"{p}: not writable ({why}); expected a file that can be written", key=option)
    return p


def check_input_file(path: str | Path, what: str) -> Path:
    """``path`` as an existing file to read (a folder or a missing path is a ConfigError naming it)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"is a folder; expected a {what} file", file=str(p))
    if not p.is_file():
        raise ConfigError(f"{what} file not found; expected the path of an existing {what} file", file=str(p))
    return p


# --------------------------------------------------------------------------- progress


class Progress:
    """A one-line progress display on stderr, shown only on a terminal and only once the command
    has run for ``after_s`` seconds; elsewhere (logs, pipes, tests) it prints nothing."""

    def __init__(self, after_s: float = 2.0, stream: Any = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.after_s, self.t0, self.stage, self.shown = after_s, time.perf_counter(), "", False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def set(self, stage: str) -> None:
        self.stage = stage

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            elapsed = time.perf_counter() - self.t0
            if elapsed >= self.after_s and self.stage:
                self.stream.write(f"\r\033[K[{elapsed:5.0f} s] {self.stage}")
                self.stream.flush()
                self.shown = True
