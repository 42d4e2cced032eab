"""A fitted LightGBM model's trees as flat numpy arrays, evaluated without LightGBM.

Prediction needs only the trees' splits and leaf values: reading them from LightGBM's text model
format and walking every tree for every kernel at once with numpy costs a few milliseconds, where
importing LightGBM and parsing the model with it costs a tenth of a second a run (more than a small
simulation takes). LightGBM is needed to fit models, not to use them. Numerical splits only (simgpu's
features are all numerical): a value goes left where ``value <= threshold``; a missing value (NaN)
is taken as 0 unless the split sends missing values one way (LightGBM's ``decision_type`` bits), and
a split that treats zero as missing sends values within 1e-35 of it that way, as LightGBM does.
``tests/test_kernels_trees.py`` checks the predictions against LightGBM's own.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

_ZERO: float = 1e-35  # LightGBM's kZeroThreshold
_DEFAULT_LEFT, _MISSING_ZERO, _MISSING_NAN = 2, 1, 2


def _floats(text: str) -> np.ndarray:
    """A line of space-separated numbers (integers up to 2^53 are exact)."""
    return np.array(text.split(" "), dtype=float) if "inf" in text else np.fromstring(text, dtype=float, sep=" ")


class TreeEnsemble:
    """The sum of a model's trees; ``predict(x)`` as LightGBM's raw prediction."""

    def __init__(self, feature: np.ndarray, threshold: np.ndarray, left: np.ndarray, right: np.ndarray,
                 default_left: np.ndarray, missing: np.ndarray, roots: np.ndarray, leaf_value: np.ndarray) -> None:
        # children >= 0 are node indices, < 0 are leaves: leaf ``-child - 1`` of ``leaf_value``
        self.feature, self.threshold, self.left, self.right = feature, threshold, left, right
        self.default_left, self.missing, self.roots, self.leaf_value = default_left, missing, roots, leaf_value

    @classmethod
    def from_text(cls, text: str) -> TreeEnsemble:
        """Parse LightGBM's text model format (``Booster.model_to_string()``)."""
        feats: list[np.ndarray] = []
        thrs: list[np.ndarray] = []
        lefts: list[np.ndarray] = []
        rights: list[np.ndarray] = []
        dts: list[np.ndarray] = []
        leaves: list[np.ndarray] = []
        roots: list[int] = []
        n_nodes = n_leaves = 0
        tree: dict[str, str] = {}

        def close() -> None:
            nonlocal n_nodes, n_leaves
            if not tree:
                return
            lv = _floats(tree["leaf_value"])
            if int(tree["num_leaves"]) == 1:
                roots.append(-(n_leaves + 1))
            else:
                f = _floats(tree["split_feature"]).astype(np.int64)
                if int(tree.get("num_cat", "0")):
                    raise ValueError("categorical splits are not supported")
                ch = [_floats(tree[k]).astype(np.int64) for k in ("left_child", "right_child")]
                feats.append(f)
                thrs.append(_floats(tree["threshold"]))
                dts.append(_floats(tree["decision_type"]).astype(np.int64))
                for c, out in zip(ch, (lefts, rights), strict=True):
                    out.append(np.where(c >= 0, c + n_nodes, -(~c + n_leaves) - 1))
                roots.append(n_nodes)
                n_nodes += len(f)
            leaves.append(lv)
            n_leaves += len(lv)
            tree.clear()

        in_tree = False
        for line in text.splitlines():
            if line.startswith("Tree="):
                close()
                in_tree = True
            elif line.startswith("end of trees"):
                break
            elif in_tree and "=" in line:
                key, _, value = line.partition("=")
                tree[key] = value
        close()
        if not leaves:
            raise ValueError("no trees in the model text")

        def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

        dt = cat(dts, np.int64)
        return cls(cat(feats, np.int64), cat(thrs, float), cat(lefts, np.int64), cat(rights, np.int64),
                   (dt & _DEFAULT_LEFT) > 0, (dt >> 2) & 3, np.asarray(roots, dtype=np.int64), np.concatenate(leaves))

    _FIELDS = ("feature", "threshold", "left", "right", "default_left", "missing", "roots", "leaf_value")

    def save(self, path: Path) -> None:
        """The arrays in a pickle of plain numpy arrays (written whole: to a temporary name, then
        renamed); a cache of this process's own, read back by :meth:`load` in a millisecond."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            pickle.dump({k: np.ascontiguousarray(getattr(self, k)) for k in self._FIELDS}, f,
                        protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> TreeEnsemble:
        with path.open("rb") as f:
            d = pickle.load(f)
        if not isinstance(d, dict) or set(d) != set(cls._FIELDS):
            raise ValueError(f"{path}: not a cached tree ensemble")
        return cls(*(np.asarray(d[k]) for k in cls._FIELDS))

    def predict(self, x: Any, num_threads: int = 1) -> np.ndarray:
        """The sum of the trees' leaf values for each row of ``x`` (features in the model's order).

        Every (row, tree) pair walks down at once; pairs that reach a leaf drop out, so the arrays
        shrink with depth. A model whose splits have no missing-value handling (the usual case:
        LightGBM's missing type None) takes NaN as 0 once, up front, and compares only."""
        x = np.asarray(x, dtype=float)
        n, trees = x.shape[0], len(self.roots)
        cur = np.tile(self.roots, n)                     # (row, tree) pairs, row-major
        plain = not self.missing.any()
        if plain:
            x = np.where(np.isnan(x), 0.0, x)
        pos = np.flatnonzero(cur >= 0)
        rows, node = pos // trees, cur[pos]
        while pos.size:
            v = x[rows, self.feature[node]]
            if plain:
                go_left = v <= self.threshold[node]
            else:
                miss = self.missing[node]
                nan = np.isnan(v)
                v0 = np.where(nan, 0.0, v)
                as_missing = ((miss == _MISSING_NAN) & nan) | ((miss == _MISSING_ZERO) & (np.abs(v0) <= _ZERO))
                go_left = np.where(as_missing, self.default_left[node], v0 <= self.threshold[node])
            nxt = np.where(go_left, self.left[node], self.right[node])
            leaf = nxt < 0
            cur[pos[leaf]] = nxt[leaf]
            keep = ~leaf
            pos, rows, node = pos[keep], rows[keep], nxt[keep]
        return self.leaf_value[-cur - 1].reshape(n, trees).sum(axis=1)
