"""``simgpu <verb> ...``: one command for every ``python -m simgpu.<verb>``.

``simgpu run workload.yaml`` is ``python -m simgpu.run workload.yaml``, and so on for each verb of
:data:`COMMANDS`; ``simgpu`` alone or ``simgpu --help`` lists them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

from .cli import UsageError, entry, run_command, usage_message

#: verb -> (module with ``main(argv) -> int``, what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("simgpu.run", "simulate one training iteration of a workload YAML"),
    "serve": ("simgpu.serve", "simulate LLM serving at the request level (TTFT, TPOT, goodput)"),
    "whatif": ("simgpu.whatif", "simulate the variants of a study and compare them"),
    "goodput": ("simgpu.goodput", "goodput of a training run under failures: best checkpoint interval"),
    "cluster": ("simgpu.cluster", "several jobs sharing one cluster: each one's slowdown from its neighbours"),
    "search": ("simgpu.search", "find the fastest sharding plan or parallel configuration"),
    "comm": ("simgpu.comm", "an nccl-tests view of the simulated collectives"),
    "calibrate": ("simgpu.comm.calibrate", "fit a platform's link figures to your nccl-tests output"),
    "replay": ("simgpu.replay", "replay PyTorch profiler traces, or ask what-if of them"),
    "fit": ("simgpu.fit", "fit a platform's kernel models from its microbenchmarks"),
    "bench": ("simgpu.bench", "measure torch ops over a sweep of shapes (microbenchmarks)"),
    "validate": ("simgpu.validate", "compare predictions with real measurements in ../shared/data"),
    "speed": ("simgpu.speed", "measure the simulator's own speed and memory"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: simgpu <command> [options]   (simgpu <command> -h for its options)", "", "commands:"]
    lines += [f"  {verb:<{width}}  {what}" for verb, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if args[0] not in COMMANDS:
        print(f"error: unknown command {args[0]!r}; expected one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[args[0]][0])
    if not hasattr(module, "main"):  # a package whose command is its __main__
        module = importlib.import_module(COMMANDS[args[0]][0] + ".__main__")
    with _one_line_usage_errors():
        return run_command(lambda: int(module.main(args[1:])))


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """Commands built on a plain :class:`argparse.ArgumentParser` (``fit``, ``bench``) report a bad
    argument in one line here too, as :class:`~simgpu.cli.ArgParser` does."""
    original = argparse.ArgumentParser.error

    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        raise UsageError(usage_message(message, self.prog))

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def console() -> None:
    """The ``simgpu`` console script."""
    entry(main)


if __name__ == "__main__":
    entry(main)
