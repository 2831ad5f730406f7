"""The batched gradient service, the clipping seam through Agent.gradient, device noise, --device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from netsim.compute import resolve_device
from netsim.compute.gradients import GradientService
from netsim.compute.models import MLP, LogisticRegression
from netsim.compute.noise import gaussian_noise, laplace_noise, noise_generator
from netsim.errors import InputError

D = torch.float64


def service(model, n=200, d=6, C=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=D)
    y = torch.randint(0, C, (n,), generator=g)
    return GradientService(model, X, y), X, y


def test_flush_groups_match_one_by_one():
    m = MLP(6, 3, (4,))
    svc, X, y = service(m)
    rng = np.random.default_rng(0)
    noise = torch.randn(6, m.size, dtype=D, generator=torch.Generator().manual_seed(2))
    W = m.init(6, D, torch.device("cpu"), seed=1) + 0.1 * noise
    spec = [(8, None, "l2"), (8, None, "l2"), (5, None, "l2"), (8, 0.1, "l2"), (8, 0.1, "l2"),
            (8, 0.01, "coordinate")]
    reqs = [(i, rng.integers(0, 200, b), clip, kind) for i, (b, clip, kind) in enumerate(spec)]
    tickets = [svc.submit(i, W[i], rows, clip, kind) for i, rows, clip, kind in reqs]
    svc.flush()
    assert svc.calls == 4 and svc.evaluated == 6 and not svc.pending
    for t, (i, rows, clip, kind) in zip(tickets, reqs, strict=True):
        ref = m.grad(W[i:i + 1], X[rows][None], y[rows][None], clip, kind)[0]
        torch.testing.assert_close(t.result, ref, rtol=1e-12, atol=1e-14)
        # and the single-request (lean) path gives the same
        one = svc.submit(i, W[i], rows, clip, kind)
        svc.flush()
        torch.testing.assert_close(one.result, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_block_is_its_requests_bit_for_bit(dtype):
    """A block of requests (the windowed drivers') gives exactly the gradients of the same requests submitted one
    by one in the same flush, alone or beside single requests of its group, with and without clipping."""
    m = MLP(6, 3, (4,))
    svc, X, y = service(m)
    svc.X = svc.X.to(dtype)
    rng = np.random.default_rng(3)
    W = (m.init(7, D, torch.device("cpu"), seed=1)
         + 0.1 * torch.randn(7, m.size, dtype=D, generator=torch.Generator().manual_seed(4))).to(dtype)
    rows = [rng.integers(0, 200, 8) for _ in range(7)]
    for clip, kind in [(None, "l2"), (0.1, "l2"), (0.05, "coordinate")]:
        singles = [svc.submit(i, W[i], rows[i], clip, kind) for i in range(7)]
        svc.flush()
        want = torch.stack([t.result for t in singles])
        blk = svc.submit_block(list(range(7)), W, rows, clip, kind)
        svc.flush()
        assert blk.result.shape == W.shape and torch.equal(blk.result, want)
        # a block between single requests of its group: each keeps its place in the one batched call
        a = svc.submit(0, W[0], rows[0], clip, kind)
        blk = svc.submit_block(list(range(1, 6)), W[1:6], rows[1:6], clip, kind)
        z = svc.submit(6, W[6], rows[6], clip, kind)
        svc.flush()
        assert torch.equal(torch.cat([a.result[None], blk.result, z.result[None]]), want)
    with pytest.raises(ValueError, match="clip must be > 0"):
        svc.submit_block([0], W[:1], rows[:1], clip=-1.0)
    assert not svc.pending


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_many_rows_are_gathered_with_the_bits_of_index_select(monkeypatch, dtype):
    """A flush of many requests gathers its rows by numpy's ``take`` (``TAKE_ROWS`` and more): the rows, and the
    gradients, of ``index_select``; a row out of range is ``index_select``'s IndexError."""
    import netsim.compute.gradients as gradients

    m = LogisticRegression(9)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(5000, 9, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 2, (5000,), generator=g)
    svc = GradientService(m, X, y)
    rows = np.random.default_rng(4).integers(0, 5000, 600 * 16)
    idx = torch.from_numpy(rows)
    got = svc._features(rows, idx)
    assert got.data_ptr() % 64 == 0 and torch.equal(got, X.index_select(0, idx))
    W = torch.randn(600, m.size, generator=g, dtype=torch.float64).to(dtype)
    fast = svc._grad_rows(W, rows, 16, None, "l2")
    monkeypatch.setattr(gradients, "TAKE_ROWS", 10**9)  # index_select only
    assert torch.equal(fast, svc._grad_rows(W, rows, 16, None, "l2"))
    monkeypatch.undo()
    with pytest.raises(IndexError):
        svc._features(np.r_[rows, 5000], torch.from_numpy(np.r_[rows, 5000]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kept_rows_give_the_same_bits_and_a_rows_batch_changes_them(dtype):
    """Rows gathered once (``keep_rows``: the lookahead windows' whole parts) give the bits of indexing the
    training set each time, alone (the lean path) and in a batch. And a logistic gradient's bits depend on
    which requests share its call (one request alone, or beside others), which is why the lookahead windows
    evaluate the engine's batches and no others."""
    m = LogisticRegression(22)
    g = torch.Generator().manual_seed(7)
    X = torch.randn(300, 22, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 2, (300,), generator=g)
    plain, kept = GradientService(m, X, y), GradientService(m, X, y)
    parts = [np.arange(k * 7, k * 7 + 7) for k in range(12)]
    for rows in parts[:8]:
        kept.keep_rows(rows)
    W = torch.randn(12, m.size, generator=g, dtype=torch.float64).to(dtype)
    batches = [[0], [1, 2, 3], [4, 9], [10], [5, 6, 7, 8, 11]]  # kept and not, alone and together
    alone = {}
    for svc in (plain, kept):
        got = []
        for b in batches:
            ts = [svc.submit(i, W[i], parts[i]) for i in b]
            svc.flush()
            got.append(torch.stack([t.result for t in ts]))
        alone[svc is kept] = torch.cat(got)
    assert torch.equal(alone[True], alone[False])
    assert plain.calls == kept.calls == 5 and plain.evaluated == kept.evaluated == 12
    one_by_one = []
    for i in range(12):
        t = plain.submit(i, W[i], parts[i])
        plain.flush()
        one_by_one.append(t.result)
    assert not torch.equal(torch.stack(one_by_one), alone[False])


def test_submit_rejects_bad_clip():
    svc, _, _ = service(LogisticRegression(6))
    with pytest.raises(ValueError, match="clip must be > 0"):
        svc.submit(0, torch.zeros(7), np.arange(3), clip=0.0)
    with pytest.raises(ValueError, match="clip_kind"):
        svc.submit(0, torch.zeros(7), np.arange(3), clip=1.0, clip_kind="l1")


def test_agent_gradient_clip_through_the_kernel(scenario):
    """Agent.gradient(clip=...) reaches the model's clipped path with the agent's own rows."""
    from netsim.sim.kernel import Simulation

    sc = scenario(model={"kind": "logistic", "dtype": "float64"}, run={"rounds": 2, "until": None})
    seen = []

    def program(agent, _params):
        while True:
            yield agent.wake()
            x = agent.params
            ev = agent.gradient(batch=8, clip=0.05, clip_kind="l2")
            rows = ev._value.rows
            g = yield ev
            plain = yield agent.gradient(batch=8)
            seen.append((x, rows, g, plain))

    sim = Simulation(sc, program, None, device="cpu")
    sim.run()
    assert len(seen) == 2 * sc.agents.count
    for x, rows, g, plain in seen:
        ref = sim.model.grad(x[None], sim.X[rows][None], sim.y[rows][None], 0.05, "l2")[0]
        torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-14)
        assert g.norm() <= 0.05 + 1e-12 and plain.norm() > 0.05  # the clipped mean has norm <= C


def test_noise_is_seeded_and_distributed():
    g1, g2 = noise_generator(7), noise_generator(7)
    a = gaussian_noise((20000,), 2.0, g1, D)
    assert torch.equal(a, gaussian_noise((20000,), 2.0, g2, D))
    assert not torch.equal(a, gaussian_noise((20000,), 2.0, g2, D))  # the stream moves on
    assert stats.kstest(a.numpy(), stats.norm(scale=2.0).cdf).pvalue > 1e-3
    b = laplace_noise((20000,), 0.5, noise_generator(8), D)
    assert b.shape == (20000,) and b.dtype == D
    assert stats.kstest(b.numpy(), stats.laplace(scale=0.5).cdf).pvalue > 1e-3
    assert stats.kstest(b.numpy(), stats.norm(scale=0.5 * 2 ** 0.5).cdf).pvalue < 1e-6  # not Gaussian
    assert laplace_noise((3, 4), 1.0, noise_generator(1)).device == torch.device("cpu")


def test_device_resolution_and_placement(scenario):
    from netsim.sim.kernel import Simulation

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    sim = Simulation(scenario(run={"device": "cpu"}), lambda a, p: iter(()), None)
    assert sim.bank.W.device.type == sim.X.device.type == sim.gradients.device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="run.device.*no CUDA"):
            Simulation(scenario(run={"device": "cuda"}), lambda a, p: iter(()), None)


def test_mlp_run_on_idx_files_is_deterministic(tmp_path, monkeypatch, scenario):
    """A whole run on (generated) MNIST-format files with the MLP: same seed, same metrics; it learns."""
    import netsim
    from tests.test_compute_data import write_mnist

    write_mnist(tmp_path / "mnist", n=400, m=100)
    monkeypatch.setenv("NETSIM_DATA", str(tmp_path))
    sc = scenario(data={"kind": "mnist"}, model={"kind": "mlp", "hidden": [16]}, agents={"count": 4},
                  run={"until": 20.0, "seed": 5})
    a = netsim.run(sc, out=tmp_path / "a")
    b = netsim.run(sc, out=tmp_path / "b")
    assert a.metrics == b.metrics
    assert (tmp_path / "a" / "trace.arrows").read_bytes() == (tmp_path / "b" / "trace.arrows").read_bytes()
    assert a.metrics[0]["accuracy"] < 0.3 and a.metrics[-1]["accuracy"] > 0.9


def test_mnist_scenario_file_validates():
    from netsim.scenario import load_scenario

    sc = load_scenario("scenarios/mnist_mlp.toml")
    assert sc.data.kind == "mnist" and sc.model.kind == "mlp" and sc.model.hidden == (64,)


def test_bank_rows_and_named_state():
    from netsim.compute.bank import ParameterBank

    bank = ParameterBank(torch.zeros(3, 4, dtype=D))
    row = bank.get(1)
    bank.set(1, torch.ones(4, dtype=D))
    assert not row.any() and bank.W[1].sum() == 4  # get() is a snapshot
    m = bank.state("momentum")
    assert m.shape == (3, 4) and m.dtype == D and not m.any()
    m[2] += 5.0  # a view: writes stay in the bank
    assert bank.state("momentum")[2].sum() == 20
    assert bank.state("weight", (), fill=1.0).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="has shape"):
        bank.state("momentum", (2,))
    saved = {k: v.clone() for k, v in bank.state_dict().items()}
    other = ParameterBank(torch.zeros(3, 4, dtype=D))
    other.load_state_dict(saved)
    assert torch.equal(other.W, bank.W) and torch.equal(other.state("momentum"), bank.state("momentum"))


