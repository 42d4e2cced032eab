"""A property over every kind of input file (workload, platform, serving, study): a file changed at a
random existing key path is either read or refused with one ConfigError line, never another error;
and the changes that must be refused (a key no model has, text where a number was, a number where a
section was) always are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simgpu.config.loader import load_job, load_platform
from simgpu.errors import ConfigError
from simgpu.serve.spec import load_serving
from simgpu.whatif.study import load_study

LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"


def _serving() -> dict[str, Any]:
    return {"name": "t", "deployment": {"workload": str(LLAMA)},
            "requests": {"kind": "fixed", "count": 20, "prompt_tokens": 200, "output_tokens": 20},
            "slo": {"ttft_ms": 2000, "tpot_ms": 200}}


def _study() -> dict[str, Any]:
    return {"name": "s", "base": str(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"), "set": {"model.layers": 2},
            "grid": {"nodes": [1, 2]}}


KINDS: dict[str, tuple[dict[str, Any], Any]] = {
    "workload": (yaml.safe_load((ROOT / "workloads" / "gpt_2x_dgx_h100.yaml").read_text()), load_job),
    "dlrm": (yaml.safe_load((ROOT / "workloads" / "dlrm_2x_dgx_a100.yaml").read_text()), load_job),
    "platform": (yaml.safe_load((ROOT / "platforms" / "dgx_h100.yaml").read_text()), load_platform),
    "serving": (_serving(), load_serving),
    "study": (_study(), load_study),
}
#: Mappings whose keys are free (overrides, a grid, per-dtype figures): an unknown key there may be right.
FREE = {"set", "grid", "peak_tflops", "generate"}


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    out: list[tuple[tuple[Any, ...], Any]] = [(prefix, data)]
    if isinstance(data, dict) and not (prefix and prefix[-1] in FREE):
        for k, v in data.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, (*prefix, i))
    return out


def _set(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


def _load(kind: str, data: dict[str, Any], folder: Path) -> None:
    path = folder / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    KINDS[kind][1](str(path))


def _one_line(e: ConfigError) -> str:
    text = str(e)
    assert "\n" not in text.strip() and "Traceback" not in text
    return text


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                      st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.sampled_from("abc"), st.integers()))
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("kind", list(KINDS))
@SETTINGS
@given(data=st.data())
def test_an_unknown_key_is_refused_in_one_line(kind: str, data: st.DataObject, tmp_path: Path) -> None:
    doc, _ = KINDS[kind]
    doc = yaml.safe_load(yaml.safe_dump(doc))
    maps = [p for p, v in _paths(doc) if isinstance(v, dict) and not (p and p[-1] in FREE)]
    where = data.draw(st.sampled_from(maps))
    key = data.draw(st.text("qxzjkw_", min_size=3, max_size=10))
    _set(doc, (*where, key), 1) if where else doc.__setitem__(key, 1)
    with pytest.raises(ConfigError) as e:
        _load(kind, doc, tmp_path)
    assert key in _one_line(e.value) and "expected" in str(e.value)


@pytest.mark.parametrize("kind", list(KINDS))
@SETTINGS
@given(data=st.data())
def test_text_where_a_number_was_is_refused_in_one_line(kind: str, data: st.DataObject, tmp_path: Path) -> None:
    doc, _ = KINDS[kind]
    doc = yaml.safe_load(yaml.safe_dump(doc))
    numbers = [p for p, v in _paths(doc) if isinstance(v, int | float) and not isinstance(v, bool) and p
               and not any(isinstance(x, str) and x in FREE for x in p)]
    if not numbers:
        return
    where = data.draw(st.sampled_from(numbers))
    _set(doc, where, data.draw(st.text("abcdefgh", min_size=1, max_size=6)))
    with pytest.raises(ConfigError) as e:
        _load(kind, doc, tmp_path)
    _one_line(e.value)


@pytest.mark.parametrize("kind", list(KINDS))
@SETTINGS
@given(data=st.data())
def test_any_value_anywhere_is_read_or_refused_in_one_line(kind: str, data: st.DataObject, tmp_path: Path) -> None:
    """Wrong types, negative and huge numbers at random existing key paths: a ConfigError of one line
    or a file that loads, never another exception."""
    doc, _ = KINDS[kind]
    doc = yaml.safe_load(yaml.safe_dump(doc))
    where = data.draw(st.sampled_from([p for p, _ in _paths(doc) if p]))
    _set(doc, where, data.draw(ANY_VALUE))
    try:
        _load(kind, doc, tmp_path)
    except ConfigError as e:
        _one_line(e)
