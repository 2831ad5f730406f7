"""Real-data loaders on small generated files, partitions (Dirichlet statistics), data errors."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from netsim.compute.data import (
    CIFAR_MEAN,
    CIFAR_STD,
    find_data_dir,
    load_cifar10,
    load_dataset,
    load_mnist,
    partition,
    read_idx,
)
from netsim.errors import InputError
from netsim.sim.streams import Streams


def idx_bytes(a: np.ndarray) -> bytes:
    head = struct.pack(">BBBB", 0, 0, 0x08, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
    return head + a.astype(">u1").tobytes()


def write_mnist(folder, n=40, m=12, gz=True, seed=0):
    """Noise images whose label k lights rows 2k, 2k+1 (learnable), labels i mod 10."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def images(k):
        x = rng.integers(0, 100, (k, 28, 28))
        for i in range(k):
            x[i, 2 * (i % 10):2 * (i % 10) + 2] += 150
        return x
    arrays = {"train-images-idx3-ubyte": images(n), "train-labels-idx1-ubyte": np.arange(n) % 10,
              "t10k-images-idx3-ubyte": images(m), "t10k-labels-idx1-ubyte": np.arange(m) % 10}
    for name, a in arrays.items():
        raw = idx_bytes(a)
        if gz:
            (folder / (name + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (folder / name).write_bytes(raw)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_roundtrip(tmp_path, gz):
    arrays = write_mnist(tmp_path / "mnist", gz=gz)
    X, y, Xt, yt = load_mnist(tmp_path / "mnist", "data.path")
    assert X.shape == (40, 784) and Xt.shape == (12, 784) and X.dtype == np.float32
    np.testing.assert_array_equal(X * 255, arrays["train-images-idx3-ubyte"].reshape(40, -1))
    np.testing.assert_array_equal(y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(yt, arrays["t10k-labels-idx1-ubyte"])


def test_idx_errors(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x08\x03\x00\x00" + b"\x00" * 20)
    with pytest.raises(InputError, match="data.path.*bad magic"):
        read_idx(bad, "data.path")
    short = tmp_path / "short"
    short.write_bytes(idx_bytes(np.zeros((3, 4)))[:-2])
    with pytest.raises(InputError, match="does not match its dimensions"):
        read_idx(short, "data.path")
    (tmp_path / "m").mkdir()
    with pytest.raises(InputError, match="no train-images-idx3-ubyte or train-images-idx3-ubyte.gz"):
        load_mnist(tmp_path / "m", "data.path")


def test_cifar_binary(tmp_path):
    rng = np.random.default_rng(1)
    recs = {}
    for name, n in (("data_batch_1.bin", 5), ("data_batch_2.bin", 3), ("test_batch.bin", 4)):
        r = np.concatenate([rng.integers(0, 10, (n, 1)), rng.integers(0, 256, (n, 3072))], 1).astype(np.uint8)
        (tmp_path / name).write_bytes(r.tobytes())
        recs[name] = r
    X, y, Xt, yt = load_cifar10(tmp_path, "data.path")
    assert X.shape == (8, 3072) and Xt.shape == (4, 3072)
    labels = [recs[f"data_batch_{k}.bin"][:, 0] for k in (1, 2)]
    np.testing.assert_array_equal(y, np.concatenate(labels))
    # pixel (channel c, row i, col j) of the first image = byte 1 + 1024 c + 32 i + j of its record
    c, i, j = 2, 5, 7
    raw = recs["data_batch_1.bin"][0, 1 + 1024 * c + 32 * i + j]
    assert X[0, 1024 * c + 32 * i + j] == pytest.approx((raw / 255 - CIFAR_MEAN[c]) / CIFAR_STD[c], rel=1e-5)
    (tmp_path / "test_batch.bin").write_bytes(b"\x01" * 100)
    with pytest.raises(InputError, match="not a CIFAR-10 binary batch"):
        load_cifar10(tmp_path, "data.path")


def test_find_data_dir_uses_netsim_data(tmp_path, monkeypatch):
    (tmp_path / "mnist").mkdir()
    monkeypatch.chdir(tmp_path / "mnist")
    monkeypatch.delenv("NETSIM_DATA", raising=False)
    with pytest.raises(InputError, match="data.path.*'mnist' not found.*set NETSIM_DATA"):
        find_data_dir("mnist", "data.path")
    monkeypatch.setenv("NETSIM_DATA", str(tmp_path))
    assert find_data_dir("mnist", "data.path") == tmp_path / "mnist"


@pytest.mark.parametrize("alpha", [0.1, 1.0, 10.0])
def test_dirichlet_partition_matches_alpha(alpha):
    """Each class's shares over n agents are Dir(alpha): Var(share) = (1/n)(1 - 1/n) / (n alpha + 1).
    The method-of-moments estimate of alpha from the realised shares must be within 15%."""
    n, classes, per = 10, 300, 1000
    y = np.repeat(np.arange(classes), per)
    parts = partition(y, n, "dirichlet_classes", alpha, np.random.default_rng(42))
    counts = np.stack([np.bincount(y[p], minlength=classes) for p in parts])  # (agents, classes)
    assert counts.sum() == len(y) and len(np.unique(np.concatenate(parts))) == len(y)
    shares = counts / per
    var = shares.var()
    alpha_hat = ((1 / n) * (1 - 1 / n) / var - 1) / n
    assert alpha_hat == pytest.approx(alpha, rel=0.15)


def test_iid_shards_quantity_partitions():
    y = np.repeat(np.arange(10), 100)
    for kind in ("iid", "shards", "quantity"):
        parts = partition(y, 20, kind, 0.5, np.random.default_rng(1), shards=2)
        flat = np.concatenate(parts)
        assert len(flat) == len(np.unique(flat)) and all(len(p) >= 1 for p in parts)
        if kind != "quantity":
            assert len(flat) == len(y)
        if kind == "iid":
            assert {len(p) for p in parts} == {50}
        if kind == "shards":  # 40 shards of 25 rows: each agent sees at most 2 labels
            assert all(len(np.unique(y[p])) <= 2 for p in parts)
        if kind == "quantity":
            sizes = np.array([len(p) for p in parts])
            assert sizes.max() > 3 * sizes.min() and sizes.sum() > 0.95 * len(y)
    with pytest.raises(InputError, match="data.shards"):
        partition(y[:30], 20, "shards", 0.5, np.random.default_rng(1), shards=2)


def test_load_dataset_mnist_through_scenario(tmp_path, monkeypatch, scenario):
    write_mnist(tmp_path / "mnist", n=60, m=20)
    monkeypatch.setenv("NETSIM_DATA", str(tmp_path))
    sc = scenario(data={"kind": "mnist"}, model={"kind": "mlp", "hidden": [8]}, agents={"count": 4})
    ds = load_dataset(sc.data, 4, Streams(0))
    assert ds.shape == (1, 28, 28) and ds.classes == 10 and ds.features == 784 and len(ds.y_test) == 20
    bad = scenario(data={"kind": "mnist", "path": "nowhere"})
    with pytest.raises(InputError, match="data.path.*'nowhere' not found"):
        load_dataset(bad.data, 4, Streams(0))


def test_cifar_scenario_builds_cnn_simulation(tmp_path, monkeypatch, scenario):
    """data.kind = 'cifar10' under $NETSIM_DATA with model.kind = 'cnn': images are 3x32x32, one
    gradient step and one evaluation run."""
    import torch

    from netsim.sim.kernel import Simulation

    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    rng = np.random.default_rng(2)
    for name, n in (("data_batch_1.bin", 24), ("test_batch.bin", 10)):
        rec = np.concatenate([np.arange(n)[:, None] % 10, rng.integers(0, 256, (n, 3072))], 1)
        (folder / name).write_bytes(rec.astype(np.uint8).tobytes())
    monkeypatch.setenv("NETSIM_DATA", str(tmp_path))
    sc = scenario(data={"kind": "cifar10"}, model={"kind": "cnn"}, agents={"count": 3})
    sim = Simulation(sc, lambda a, p: iter(()), None, device="cpu")
    assert sim.data.shape == (3, 32, 32) and sim.X.shape == (24, 3072)
    t = sim.gradients.submit(0, sim.bank.get(0), np.arange(4))
    sim.gradients.flush()
    assert t.result.shape == (sim.model.size,) and torch.isfinite(t.result).all()
    row = sim.evaluate()
    assert 0.0 <= row["accuracy"] <= 1.0 and row["consensus"] < 1e-10  # all agents start equal
