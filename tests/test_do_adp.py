"""DO-ADP (netsim/algorithms/do_adp.py): special cases, noise placement, invariants."""

from __future__ import annotations

import math

import pytest
import torch

from netsim.errors import InputError
from netsim.privacy import closed_forms as cf
from netsim.scenario import scenario_from_dict
from netsim.sim.kernel import Simulation
from netsim.trace.events import Finish, Release, Send, records
from netsim.trace.io import TraceWriter
from tests.conftest import BASE, merge

T = 40
SMALL = {
    "run": {"seed": 4, "until": T + 5.0},
    "agents": {"count": 6, "compute_time": {"kind": "constant", "value": 0.01},
               "activation": {"kind": "periodic", "period": 1.0}},
    "topology": {"kind": "ring"},
    "model": {"kind": "logistic", "l2": 0.01, "dtype": "float64"},
    "data": {"kind": "synthetic", "samples": 600, "features": 7},
    "evaluation": {"every": 10.0},
}


def _sim(collect: list | None = None, **extra) -> Simulation:
    from netsim import api

    sc = scenario_from_dict(merge(merge(BASE, SMALL), extra))
    writer = TraceWriter(None, {}, on_batch=lambda cols: collect.extend(records(cols))) if collect is not None else None
    return api.prepare(sc, writer)


def test_p1_dense_noiseless_equals_momentum_dsgd_reference():
    """p = 1, k = d, sigma = 0, no clipping, full local batch: DO-ADP is momentum D-SGD with the mixing
    (1 - gamma) I + gamma W (x_hat = x after every round). Equal to float64 round-off only (1e-12): the
    gradient service evaluates all agents in one batched call, the reference one agent at a time."""
    alpha, beta, gamma = 0.2, 0.5, 0.4
    sim = _sim(algorithm={"name": "do_adp", "rounds": T, "lr": alpha, "beta": beta, "gamma": gamma,
                          "ratio": 1.0, "batch": 0, "clip": 0.0, "sigma": 0.0})
    n, P = sim.bank.W.shape
    W = torch.as_tensor(sim.W.toarray(), dtype=torch.float64, device=sim.device)
    X, y = sim.X, sim.y.long()
    x = sim.bank.W.clone()
    xh = torch.zeros_like(x)
    m = torch.zeros_like(x)
    for _ in range(T):
        g = torch.stack([sim.model.grad(x[i:i + 1], X[sim.data.parts[i]].unsqueeze(0),
                                        y[sim.data.parts[i]].unsqueeze(0))[0] for i in range(n)])
        m = g + beta * m
        x = x + gamma * (W @ xh - xh) - alpha * m
        xh = x.clone()
    sim.run()
    assert sim.stop_reason == "rounds"
    assert float((x - sim.bank.W).abs().max()) < 1e-12
    assert float((x - sim.bank.W[0]).abs().max()) > 1e-3   # the run really moved (and disagrees)


def test_noise_only_on_active_rounds_with_eq7_sigma_and_topk_messages():
    """Bernoulli(p) activation: every active round is one gradient release (N(0, sigma^2 I) on all d
    coordinates, sigma from eq. (7), rate 1/q, activation p) followed by one top-k message to each
    neighbour in the same round; inactive rounds release and send nothing."""
    events: list = []
    p_act, ratio, eps = 0.7, 0.3, 0.5
    sim = _sim(events, agents={"activation": {"kind": "bernoulli", "period": 1.0, "p": p_act}},
               algorithm={"name": "do_adp", "rounds": T, "lr": 0.05, "ratio": ratio, "epsilon": eps},
               privacy={"delta0": 1e-5})
    sim.run()
    d = sim.bank.W.shape[1]
    k = math.ceil(ratio * d)
    kd = k / d                      # eqs. (6), (7) take the integer k actually kept
    q = len(sim.agents[0].rows)
    sigma = cf.do_adp_theorem1_sigma(eps, 1e-5, q, T, 1.0, kd, p_act, strict=False).sigma
    rel = [e for e in events if isinstance(e, Release)]
    sends = [e for e in events if isinstance(e, Send) and e.tag == "do_adp"]
    assert rel and all(r.what == "gradient" and r.mechanism == "gaussian" and r.size == d for r in rel)
    assert all(r.scale == pytest.approx(sigma, rel=1e-12) for r in rel)
    assert {(r.q, r.p) for r in rel} == {(1.0 / q, p_act)}
    assert all(r.sensitivity == pytest.approx(2 * math.sqrt(kd)) for r in rel)   # eq. (6), G = 1
    rounds_released = {(r.agent, r.t) for r in rel}
    by_sender: dict[tuple, list] = {}
    for s in sends:
        assert s.size == k * (8 + 4)          # float64 values + int32 indices
        assert s.round == round(s.t - 0.01) - 1         # tagged with its round (tick - 1)
        by_sender.setdefault((s.agent, round(s.t, 9)), []).append(s)   # sent when the noisy step is done
    assert set(by_sender) == {(a, round(t, 9)) for a, t in rounds_released}
    assert all(len(v) == 2 for v in by_sender.values())            # ring: both neighbours
    # releases happen exactly on activation ticks < T, and about p of them
    for a in sim.agents:
        ticks = [round(r.t - 0.01) - 1 for r in rel if r.agent == a.id]
        assert all(0 <= t < T for t in ticks) and len(ticks) == len(set(ticks))
    frac = len(rel) / (len(sim.agents) * T)
    assert abs(frac - p_act) < 0.1
    assert sum(isinstance(e, Finish) for e in events) == len(sim.agents)