def test_agent_gradient_on_explicit_rows(scenario):
    """An online learner's history: gradient(rows=...) evaluates exactly those rows, batched across
    agents whose histories have the same length."""
    from netsim.sim.kernel import Simulation

    sc = scenario(model={"kind": "logistic", "dtype": "float64"}, run={"rounds": 3, "until": None})
    seen = []

    def program(agent, _params):
        hist = np.empty(0, dtype=np.int64)
        while True:
            yield agent.wake()
            hist = np.concatenate([hist, agent.sample_rows(4)])  # 4 new samples per round
            x = agent.params
            g = yield agent.gradient(rows=hist, params=x)
            seen.append((x, hist.copy(), g))

    sim = Simulation(sc, program, None, device="cpu")
    sim.run()
    assert sorted({len(h) for _, h, _ in seen}) == [4, 8, 12]
    for x, hist, g in seen:
        ref = sim.model.grad(x[None], sim.X[hist][None], sim.y[hist][None])[0]
        torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-14)
    assert sim.gradients.calls < len(seen)  # same-length histories were evaluated together


def test_cpu_allocator_tuning_is_applied_once_on_glibc():
    import platform

    from netsim.compute import tune_cpu_allocator

    GradientService(LogisticRegression(2), torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert tune_cpu_allocator() is True


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_request_at_a_one_row_matrix_is_answered_with_one_bit_for_bit(dtype):
    """A request whose params are a (1, P) row (a batch of one's) gets its gradient as a (1, P) row with the bits of
    the same request at the 1-D row: alone (the lean path), among its kind, and beside 1-D requests and a block."""
    m = MLP(6, 3, (4,))
    svc, X, y = service(m)
    svc.X = svc.X.to(dtype)
    rng = np.random.default_rng(5)
    W = (m.init(5, D, torch.device("cpu"), seed=1)
         + 0.1 * torch.randn(5, m.size, dtype=D, generator=torch.Generator().manual_seed(6))).to(dtype)
    rows = [rng.integers(0, 200, 8) for _ in range(5)]
    flat = [svc.submit(i, W[i].clone(), rows[i]) for i in range(5)]
    svc.flush()
    ref = [t.result for t in flat]
    for shape in ([2] * 5, [2, 1, 2, 1, 2], [2]):  # all (1, P); mixed with 1-D; alone
        ts = [svc.submit(i, W[i].clone()[None] if s == 2 else W[i].clone(), rows[i]) for i, s in enumerate(shape)]
        svc.flush()
        for t, s, r in zip(ts, shape, ref, strict=False):
            assert t.result.dim() == s and torch.equal(t.result.reshape(-1), r)
    block = svc.submit_block([0, 1], W[:2].clone(), rows[:2])
    one = svc.submit(2, W[2].clone()[None], rows[2])
    svc.flush()
    assert torch.equal(block.result, torch.stack(ref[:2])) and one.result.shape == (1, m.size)
    assert torch.equal(one.result[0], ref[2])
