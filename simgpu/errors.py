"""Errors that reach users: one message naming the file, the key and what was expected."""

from __future__ import annotations


class SimgpuError(Exception):
    """Base of the errors the command line reports without a traceback."""


class ConfigError(SimgpuError):
    """A bad input: ``file`` and ``key`` (a dotted path) say where, ``message`` what was expected."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None) -> None:
        self.file, self.key, self.line, self.message = file, key, line, message
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        super().__init__(f"{where}{key + ': ' if key else ''}{message}")


class SimulationError(SimgpuError):
    """The simulation could not complete (for example a collective that some member never reaches)."""


class Interrupted(SimgpuError):
    """A command stopped by Ctrl-C; the message says what was kept and how to resume."""