def test_topk_and_random_activation_equal_matrix_form_reference():
    """p = 0.7, k/d = 0.3, sigma = 0, coordinate clipping, full local batch: the run equals the matrix form
    of Algorithm 1 (App. C) driven by the run's own activations (read from its releases):
        M <- (clip(G) + Theta) eta + beta M,  X <- X - alpha M eta + gamma (W Xhat - Xhat),
        Xhat <- Xhat + TopK(X - Xhat) eta,
    with the consensus on the copies at the start of the round and inactive agents' momentum decaying.
    Equal to float64 round-off (1e-12), as the dense reference above."""
    events: list = []
    alpha, beta, gamma, ratio = 0.3, 0.4, 0.5, 0.3
    sim = _sim(events, agents={"activation": {"kind": "bernoulli", "period": 1.0, "p": 0.7}},
               algorithm={"name": "do_adp", "rounds": T, "lr": alpha, "beta": beta, "gamma": gamma,
                          "ratio": ratio, "batch": 0, "clip": 1.0, "sigma": 0.0})
    n, d = sim.bank.W.shape
    k = math.ceil(ratio * d)
    W = torch.as_tensor(sim.W.toarray(), dtype=torch.float64, device=sim.device)
    X, y = sim.X, sim.y.long()
    x0 = sim.bank.W.clone()
    sim.run()
    eta = torch.zeros(T, n, dtype=torch.bool)
    for r in events:
        if isinstance(r, Release):
            eta[round(r.t - 0.01) - 1, r.agent] = True
    assert 0.5 < float(eta.double().mean()) < 0.9          # some agents really sat rounds out
    x, xh, m = x0, torch.zeros_like(x0), torch.zeros_like(x0)
    for t in range(T):
        on = eta[t].to(sim.device).unsqueeze(1)
        g = torch.stack([sim.model.grad(x[i:i + 1], X[sim.data.parts[i]].unsqueeze(0),
                                        y[sim.data.parts[i]].unsqueeze(0), clip=1.0 / math.sqrt(d),
                                        clip_kind="coordinate")[0] for i in range(n)])
        m = torch.where(on, g + beta * m, beta * m)
        x = x - alpha * torch.where(on, m, torch.zeros_like(m)) + gamma * (W @ xh - xh)
        diff = x - xh
        idx = diff.abs().topk(k, dim=1).indices
        s = torch.zeros_like(diff).scatter_(1, idx, diff.gather(1, idx))
        xh = xh + torch.where(on, s, torch.zeros_like(s))
    assert float((x - sim.bank.W).abs().max()) < 1e-12
    assert float((x - xh).abs().max()) > 1e-3     # the copies really lag (top-k kept 3 of 8)


