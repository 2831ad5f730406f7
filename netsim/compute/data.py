"""Datasets and their partition over agents. Never downloads: files come from the user or $NETSIM_DATA."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from netsim.errors import InputError, claim, unknown_name
from netsim.scenario.schema import DATASETS as BUILTIN_DATASETS
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
    shape: tuple[int, ...] | None = None  # (channels, height, width) of image data; X holds it flat
    X_val: np.ndarray | None = None  # the validation set Q (data.validation), disjoint from the test rows
    y_val: np.ndarray | None = None
    groups: np.ndarray | None = None  # each training row's group (data.group, a loader's groups), else None

    @property
    def features(self) -> int:
        return self.X.shape[1]


def _find(path: str, key: str, is_kind, noun: str) -> Path:
    p = Path(path).expanduser()
    if is_kind(p):
        return p
    root = os.environ.get("NETSIM_DATA")
    if root and not p.is_absolute() and is_kind(Path(root) / p):
        return Path(root) / p
    where = f" or under NETSIM_DATA={root}" if root else " (set NETSIM_DATA to search a data folder)"
    raise InputError(key, f"data {noun} {path!r} not found{where}")


def find_data_file(path: str, key: str) -> Path:
    """``path`` as given, else under $NETSIM_DATA; InputError naming both places when missing."""
    return _find(path, key, Path.is_file, "file")


def find_data_dir(path: str, key: str) -> Path:
    """A folder ``path`` as given, else under $NETSIM_DATA; InputError naming both places when missing."""
    return _find(path, key, Path.is_dir, "folder")


def read_idx(path: Path, key: str) -> np.ndarray:
    """An IDX file (LeCun's MNIST format, gzipped or not): magic 0x0000 type ndim, big-endian dims."""
    import gzip

    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise InputError(key, f"{path}: cannot read IDX file: {e}") from None
    types = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in types or raw[3] == 0:
        raise InputError(key, f"{path}: not an IDX file (bad magic number)")
    ndim, dt = raw[3], np.dtype(types[raw[2]])
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise InputError(key, f"{path}: truncated IDX header")
    dims = tuple(int(v) for v in np.frombuffer(raw, ">u4", ndim, 4))
    if len(raw) != head + int(np.prod(dims)) * dt.itemsize:
        raise InputError(key, f"{path}: IDX size does not match its dimensions {dims}")
    return np.frombuffer(raw, dt, offset=head).reshape(dims)


def _idx_file(folder: Path, name: str, key: str) -> Path:
    for cand in (folder / name, folder / (name + ".gz")):
        if cand.is_file():
            return cand
    raise InputError(key, f"{folder}: no {name} or {name}.gz (expected the MNIST IDX files)")


def load_mnist(folder: Path, key: str) -> tuple[np.ndarray, ...]:
    """MNIST from its four IDX files; pixels scaled to [0, 1], flat (n, 784)."""
    out = []
    for split in ("train", "t10k"):
        X = read_idx(_idx_file(folder, f"{split}-images-idx3-ubyte", key), key)
        y = read_idx(_idx_file(folder, f"{split}-labels-idx1-ubyte", key), key)
        if X.ndim != 3 or y.ndim != 1 or len(X) != len(y):
            raise InputError(key, f"{folder}: {split} images {X.shape} and labels {y.shape} do not match")
        out += [X.reshape(len(X), -1).astype(np.float32) / 255.0, y.astype(np.int64)]
    return tuple(out)


CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def read_cifar_bin(path: Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 *binary* batch: records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32).
    The python (pickle) version is never read."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise InputError(key, f"{path}: cannot read: {e}") from None
    if raw.size == 0 or raw.size % 3073:
        raise InputError(key, f"{path}: not a CIFAR-10 binary batch ({raw.size} bytes, not records of 3073)")
    rec = raw.reshape(-1, 3073)
    if rec[:, 0].max() > 9:
        raise InputError(key, f"{path}: label byte > 9: not a CIFAR-10 binary batch")
    return rec[:, 1:], rec[:, 0].astype(np.int64)


def load_cifar10(folder: Path, key: str) -> tuple[np.ndarray, ...]:
    """CIFAR-10 binary version: data_batch_1..5.bin and test_batch.bin; per-channel standardised, flat."""
    def norm(X):
        X = X.reshape(-1, 3, 1024).astype(np.float32) / 255.0
        return ((X - CIFAR_MEAN[:, None]) / CIFAR_STD[:, None]).reshape(len(X), -1)

    train = [f for f in (folder / f"data_batch_{k}.bin" for k in range(1, 6)) if f.is_file()]
    test = folder / "test_batch.bin"
    if not train or not test.is_file():
        raise InputError(key, f"{folder}: needs data_batch_*.bin and test_batch.bin (CIFAR-10 binary)")
    parts = [read_cifar_bin(f, key) for f in train]
    X_test, y_test = read_cifar_bin(test, key)
    return (norm(np.concatenate([p[0] for p in parts])), np.concatenate([p[1] for p in parts]),
            norm(X_test), y_test)


def synthetic_logistic(spec: DataSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``generator = "threshold"``: x ~ N(0, I); y = 1[x.w* + 3 noise N(0, 1) > 0] with ||w*|| = 3
    (separable up to the noise)."""
    if spec.generator == "sign_linear":
        return sign_linear(spec.samples, spec.features, rng)
    w = rng.normal(size=spec.features)
    w *= 3.0 / np.linalg.norm(w)
    X = rng.normal(size=(spec.samples, spec.features))
    y = (X @ w + spec.noise * rng.normal(size=spec.samples) * 3.0 > 0).astype(np.int64)
    return float32_in_place(X), y


def float32_in_place(X: np.ndarray) -> np.ndarray:
    """``X.astype(np.float32)`` (the same cast, the same values) written into the front half of float64 ``X``'s own
    buffer, which is then shrunk: the two copies never coexist (10^6 agents' synthetic rows: 8 GB at most, not 12).
    An array that does not own its memory is copied as ``astype`` copies it."""
    if X.dtype != np.float64 or not X.flags.c_contiguous or not X.flags.owndata or X.size < 2:
        return X.astype(np.float32)
    shape, size = X.shape, X.size
    flat = X.reshape(-1)
    out = flat.view(np.float32)[:size]
    step = 1 << 20
    a = min(step, size)
    out[:a] = flat[:a]  # overlapping: numpy reads the source before it writes
    while a < size:  # out[a:b] (bytes 4a..4b) lies before flat[a:b] (8a..8b) whenever b <= 2a: no overlap
        b = min(a + min(a, step), size)
        out[a:b] = flat[a:b]
        a = b
    del flat, out
    X.resize((size + 1) // 2, refcheck=False)  # the float32 half stays; realloc gives the other half back
    return X.view(np.float32)[:size].reshape(shape)


def sign_linear(n: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``generator = "sign_linear"``: the synthetic logistic regression of Huo, Liu, Ding, Johansson and Shi,
    "Decentralized Optimization with Amplified Privacy via Efficient Communication" (Sec. VI): x* ~ N(0, I_d);
    rows a ~ N(0, I_d) scaled to unit L2 norm; b = sign(3 a.x* + 0.5 N(0, 1)) in {-1, 1}."""
    x_star = rng.normal(size=d)
    A = rng.normal(size=(n, d))
    A /= np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
    b = np.where(3.0 * (A @ x_star) + 0.5 * rng.normal(size=n) >= 0, 1, -1).astype(np.int64)
    return A.astype(np.float32), b


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


def partition(y: np.ndarray, n_agents: int, kind: str, alpha: float, rng: np.random.Generator,
              shards: int = 2, share: float = 0.4, classes: tuple | None = None,
              per_agent: int | None = None) -> tuple:
    """Agents' training rows (sorted index arrays).

    ``iid``: a random equal split. ``dirichlet_equal`` (Hsu, Qi and Brown 2019, "Measuring the effects
    of non-identical data distribution for federated visual classification"): agent i draws its class
    mix p_i ~ Dir(alpha 1_C) and gets ``per_agent`` (default floor(N / m)) rows drawn by label from p_i
    without replacement; a class that has run out is redrawn from the classes left. ``dirichlet_classes``:
    each class's rows split over the agents by Dir(alpha) proportions (unequal shard sizes).
    ``shards``: k label-sorted shards per agent. ``quantity``: IID rows, sizes in Dir(alpha)
    proportions. ``label``, ``label_share``, ``classes``, ``alternate``: fixed label splits
    (``_label_partition``).

    Every agent gets at least one row: in ``dirichlet_classes`` an empty agent takes one from the largest part.
    """
    if kind in ("groups", "file"):
        raise ValueError(f"partition {kind!r} is not drawn from labels (load_dataset reads groups or the file)")
    if len(y) < n_agents:
        raise InputError("data.samples", f"{len(y)} training rows cannot be split over {n_agents} agents")
    if kind == "iid":
        return tuple(np.sort(p) for p in np.array_split(rng.permutation(len(y)), n_agents))
    if kind == "dirichlet_equal":
        return _hsu_partition(y, n_agents, alpha, rng, per_agent)
    if kind == "quantity":  # IID labels, agent sizes in Dir(alpha) proportions (at least one row each)
        sizes = 1 + np.floor(rng.dirichlet(np.full(n_agents, alpha)) * (len(y) - n_agents)).astype(int)
        cuts = np.cumsum(sizes)[:-1]
        return tuple(np.sort(p) for p in np.split(rng.permutation(len(y))[:sizes.sum()], cuts))
    if kind == "shards":  # McMahan et al. 2017: sort by label, cut into n*k shards, k random shards each
        k = shards
        if len(y) < n_agents * k:
            raise InputError("data.shards", f"{len(y)} rows cannot make {n_agents} x {k} shards")
        order = np.argsort(y, kind="stable")
        pieces = np.array_split(order, n_agents * k)
        deal = rng.permutation(n_agents * k).reshape(n_agents, k)
        return tuple(np.sort(np.concatenate([pieces[s] for s in row])) for row in deal)
    if kind in ("label", "label_share", "classes", "alternate"):
        return _label_partition(y, n_agents, kind, rng, share, classes)
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


def _hsu_partition(y: np.ndarray, n_agents: int, alpha: float, rng: np.random.Generator,
                   per_agent: int | None) -> tuple:
    """Equal shards with Dir(alpha) class mixes. Each agent's labels are one multinomial draw from p_i;
    draws that fall on a class with no rows left are drawn again from p_i restricted to the classes
    that still have rows (the same law as redrawing each such label), until the shard is full."""
    C = int(y.max()) + 1
    size = per_agent if per_agent is not None else len(y) // n_agents
    if size * n_agents > len(y):
        raise InputError("data.per_agent", f"{n_agents} equal shards of {size} rows need {size * n_agents} "
                                           f"training rows; the data has {len(y)}")
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(C)]
    used = np.zeros(C, dtype=np.int64)
    out = []
    for _ in range(n_agents):
        p = rng.dirichlet(np.full(C, alpha))
        take = np.zeros(C, dtype=np.int64)
        need = size
        while need:
            left = np.array([len(pools[c]) for c in range(C)]) - used - take
            q = np.where(left > 0, p, 0.0)
            if q.sum() <= 0:  # p_i is zero on every class left (tiny alpha): uniform over the classes left
                q = (left > 0).astype(float)
            got = np.minimum(rng.multinomial(need, q / q.sum()), left)
            take += got
            need -= int(got.sum())
        out.append(np.sort(np.concatenate([pools[c][used[c]:used[c] + take[c]] for c in range(C)])))
        used += take
    return tuple(o.astype(np.int64) for o in out)


def _label_partition(y: np.ndarray, n_agents: int, kind: str, rng: np.random.Generator,
                     share: float, lists: tuple | None = None) -> tuple:
    """Fixed label splits (the label-skewed settings of Chen and Wang's LDP online learning experiments,
    and explicit ones). ``label``: contiguous blocks of agents own one class each, agent i holding class
    floor(i C / m) (m >= C; mushrooms, m = 5: agents 0-2 class 0, 3-4 class 1); with m < C agent i holds
    the classes c with floor(c m / C) = i. ``alternate``: agent i holds class i mod C (m >= C; agents 0, 2,
    4 class 0 and 1, 3 class 1 for two classes); with m < C agent i holds the classes c with c mod m = i.
    ``classes``: agent i holds the classes listed in ``lists[i]``. A class is split evenly over the
    agents holding it. ``label_share``: agent c mod m gets ``share`` of class c, the other agents equal
    parts of the rest (MNIST/CIFAR, 5 learners: 40% / 15%)."""
    classes = np.unique(y)
    C = len(classes)
    if kind == "classes":
        if len(lists) != n_agents:  # type: ignore[arg-type]
            raise InputError("data.classes", f"needs one class list per agent ({n_agents}), got {len(lists)}")
        bad = sorted({c for row in lists for c in row if c >= C})  # type: ignore[union-attr]
        if bad:
            raise InputError("data.classes", f"class indices must be in [0, {C - 1}] (the data has {C} "
                                             f"classes), got {bad}")
    parts: list[list[int]] = [[] for _ in range(n_agents)]
    for ci, c in enumerate(classes):
        rows = rng.permutation(np.flatnonzero(y == c))
        if kind != "label_share":
            if kind == "label":
                owners = ([i for i in range(n_agents) if i * C // n_agents == ci] if n_agents >= C
                          else [ci * n_agents // C])
            elif kind == "alternate":
                owners = [i for i in range(n_agents) if i % C == ci] if n_agents >= C else [ci % n_agents]
            else:
                owners = [i for i in range(n_agents) if ci in lists[i]]  # type: ignore[index]
            for i, chunk in zip(owners, np.array_split(rows, len(owners)) if owners else [], strict=True):
                parts[i].extend(chunk.tolist())
            continue
        home = ci % n_agents
        k = int(round(share * len(rows)))
        parts[home].extend(rows[:k].tolist())
        others = [i for i in range(n_agents) if i != home]
        for i, chunk in zip(others, np.array_split(rows[k:], len(others)), strict=True):
            parts[i].extend(chunk.tolist())
    empty = [i for i in range(n_agents) if not parts[i]]
    if empty:
        raise InputError("data.partition", f"{kind!r} leaves agents {empty} without rows "
                                           f"({C} classes over {n_agents} agents)")
    return tuple(np.sort(np.array(p, dtype=np.int64)) for p in parts)


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # of MNIST's training pixels in [0, 1] (the usual Normalize values)


def standardize(X: np.ndarray, X_test: np.ndarray, spec: DataSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature (x - mean) / std with the training split's statistics ('fit'), MNIST's ('mnist') or the
    given ones; a constant feature (std 0) is only centred."""
    if spec.standardize == "fit":
        mean = X.mean(0, dtype=np.float64)
        std = X.std(0, dtype=np.float64)
        std[std == 0] = 1.0
    elif spec.standardize == "mnist":
        mean, std = MNIST_MEAN, MNIST_STD
    else:
        mean, std = spec.mean, spec.std
    f = lambda A: ((A - mean) / std).astype(A.dtype)  # noqa: E731
    return f(X), f(X_test)


@attrs.frozen
class Rows:
    """What a dataset loader returns: training features ``X (n, d)`` and labels ``y (n,)`` (any values:
    mapped to 0..C-1 in sorted order), optionally a group per row (any values: writers, devices) for
    ``partition = "groups"``, its own test rows (otherwise ``test_fraction`` of the rows is held out) and,
    for images held flat, their ``(channels, height, width)``. A loader may also return ``(X, y)`` or
    ``(X, y, groups)``."""

    X: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None = None
    X_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    shape: tuple[int, ...] | None = None


@attrs.frozen
class DataSource:
    """Where a dataset loader reads from: the scenario's ``[data]`` table (``spec.path`` is already resolved
    beside the scenario file when it is there), the data folder ``$NETSIM_DATA`` (``root``, None when unset)
    and the ``data`` random stream (for generated data; every loader draw moves the test split after it)."""

    spec: DataSpec
    rng: np.random.Generator

    @property
    def root(self) -> Path | None:
        root = os.environ.get("NETSIM_DATA")
        return Path(root) if root else None

    def file(self, path: str | None = None, key: str = "data.path") -> Path:
        """A file: ``path`` (default ``data.path``) as given, else under the data folder; one-line error."""
        path = path or self.spec.path
        if not path:
            raise InputError(key, f"required for kind = {self.spec.kind!r}")
        return find_data_file(path, key)

    def folder(self, path: str | None = None, key: str = "data.path") -> Path:
        """A folder, found the same way."""
        path = path or self.spec.path
        if not path:
            raise InputError(key, f"required for kind = {self.spec.kind!r}")
        return find_data_dir(path, key)


DatasetLoader = Callable[[Any, DataSource], "Rows | tuple"]
DATASETS: dict[str, DatasetLoader] = {}
DATASET_PARAMS: dict[str, type | None] = {}


def register_dataset(name: str, loader: DatasetLoader, params: type | None = None) -> DatasetLoader:
    """Make ``data.kind = name`` read its rows with ``loader(args, source)``: ``args`` is the ``[data]``
    table's own keys structured into the attrs class ``params`` (None without one), ``source`` a
    ``DataSource``; it returns ``Rows`` (or ``(X, y)``, ``(X, y, groups)``). Loaders read local files only:
    netsim never downloads. The registries' one rule: the same loader again is a no-op, another under a
    taken name raises ValueError."""
    from netsim.scenario.schema import DataSpec as Spec

    if params is not None:
        if not attrs.has(params):
            raise TypeError(f"params of dataset {name!r} must be an attrs class")
        shared = sorted(set(attrs.fields_dict(params)) & set(attrs.fields_dict(Spec)))
        if shared:
            raise ValueError(f"params of dataset {name!r} reuse [data]'s own keys {shared}")
    if DATASETS.get(name) is loader and DATASET_PARAMS[name] is not params:
        raise ValueError(f"dataset {name!r} is already registered with other params ({DATASET_PARAMS[name]})")
    claim(DATASETS, "dataset", name, loader)
    DATASET_PARAMS[name] = params
    return loader


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def dataset_args(spec: DataSpec) -> Any:
    """The ``[data]`` table's plugin keys structured into its dataset's params class (one-line errors)."""
    from importlib.metadata import entry_points

    from netsim.scenario.structure import plugin_keys

    if spec.kind not in DATASETS:
        for ep in entry_points(group="netsim.datasets"):
            ep.load()
    if spec.kind not in DATASETS:
        raise InputError("data.kind", unknown_name("dataset", spec.kind, dataset_names()))
    return plugin_keys("data", "dataset", spec.kind, DATASET_PARAMS[spec.kind], DataSpec, spec.params)


def _rows(made: Any, kind: str) -> Rows:
    """A loader's result as checked ``Rows``."""
    if isinstance(made, tuple) and len(made) in (2, 3):
        made = Rows(*made)
    if not isinstance(made, Rows):
        raise InputError("data.kind", f"the loader of dataset {kind!r} returned {type(made).__name__}, not Rows, "
                                      "(X, y) or (X, y, groups)")
    X, y = np.asarray(made.X), np.asarray(made.y)
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y) or not len(X):
        raise InputError("data.kind", f"dataset {kind!r}: features must be (n, d) and labels (n,) with n >= 1, "
                                      f"got {X.shape} and {y.shape}")
    if not np.issubdtype(X.dtype, np.number):
        raise InputError("data.kind", f"dataset {kind!r}: features must be numbers, got {X.dtype}")
    if kind not in BUILTIN_DATASETS and not np.isfinite(X).all():  # a loader plugin's rows, checked once
        raise InputError("data.kind", f"dataset {kind!r}: features hold NaN or infinite values")
    groups = None if made.groups is None else np.asarray(made.groups)
    if groups is not None and groups.shape != y.shape:
        raise InputError("data.kind", f"dataset {kind!r}: groups {groups.shape} do not match labels {y.shape}")
    X_test = y_test = None
    if made.X_test is not None:
        X_test, y_test = np.asarray(made.X_test), np.asarray(made.y_test)
        if X_test.ndim != 2 or X_test.shape[1] != X.shape[1] or y_test.shape != (len(X_test),):
            raise InputError("data.kind", f"dataset {kind!r}: test rows {X_test.shape} / labels {y_test.shape} do "
                                          f"not match the training rows' {X.shape[1]} features")
        X_test = X_test.astype(np.float32, copy=False) if X_test.dtype != np.float64 else X_test
    X = X.astype(np.float32, copy=False) if X.dtype != np.float64 else X
    return Rows(X, y, groups, X_test, y_test, made.shape)


def _synthetic(args: None, src: DataSource) -> Rows:
    """Generated logistic-regression rows (data.generator), drawn from the data stream."""
    return Rows(*synthetic_logistic(src.spec, src.rng))


def _libsvm(args: None, src: DataSource) -> Rows:
    """A LIBSVM file (data.path), and its test file (data.test_path) if given."""
    X, y = load_libsvm(src.file(), "data.path")
    if not src.spec.test_path:
        return Rows(X, y)
    X_test, y_test = load_libsvm(src.file(src.spec.test_path, "data.test_path"), "data.test_path",
                                 n_features=X.shape[1])
    return Rows(X, y, None, X_test, y_test)


def _images(default: str, load, shape: tuple[int, ...], doc: str):
    def loader(args: None, src: DataSource) -> Rows:
        folder = find_data_dir(src.spec.path or default, "data.path")
        X, y, X_test, y_test = load(folder, "data.path")
        if X.shape[1] != int(np.prod(shape)):
            raise InputError("data.path", f"{folder}: images of {X.shape[1]} pixels, expected shape {shape}")
        return Rows(X, y, None, X_test, y_test, shape)
    loader.__doc__ = doc
    return loader


def _table(args: None, src: DataSource) -> Rows:
    """A CSV, Parquet or NPZ file with named feature, label and group columns (data.columns, label, group)."""
    from netsim.compute.tables import read_table

    spec = src.spec
    X, y, groups, names = read_table(src.file(), "data.path", spec.columns, spec.label, spec.group)
    if not spec.test_path:
        return Rows(X, y, groups)
    X_test, y_test, _, _ = read_table(src.file(spec.test_path, "data.test_path"), "data.test_path", names,
                                      spec.label, None)
    return Rows(X, y, groups, X_test, y_test)


#: the image datasets' folders under $NETSIM_DATA when data.path is not given
IMAGE_FOLDERS = {"mnist": "mnist", "cifar10": "cifar-10-batches-bin"}

for _name, _loader in (("synthetic", _synthetic), ("libsvm", _libsvm),
                       ("mnist", _images(IMAGE_FOLDERS["mnist"], load_mnist, (1, 28, 28),
                                         "MNIST handwritten digits: 28x28 grey images held flat, from the four "
                                         "IDX files in data.path (default mnist/ under $NETSIM_DATA), with "
                                         "their own test split.")),
                       ("cifar10", _images(IMAGE_FOLDERS["cifar10"], load_cifar10, (3, 32, 32),
                                           "CIFAR-10: 32x32 colour images held flat, from the binary batches in "
                                           "data.path (default cifar-10-batches-bin/ under $NETSIM_DATA), with "
                                           "their own test split.")),
                       ("table", _table)):
    register_dataset(_name, _loader)


def find_data(spec: DataSpec) -> list[Path] | None:
    """Where a built-in dataset's loader (and a partition file) will read, found as they find it, without
    reading anything: the paths; InputError (the loader's own line) for the first one missing; None for a
    plugin's kind, whose files only its loader knows."""
    if spec.kind not in ("synthetic", "libsvm", "table", *IMAGE_FOLDERS):
        return None
    found = []
    if spec.kind in IMAGE_FOLDERS:
        found.append(find_data_dir(spec.path or IMAGE_FOLDERS[spec.kind], "data.path"))
    elif spec.kind != "synthetic":
        if not spec.path:
            raise InputError("data.path", f"required for kind = {spec.kind!r}")
        found.append(find_data_file(spec.path, "data.path"))
        if spec.test_path:
            found.append(find_data_file(spec.test_path, "data.test_path"))
    if spec.partition == "file":
        found.append(find_data_file(spec.partition_file, "data.partition_file"))
    return found


def load_dataset(spec: DataSpec, n_agents: int, streams) -> Dataset:
    """The scenario's data from its named streams (``data``: generation and test split; ``partition``;
    ``subsample``: per_agent; ``validation``: Q and the test rows), all rooted at data.seed. Built-in and
    plugin kinds alike come from the dataset registry."""
    args = dataset_args(spec)
    rng = streams.rng("data")
    rows = _rows(DATASETS[spec.kind](args, DataSource(spec, rng)), spec.kind)
    X, y_raw, groups, X_test, y_test_raw, shape = rows.X, rows.y, rows.groups, rows.X_test, rows.y_test, rows.shape
    if X_test is None:
        order = rng.permutation(len(X))
        n_test = max(1, int(round(spec.test_fraction * len(X))))
        test, train = order[:n_test], order[n_test:]
        X, X_test, y_raw, y_test_raw = X[train], X[test], y_raw[train], y_raw[test]
        groups = None if groups is None else groups[train]
    if spec.standardize != "none":
        X, X_test = standardize(X, X_test, spec)
    if spec.unit_rows:  # unit rows (e.g. LIBSVM epsilon_normalized)
        X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12).astype(X.dtype)
        norms = np.maximum(np.linalg.norm(X_test, axis=1, keepdims=True), 1e-12)
        X_test = X_test / norms.astype(X_test.dtype)
    values = np.unique(np.concatenate([y_raw, y_test_raw]))
    y, y_test = _labels(y_raw, values), _labels(y_test_raw, values)
    if spec.partition == "groups":
        if groups is None:
            raise InputError("data.partition", "'groups' needs a group per row: data.kind = 'table' with data.group, "
                                               f"or a dataset plugin that returns groups ({spec.kind!r} has none)")
        parts = group_partition(groups, n_agents, spec.groups_per_agent, spec.extra_groups,
                                streams.rng("partition"))
    elif spec.partition == "file":
        parts = read_partition(find_data_file(spec.partition_file, "data.partition_file"), n_agents, len(y))
    else:
        parts = partition(y, n_agents, spec.partition, spec.alpha, streams.rng("partition"), spec.shards,
                          spec.share, spec.classes, spec.per_agent)
    if spec.per_agent is not None and spec.partition != "dirichlet_equal":
        parts = subsample(parts, spec.per_agent, streams.rng("subsample"))
    X_val = y_val = None
    if spec.validation or spec.test_samples is not None:
        val, keep = held_out_split(len(y_test), spec.validation, spec.test_samples, streams.rng("validation"))
        X_val, y_val = X_test[val], y_test[val]
        X_test, y_test = X_test[keep], y_test[keep]
    return Dataset(X, y, X_test, y_test, laid_end_to_end(parts), len(values), shape, X_val, y_val, groups)


def laid_end_to_end(parts) -> tuple[np.ndarray, ...]:
    """The parts as consecutive views of one int64 array (the same rows): the windowed engine's mini-batch gather
    indexes that array itself (``RowsAhead``) instead of a copy of every part (320 B an agent at 40 rows)."""
    flat = np.concatenate(parts).astype(np.int64, copy=False) if len(parts) else np.zeros(0, np.int64)
    return tuple(np.split(flat, np.cumsum([len(r) for r in parts])[:-1]))


def end_to_end_base(parts) -> np.ndarray | None:
    """The array ``parts`` are consecutive views of, from its start, in order (``laid_end_to_end``), or None."""
    base = parts[0].base if len(parts) else None
    if base is None or base.ndim != 1 or base.dtype != np.int64 or not base.flags.c_contiguous:
        return None
    addr, pos = base.__array_interface__["data"][0], 0
    for r in parts:
        if r.base is not base or r.dtype != base.dtype or \
                (len(r) and r.__array_interface__["data"][0] != addr + 8 * pos) or (len(r) > 1 and r.strides[0] != 8):
            return None  # (an empty view's address says nothing)
        pos += len(r)
    return base[:pos]


def group_partition(groups: np.ndarray, n_agents: int, per_agent: int, extra: str,
                    rng: np.random.Generator) -> tuple:
    """Natural partition (LEAF's by-writer split, a hospital's patients): every agent holds all the training
    rows of its groups. The groups are dealt in a seeded order, round-robin: agent i gets groups
    ``order[i], order[i + m], ...``. With G groups and m agents of ``per_agent`` groups each, G < m k is
    refused; G > m k deals every group (``extra = "spread"``: k or more each, as even as possible), keeps
    the first m k of the order (``"drop"``: the other groups' rows are held by nobody) or is refused."""
    values, codes = np.unique(groups, return_inverse=True)
    G, need = len(values), n_agents * per_agent
    if G < need:
        raise InputError("data.groups_per_agent", f"{G} groups cannot give {n_agents} agents {per_agent} "
                                                  f"group(s) each")
    if G > need and extra == "error":
        raise InputError("data.extra_groups", f"{G} groups for {n_agents} agents x {per_agent}: {G - need} left "
                                              "over; use 'spread' (deal them all) or 'drop'")
    order = rng.permutation(G)
    if G > need and extra == "drop":
        order = order[:need]
    by_group = np.argsort(codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=G))])
    return tuple(np.sort(np.concatenate([by_group[starts[g]:starts[g + 1]] for g in order[i::n_agents]]))
                 .astype(np.int64) for i in range(n_agents))


