"""Request sources: arrival times and prompt / output token counts, drawn from the run's seed.

``poisson`` draws exponential gaps at ``rate_per_s``; ``fixed`` puts every request at time 0 (an
offline throughput run); ``closed_loop`` leaves arrivals to the serving loop (each is sent when a
client's previous request finishes, see :func:`~simgpu.serve.loop.simulate_serving`); ``trace``
reads a CSV of ``TIMESTAMP, ContextTokens, GeneratedTokens`` (Azure's LLM inference traces),
arrivals relative to its first row, optionally rescaled to a mean rate. All give a
:class:`Requests`: three arrays sorted by arrival.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .spec import LengthSpec, RequestsSpec

TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class Requests:
    """``arrival_s`` (sorted), ``prompt`` and ``output`` tokens per request (``output`` >= 1)."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)

    def rescaled(self, rate_per_s: float) -> Requests:
        """The same requests with arrivals stretched or squeezed to a mean rate of ``rate_per_s``."""
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0
        if span <= 0:
            return self
        now = (len(self) - 1) / span
        return Requests((self.arrival_s - self.arrival_s[0]) * (now / rate_per_s), self.prompt, self.output)


def draw_counts(spec: int | LengthSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` counts (tokens, or a DLRM query's samples): ``spec`` itself, or drawn from its distribution."""
    if isinstance(spec, int):
        return np.full(n, max(spec, 1), dtype=np.int64)
    if spec.dist == "fixed":
        x = np.full(n, spec.mean)
    elif spec.dist == "uniform":  # uniform on [min, 2 * mean - min]
        x = rng.uniform(spec.min, max(2 * spec.mean - spec.min, spec.min), n)
    else:  # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
        x = rng.lognormal(np.log(spec.mean) - spec.sigma ** 2 / 2, spec.sigma, n)
    return np.clip(np.rint(x), spec.min, spec.max).astype(np.int64)


def read_trace(path: Path, key: str = "requests.file", skip: int = 0, count: int | None = None) -> Requests:
    """The requests of a trace CSV (arrival times relative to its first row)."""
    try:
        df = pd.read_csv(path, skiprows=range(1, skip + 1) if skip else None,
                         nrows=count)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ConfigError(f"cannot read the trace ({' '.join(str(e).split())[:120]}); expected a CSV with columns "
                          f"{', '.join(TRACE_COLUMNS)}", file=str(path), key=key) from None
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"trace lacks columns {', '.join(missing)}; expected {', '.join(TRACE_COLUMNS)}",
                          file=str(path), key=key)
    if df.empty:
        raise ConfigError("trace has no rows; expected at least one request", file=str(path), key=key)
    with warnings.catch_warnings():  # pandas warns of timestamps it cannot parse; they are refused below
        warnings.simplefilter("ignore")
        t = pd.to_datetime(df["TIMESTAMP"], errors="coerce")
        if t.isna().any():  # the format inferred from the first row: read the others one by one
            t = t.fillna(pd.to_datetime(df["TIMESTAMP"][t.isna()], errors="coerce", format="mixed"))
    prompt = pd.to_numeric(df["ContextTokens"], errors="coerce")
    output = pd.to_numeric(df["GeneratedTokens"], errors="coerce")
    for column, bad, what in (("TIMESTAMP", t.isna(), "a date and time"),
                              ("ContextTokens", prompt.isna() | ~(prompt >= 1), "a token count >= 1"),
                              ("GeneratedTokens", output.isna() | ~(output >= 1),
                               "a token count >= 1 (a request is served for at least one output token)")):
        if bad.any():
            at = int(np.flatnonzero(bad.to_numpy())[0])
            raise ConfigError(f"row {at + 2 + skip}: {column} {str(df[column].iloc[at])[:40]!r} is not a request's; "
                              f"expected {what}",
                              file=str(path), key=key)
    secs = (t - t.iloc[0]).dt.total_seconds().to_numpy()
    order = np.argsort(secs, kind="stable")
    return Requests(secs[order] - secs[order][0], prompt.to_numpy(np.int64)[order],
                    output.to_numpy(np.int64)[order])


def make_requests(spec: RequestsSpec, seed: int, trace: Path | Requests | None = None,
                  rate_per_s: float | None = None) -> Requests:
    """The requests of ``spec`` (``rate_per_s`` replaces the spec's rate, for a sweep); ``trace``: the
    trace's path, or its requests already read (:func:`read_trace` with the spec's skip and count)."""
    rng = np.random.default_rng(seed)
    rate = rate_per_s if rate_per_s is not None else spec.rate_per_s
    if spec.kind == "trace":
        if trace is None:
            raise ConfigError("a trace needs file; expected the path of a CSV trace", key="requests.file")
        reqs = trace if isinstance(trace, Requests) else read_trace(trace, skip=spec.skip, count=spec.count)
        return reqs.rescaled(rate) if rate else reqs
    n = int(spec.count or 0)
    assert spec.prompt_tokens is not None and spec.output_tokens is not None  # checked by the spec
    prompt = draw_counts(spec.prompt_tokens, n, rng)
    output = draw_counts(spec.output_tokens, n, rng)
    if spec.kind in ("fixed", "closed_loop"):  # a closed loop's arrivals are set as it runs
        arrival = np.zeros(n)
    else:
        assert rate is not None
        arrival = np.cumsum(rng.exponential(1.0 / rate, n))
        arrival -= arrival[0]
    return Requests(arrival, prompt, output)