@pytest.mark.parametrize("rounding, k", [("ceil", 3), ("floor", 2), ("round", 2)])
def test_k_rounding_sets_the_messages_k_and_the_eq7_sigma(rounding, k):
    """k = ratio * d = 0.3 * 8 = 2.4 is rounded as ``k_rounding`` says; every top-k message carries that many
    values, and eq. (6)'s sensitivity and eq. (7)'s sigma use the same integer k."""
    events: list = []
    eps = 0.5
    sim = _sim(events, algorithm={"name": "do_adp", "rounds": 8, "lr": 0.05, "ratio": 0.3, "k_rounding": rounding,
                                  "epsilon": eps}, privacy={"delta0": 1e-5})
    sim.run()
    d, q = sim.bank.W.shape[1], len(sim.agents[0].rows)
    assert d == 8
    sends = [e for e in events if isinstance(e, Send) and e.tag == "do_adp"]
    assert sends and {s.size for s in sends} == {k * (8 + 4)}
    rel = [e for e in events if isinstance(e, Release)]
    sigma = cf.do_adp_theorem1_sigma(eps, 1e-5, q, 8, 1.0, k / d, 1.0, strict=False).sigma
    assert rel and all(r.scale == pytest.approx(sigma, rel=1e-12) for r in rel)
    assert all(r.sensitivity == pytest.approx(2 * math.sqrt(k / d)) for r in rel)


def test_average_moves_only_by_gradient_terms():
    """x_bar_{t+1} = x_bar_t - (alpha/n) sum_i eta_i m_i: compression and consensus never change the
    average (App. C). With beta = 0 and alpha = 1 the total displacement is the sum of the noisy
    gradients the agents released, which we re-derive from the bank after the run."""
    sim = _sim(agents={"activation": {"kind": "bernoulli", "period": 1.0, "p": 0.6}},
               algorithm={"name": "do_adp", "rounds": T, "lr": 0.05, "beta": 0.0, "ratio": 0.25,
                          "sigma": 0.3})
    steps = []
    real = sim.agents[0].privatize.__func__

    def spy(agent, g, **kw):
        out = real(agent, g, **kw)
        steps.append(out.clone())
        return out

    for a in sim.agents:
        a.privatize = spy.__get__(a)
    x0 = sim.bank.W.mean(0).clone()
    sim.run()
    moved = sim.bank.W.mean(0) - x0
    expected = -0.05 * torch.stack(steps).sum(0) / len(sim.agents)
    assert float((moved - expected).abs().max()) < 1e-10
    assert float(sim.bank.W.var(0).sum()) > 0  # agents disagree (compression lag), yet the mean is exact


def test_bad_parameters_fail_with_key():
    """The program function's checks fail while the run is prepared (before any output)."""
    with pytest.raises(InputError) as e:
        _sim(algorithm={"name": "do_adp", "rounds": 10})
    assert e.value.key == "algorithm.epsilon"
    with pytest.raises(InputError) as e:
        _sim(agents={"activation": {"kind": "poisson", "rate": 1.0}},
             algorithm={"name": "do_adp", "rounds": 10, "sigma": 1.0})
    assert e.value.key == "agents.activation.kind"


def test_dpdo_laplace_budget_sums_to_epsilon():
    """DPDO [reconstructed]: every round each agent releases its state with Laplace noise b_t; the
    per-round epsilons Delta_t / b_t = eps (rho_n - rho_s) (rho_s/rho_n)^t form a geometric series whose
    sum over T rounds is rho_n eps (1 - (rho_s/rho_n)^T) < eps (basic composition, pure DP)."""
    events: list = []
    eps, rs, rn = 0.5, 0.9, 0.95
    sim = _sim(events, run={"seed": 4, "until": T - 0.5},
               algorithm={"name": "dpdo", "epsilon": eps, "lr": 0.05, "rho_s": rs, "rho_n": rn})
    sim.run()
    n = len(sim.agents)
    rel = [e for e in events if isinstance(e, Release)]
    assert {r.mechanism for r in rel} == {"laplace"} and {r.what for r in rel} == {"state"}
    rounds = len(rel) // n
    assert len(rel) == n * rounds and rounds >= T - 2
    for a in sim.agents:
        spent = sum(r.sensitivity / r.scale for r in rel if r.agent == a.id)
        assert spent == pytest.approx(rn * eps * (1 - (rs / rn) ** rounds), rel=1e-9)
        assert spent < eps
    with pytest.raises(InputError) as e:
        s2 = _sim(algorithm={"name": "dpdo", "rho_s": 0.99, "rho_n": 0.9})
        s2.program(s2.agents[0], s2.params)
    assert e.value.key == "algorithm.rho_n"


def test_dp_dda_releases_only_when_sampled_but_always_sends():
    """DP-DDA [reconstructed]: a node uses (and privatizes) a gradient with probability p_s; every node
    sends its dense dual variable z every round (100% communication)."""
    events: list = []
    sim = _sim(events, algorithm={"name": "dp_dda", "rounds": T, "sample_p": 0.3, "sigma": 0.5})
    sim.run()
    n, d = sim.bank.W.shape
    rel = [e for e in events if isinstance(e, Release)]
    sends = [e for e in events if isinstance(e, Send)]
    assert len(sends) == n * T * 2 and {s.size for s in sends} == {d * 8}   # ring, float64, dense
    assert abs(len(rel) / (n * T) - 0.3) < 0.08
    assert all(r.scale == 0.5 and r.sensitivity == 2.0 for r in rel)


