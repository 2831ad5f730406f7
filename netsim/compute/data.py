"""Datasets and their partition over agents. Never downloads: files come from the user or $NETSIM_DATA."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import numpy as np

from netsim.errors import InputError
from netsim.scenario.schema import DataSpec


@attrs.frozen
class Dataset:
    """Dense float features, integer labels in [0, classes); ``parts[i]`` = agent i's training rows."""

    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    parts: tuple[np.ndarray, ...]
    classes: int

    @property
    def features(self) -> int:
        return self.X.shape[1]


def find_data_file(path: str, key: str) -> Path:
    """``path`` as given, else under $NETSIM_DATA; InputError naming both places when missing."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    root = os.environ.get("NETSIM_DATA")
    if root and not p.is_absolute() and (Path(root) / p).is_file():
        return Path(root) / p
    where = f" or under NETSIM_DATA={root}" if root else " (set NETSIM_DATA to search a data folder)"
    raise InputError(key, f"data file {path!r} not found{where}")


def synthetic_logistic(spec: DataSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """x ~ N(0, I); y = 1[x.w* + noise * N(0, 1) > 0] with ||w*|| = 3 (separable up to the noise)."""
    w = rng.normal(size=spec.features)
    w *= 3.0 / np.linalg.norm(w)
    X = rng.normal(size=(spec.samples, spec.features))
    y = (X @ w + spec.noise * rng.normal(size=spec.samples) * 3.0 > 0).astype(np.int64)
    return X.astype(np.float32), y


def load_libsvm(path: Path, key: str, n_features: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_svmlight_file

    try:
        X, y = load_svmlight_file(str(path), n_features=n_features, dtype=np.float32)
    except (ValueError, OSError) as e:
        raise InputError(key, f"{path}: not a LIBSVM file: {e}") from None
    return np.asarray(X.todense(), dtype=np.float32), y


def _labels(y: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Map raw labels onto 0..k-1 in sorted order ({-1, 1} -> {0, 1}; mushrooms {1, 2} -> {0, 1})."""
    return np.searchsorted(values, y).astype(np.int64)


def partition(y: np.ndarray, n_agents: int, kind: str, alpha: float, rng: np.random.Generator) -> tuple:
    """IID: a random equal split. Dirichlet(alpha): each class's rows split by Dir(alpha) proportions.

    Every agent gets at least one row: an empty agent takes one from the largest part.
    """
    if len(y) < n_agents:
        raise InputError("data.samples", f"{len(y)} training rows cannot be split over {n_agents} agents")
    if kind == "iid":
        return tuple(np.sort(p) for p in np.array_split(rng.permutation(len(y)), n_agents))
    parts: list[list[int]] = [[] for _ in range(n_agents)]
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        cuts = (np.cumsum(rng.dirichlet(np.full(n_agents, alpha)))[:-1] * len(rows)).astype(int)
        for i, chunk in enumerate(np.split(rows, cuts)):
            parts[i].extend(chunk.tolist())
    for i in range(n_agents):
        if not parts[i]:
            donor = max(range(n_agents), key=lambda j: len(parts[j]))
            parts[i].append(parts[donor].pop())
    return tuple(np.sort(np.array(p, dtype=np.int64)) for p in parts)


def load_dataset(spec: DataSpec, n_agents: int, rng: np.random.Generator,
                 part_rng: np.random.Generator) -> Dataset:
    if spec.kind == "synthetic":
        X, y_raw = synthetic_logistic(spec, rng)
        X_test = y_test_raw = None
    else:
        X, y_raw = load_libsvm(find_data_file(spec.path, "data.path"), "data.path")  # type: ignore[arg-type]
        X_test = y_test_raw = None
        if spec.test_path:
            X_test, y_test_raw = load_libsvm(find_data_file(spec.test_path, "data.test_path"),
                                             "data.test_path", n_features=X.shape[1])
    if X_test is None:
        order = rng.permutation(len(X))
        n_test = max(1, int(round(spec.test_fraction * len(X))))
        test, train = order[:n_test], order[n_test:]
        X, X_test, y_raw, y_test_raw = X[train], X[test], y_raw[train], y_raw[test]
    values = np.unique(np.concatenate([y_raw, y_test_raw]))
    y, y_test = _labels(y_raw, values), _labels(y_test_raw, values)
    parts = partition(y, n_agents, spec.partition, spec.alpha, part_rng)
    return Dataset(X, y, X_test, y_test, parts, len(values))