def read_partition(path: Path, n_agents: int, n_rows: int) -> tuple:
    """An explicit partition: one list of training-row indices per agent, from JSON (a list of lists of
    integers) or NPZ (integer arrays ``agent_0`` ... ``agent_<m-1>``, read without pickle). Every agent needs
    at least one row, each in [0, n_rows) and listed once; agents may share rows."""
    import json

    key = "data.partition_file"
    try:
        if path.suffix == ".json":
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, list) or not all(isinstance(r, list) for r in raw):
                raise InputError(key, f"{path}: expected a JSON list of lists of row indices, one per agent")
            if any(type(v) is not int for r in raw for v in r):
                raise InputError(key, f"{path}: row indices must be integers")
            out = next((i for i, r in enumerate(raw) if any(not 0 <= v < n_rows for v in r)), None)
            if out is not None:  # before numpy sees them: a 400-digit index must not overflow
                raise InputError(key, f"{path}: agent {out}'s rows must be in [0, {n_rows - 1}] (the training rows)")
            lists = [np.array(r, dtype=np.int64) for r in raw]
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                names = set(z.files)
                want = [f"agent_{i}" for i in range(n_agents)]
                if names != set(want):
                    raise InputError(key, f"{path}: expected arrays agent_0 ... agent_{n_agents - 1}, got "
                                          f"{', '.join(sorted(names)[:5])}{' ...' if len(names) > 5 else ''}")
                lists = [z[w] for w in want]
            if any(a.ndim != 1 or not np.issubdtype(a.dtype, np.integer) for a in lists):
                raise InputError(key, f"{path}: every agent_<i> must be a 1-D integer array")
        else:
            raise InputError(key, f"{path}: a partition file is .json or .npz, not {path.suffix or 'no suffix'!r}")
    except (OSError, ValueError, RecursionError, zipfile.BadZipFile) as e:  # ValueError: JSON, UTF-8, npz
        raise InputError(key, f"{path}: cannot read: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
    if len(lists) != n_agents:
        raise InputError(key, f"{path}: {len(lists)} agents' rows listed; the scenario has {n_agents} agents")
    for i, rows in enumerate(lists):
        if not len(rows):
            raise InputError(key, f"{path}: agent {i} has no rows")
        if rows.min() < 0 or rows.max() >= n_rows:
            raise InputError(key, f"{path}: agent {i}'s rows must be in [0, {n_rows - 1}] (the training rows)")
        if len(np.unique(rows)) != len(rows):
            raise InputError(key, f"{path}: agent {i} lists a row twice")
    return tuple(np.sort(r.astype(np.int64)) for r in lists)


def write_partition(path: str | Path, parts) -> Path:
    """Write agents' rows (``Dataset.parts``) as a partition file ``read_partition`` reads back exactly:
    JSON or NPZ by the suffix."""
    import json

    path = Path(path)
    if path.suffix == ".json":
        path.write_text(json.dumps([[int(v) for v in p] for p in parts]))
    elif path.suffix == ".npz":
        np.savez(path, **{f"agent_{i}": np.asarray(p, dtype=np.int64) for i, p in enumerate(parts)})
    else:
        raise ValueError(f"a partition file is .json or .npz, not {path.suffix!r}")
    return path


def subsample(parts: tuple, k: int, rng: np.random.Generator) -> tuple:
    """Every agent's part cut to ``k`` rows drawn without replacement (data.per_agent)."""
    short = [(i, len(p)) for i, p in enumerate(parts) if len(p) < k]
    if short:
        i, size = short[0]
        raise InputError("data.per_agent", f"{k} rows per agent, but agent {i}'s part has only {size} "
                                           f"({len(short)} agents are short); lower per_agent or change the partition")
    return tuple(np.sort(rng.choice(p, k, replace=False)) for p in parts)


def held_out_split(n: int, validation: int, test_samples: int | None,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One seeded permutation of the held-out rows: Q is its first ``validation`` rows, the test set its
    last ``test_samples`` (default: all the others), so the two never overlap."""
    n_test = n - validation if test_samples is None else test_samples
    if validation + n_test > n or n_test < 1:
        raise InputError("data.validation", f"validation ({validation}) + test rows ({n_test}) must fit in the "
                                            f"{n} held-out rows and leave at least one test row")
    perm = rng.permutation(n)
    return perm[:validation], np.sort(perm[n - n_test:])