def test_cpgt_noiseless_dense_gamma1_equals_gradient_tracking_reference():
    """CPGT [reconstructed] with no noise, k = d and gamma = 1: the public copies equal (x, y) after each
    exchange, so it is plain gradient tracking x' = W x - eta y, y' = W y + g(x') - g(x), y_0 = g(x_0)
    (DIGing), here with full local batches and no clipping. Float64 round-off only (batched gradients)."""
    eta = 0.3
    sim = _sim(algorithm={"name": "cpgt", "rounds": T, "lr": eta, "gamma": 1.0, "ratio": 1.0, "batch": 0,
                          "clip": 0.0, "sigma": 0.0})
    n = sim.bank.W.shape[0]
    W = torch.as_tensor(sim.W.toarray(), dtype=torch.float64, device=sim.device)
    X, lab = sim.X, sim.y.long()

    def grad(x):
        return torch.stack([sim.model.grad(x[i:i + 1], X[sim.data.parts[i]].unsqueeze(0),
                                           lab[sim.data.parts[i]].unsqueeze(0))[0] for i in range(n)])

    x = sim.bank.W.clone()
    g = grad(x)
    y = g.clone()
    for _ in range(T):
        x_new = W @ x - eta * y
        g_new = grad(x_new)
        y = W @ y + g_new - g
        x, g = x_new, g_new
    sim.run()
    assert sim.stop_reason == "rounds"
    assert float((x - sim.bank.W).abs().max()) < 1e-12
    assert float((y - sim.bank.state("cpgt_tracker")).abs().max()) < 1e-12
    assert float((x - sim.bank.W[0]).abs().max()) > 1e-3   # the run really moved (and disagrees)
    # gradient tracking: the trackers' mean is the mean of the current local gradients
    assert float((y.mean(0) - grad(x).mean(0)).abs().max()) < 1e-12


def test_cpgt_laplace_on_x_and_y_every_round_summing_to_epsilon():
    """Each round every agent releases exactly two Laplace d-vectors, its state x and its tracker y (what
    leaves it, before top-k), at the scales of the pure-eps calibration: eps / (2T) per release, so the
    per-agent sum of Delta / b is eps. Then one top-k message per variable goes to each neighbour."""
    events: list = []
    eps, ratio, eta = 0.5, 0.3, 0.05
    sim = _sim(events, algorithm={"name": "cpgt", "rounds": T, "lr": eta, "ratio": ratio, "epsilon": eps})
    sim.run()
    n, d = sim.bank.W.shape
    k = math.ceil(ratio * d)
    rel = [e for e in events if isinstance(e, Release)]
    assert {r.mechanism for r in rel} == {"laplace"} and {r.size for r in rel} == {d}
    assert {r.q for r in rel} == {1.0}
    per_round: dict[tuple, list] = {}
    for r in rel:
        per_round.setdefault((r.agent, math.floor(r.t + 1e-9) - 1), []).append(r.what)
    assert set(per_round) == {(a, t) for a in range(n) for t in range(T)}
    assert all(sorted(w) == ["state", "tracker"] for w in per_round.values())
    unit = 2 * math.sqrt(d)
    for r in rel:
        t = math.floor(r.t + 1e-9) - 1
        want = unit * eta * max(t, 1) if r.what == "state" else unit
        assert r.sensitivity == pytest.approx(want, rel=1e-12)
        assert r.scale == pytest.approx(want * 2 * T / eps, rel=1e-12)
    for a in range(n):
        assert sum(r.sensitivity / r.scale for r in rel if r.agent == a) == pytest.approx(eps, rel=1e-12)
    sends = [e for e in events if isinstance(e, Send)]
    assert {s.tag for s in sends} == {"cpgt_x", "cpgt_y"} and {s.size for s in sends} == {k * (8 + 4)}
    assert len(sends) == n * T * 2 * 2                       # 2 variables x 2 ring neighbours per round
    with pytest.raises(InputError) as e:
        s2 = _sim(algorithm={"name": "cpgt", "epsilon": None})
        s2.program(s2.agents[0], s2.params)
    assert e.value.key == "algorithm.epsilon"
