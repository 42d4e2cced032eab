"""The numpy tree evaluator gives LightGBM's own predictions, on every shipped model file."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import ROOT

from simgpu.kernels.trees import TreeEnsemble

MODELS = sorted((ROOT / "platforms").glob("*/models/*.txt.gz"))


@pytest.mark.parametrize("path", MODELS, ids=[f"{p.parent.parent.name}/{p.name}" for p in MODELS])
def test_same_predictions_as_lightgbm(path):
    import lightgbm as lgb

    text = gzip.decompress(path.read_bytes()).decode()
    booster = lgb.Booster(model_str=text)
    features = json.loads((path.parent / "manifest.json").read_text())["families"][path.name.split(".")[0]]["features"]
    rng = np.random.default_rng(0)
    # rows spread over each feature's range, with exact zeros and a few missing values
    x = rng.uniform(-2, 24, size=(400, len(features)))
    x[rng.random(x.shape) < 0.1] = 0.0
    x[rng.random(x.shape) < 0.01] = np.nan
    want = booster.predict(x, num_threads=1)
    got = TreeEnsemble.from_text(text).predict(x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_single_leaf_and_bad_text():
    with pytest.raises(ValueError):
        TreeEnsemble.from_text("tree\nversion=v4\n")
