"""DFedSAM / DFedSAM-MGS (Shi et al., ICML 2023) and the FedAvg/FedSAM server (netsim/algorithms/dfedsam.py, fedavg.py).

Closed forms: Q gossip steps are W^Q (or the product of the random graphs' matrices), a SAM step is
the hand-computed two-pass step on the same mini-batch, rho = 0 is DFedAvg, the server's update is the
data-weighted average of the clients' models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from netsim import api
from netsim.errors import InputError
from netsim.sim.streams import Streams

from .conftest import BASE, merge

ALGO = {"lr": 0.2, "lr_decay": 0.9, "batch": 8, "local_steps": 2, "weight_decay": 0.01, "round_timeout": 0.2}


def _sim(scenario, name: str, rounds: int = 1, count: int = 6, topology=None, **algo):
    sc = scenario(run={"seed": 5, "rounds": rounds, "until": 50.0},
                  agents={"count": count, "compute_time": {"kind": "constant", "value": 0.01},
                          "activation": {"kind": "periodic", "period": 1.0}},
                  topology=topology or {"kind": "ring"},
                  algorithm={"name": name, **ALGO, **algo}, model={"kind": "logistic", "dtype": "float64"})
    return api.prepare(sc)


def _spread(sim) -> torch.Tensor:
    """Distinct starting models (the common init would make any mixing trivially exact)."""
    g = torch.Generator().manual_seed(0)
    X0 = torch.randn(sim.bank.W.shape, generator=g, dtype=sim.bank.W.dtype)
    sim.bank.W.copy_(X0)
    return X0


@pytest.mark.parametrize("Q", [1, 3])
def test_q_gossip_steps_are_w_to_the_q(scenario, Q):
    sim = _sim(scenario, "dfedsam", local_steps=0, gossip_steps=Q, topology={"kind": "torus", "rows": 2})
    X0 = _spread(sim)
    sim.run()
    W = sim.W.toarray()
    expect = np.linalg.matrix_power(W, Q) @ X0.numpy()
    np.testing.assert_allclose(sim.bank.W.cpu().numpy(), expect, rtol=0, atol=1e-13)
    assert not np.allclose(expect, X0.numpy())
    # the mean is preserved (doubly stochastic W) and the disagreement contracts
    np.testing.assert_allclose(sim.bank.W.mean(0).cpu().numpy(), X0.mean(0).numpy(), atol=1e-13)


def test_random_neighbors_gossip_is_the_product_of_the_drawn_matrices(scenario):
    from netsim.algorithms.dfedsam import RandomInNeighbors

    k, Q, n = 3, 2, 8
    sim = _sim(scenario, "dfedsam_mgs", local_steps=0, gossip_steps=Q, random_neighbors=k, count=n,
               topology={"kind": "complete"})
    X0 = _spread(sim)
    sim.run()
    M = np.eye(n)
    for q in range(Q):
        ins, outs = RandomInNeighbors.of(sim.agents[0], k).at(0, q)
        Wq = np.zeros((n, n))
        for i in range(n):
            assert len(ins[i]) == k and i not in ins[i]
            Wq[i, [i, *ins[i]]] = 1.0 / (k + 1)
            assert sorted(j for j in range(n) if i in ins[j]) == outs[i]
        M = Wq @ M
    assert not np.allclose(M, M.T)  # directed, row-stochastic: the DisPFL-style draw (App. B.4)
    np.testing.assert_allclose(sim.bank.W.cpu().numpy(), M @ X0.numpy(), rtol=0, atol=1e-13)
    # the same draw whatever the algorithm (an addressed stream)
    other = _sim(scenario, "dfedavg", local_steps=0, random_neighbors=k, count=n,
                 topology={"kind": "complete"})
    assert RandomInNeighbors.of(other.agents[0], k).at(0, 1) == RandomInNeighbors.of(sim.agents[0], k).at(0, 1)


def _run_trace(tmp_path, name, **algo):
    d = merge(BASE, {"run": {"seed": 2, "rounds": 3, "until": 50.0},
                     "agents": {"count": 5, "activation": {"kind": "periodic", "period": 1.0}},
                     "algorithm": {"name": name, **ALGO, **algo},
                     "model": {"kind": "logistic", "dtype": "float64"}})
    from netsim.scenario import scenario_from_dict

    holder = {}
    res = api.run(scenario_from_dict(d), out=tmp_path / name, setup=lambda s: holder.setdefault("sim", s))
    return res, holder["sim"].bank.W.clone()


def test_rho_zero_is_dfedavg_byte_for_byte(tmp_path):
    a, Wa = _run_trace(tmp_path, "dfedsam", rho=0.0)
    b, Wb = _run_trace(tmp_path, "dfedavg")
    assert torch.equal(Wa, Wb)
    assert a.events.equals(b.events)
    c, Wc = _run_trace(tmp_path, "dfedsam", rho=0.05)  # the test can fail: SAM changes both
    assert not torch.equal(Wa, Wc)
    assert c.summary["gradients"] == 2 * a.summary["gradients"]  # two passes per SAM step


def _logistic_grad(w: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w = w.clone().requires_grad_(True)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(X @ w[:-1] + w[-1], y.to(w.dtype))
    (g,) = torch.autograd.grad(loss, w)
    return g


def test_sam_step_matches_the_hand_computed_two_pass_step(scenario):
    """One round, K = 1: z_i = x - eta (grad(x + rho g/||g||; xi) + wd x) with the SAME batch xi, then
    one gossip step (ring of 6, Metropolis weights 1/3)."""
    rho, B, lr, wd = 0.5, 8, 0.2, 0.01
    sim = _sim(scenario, "dfedsam", local_steps=1, rho=rho, batch=B, lr=lr, weight_decay=wd)
    X0 = _spread(sim)
    sim.run()
    streams = Streams(5)
    Z = []
    for i in range(6):
        part = sim.data.parts[i]
        rows = part[streams.rng("batch", i).integers(0, len(part), B)]
        X, y = sim.X[rows].cpu(), sim.y[rows].cpu()
        x = X0[i]
        g = _logistic_grad(x, X, y)
        g2 = _logistic_grad(x + rho * g / (g.norm() + 1e-12), X, y)
        Z.append(x - lr * (g2 + wd * x))
    expect = sim.W.toarray() @ torch.stack(Z).numpy()
    np.testing.assert_allclose(sim.bank.W.cpu().numpy(), expect, rtol=0, atol=1e-12)


def test_local_epochs_are_shuffled_passes_over_the_shard(scenario):
    """local_epochs = 2, B = 13: each epoch is a fresh permutation of the client's rows (the agent's batch
    stream) cut into ceil(n_i / 13) batches, the last one smaller; every SAM step uses one of them for
    both passes. Hand-computed from the same stream, then one gossip step."""
    rho, B, lr, wd, E = 0.5, 13, 0.2, 0.01, 2
    sim = _sim(scenario, "dfedsam", local_steps=1, local_epochs=E, rho=rho, batch=B, lr=lr, weight_decay=wd)
    X0 = _spread(sim)
    sim.run()
    streams = Streams(5)
    Z, steps = [], 0
    for i in range(6):
        part = sim.data.parts[i]
        n = len(part)
        assert n % B != 0  # the last batch is a short one
        y = X0[i]
        for _ in range(E):
            order = part[streams.rng("batch", i).permutation(n)]
            batches = [order[s:s + B] for s in range(0, n, B)]
            assert sorted(np.concatenate(batches).tolist()) == sorted(part.tolist())  # each row once
            for rows in batches:
                X, yy = sim.X[rows].cpu(), sim.y[rows].cpu()
                g = _logistic_grad(y, X, yy)
                g2 = _logistic_grad(y + rho * g / (g.norm() + 1e-12), X, yy)
                y = y - lr * (g2 + wd * y)
                steps += 1
        Z.append(y)
    assert sim.gradients.evaluated == 2 * steps  # two passes per SAM step, K_i = E ceil(n_i / B)
    expect = sim.W.toarray() @ torch.stack(Z).numpy()
    np.testing.assert_allclose(sim.bank.W.cpu().numpy(), expect, rtol=0, atol=1e-12)


def test_local_epochs_refuse_the_dp_option(scenario):
    with pytest.raises(InputError, match=r"algorithm.local_epochs.*Poisson"):
        _sim(scenario, "dfedsam", local_epochs=1, noise_multiplier=1.0)


def test_momentum_is_heavy_ball_reset_each_round(scenario):
    """DFedAvgM, K = 2, full batch: y1 = x - eta g(x); y2 = y1 - eta g(y1) + theta (y1 - x)."""
    lr, th = 0.3, 0.9
    sim = _sim(scenario, "dfedavgm", local_steps=2, batch=0, lr=lr, weight_decay=0.0)
    X0 = _spread(sim)
    sim.run()
    Z = []
    for i in range(6):
        X, y = sim.X[sim.data.parts[i]].cpu(), sim.y[sim.data.parts[i]].cpu()
        x = X0[i]
        y1 = x - lr * _logistic_grad(x, X, y)
        Z.append(y1 - lr * _logistic_grad(y1, X, y) + th * (y1 - x))
    np.testing.assert_allclose(sim.bank.W.cpu().numpy(), sim.W.toarray() @ torch.stack(Z).numpy(), atol=1e-12)


def test_fedavg_server_takes_the_data_weighted_average(scenario):
    """Server = agent 0, all 4 clients sampled, K = 1 full-batch step: x1 = sum n_i y_i / sum n_i."""
    lr = 0.5
    sim = _sim(scenario, "fedavg", local_steps=1, batch=0, lr=lr, weight_decay=0.0, sample_fraction=1.0,
               count=5, topology={"kind": "star"})
    sizes = [len(p) for p in sim.data.parts[1:]]
    sim.run()
    x0 = torch.zeros(sim.bank.W.shape[1], dtype=torch.float64)
    ys = [x0 - lr * _logistic_grad(x0, sim.X[p].cpu(), sim.y[p].cpu()) for p in sim.data.parts[1:]]
    expect = sum(n * y for n, y in zip(sizes, ys, strict=True)) / sum(sizes)
    assert torch.allclose(sim.bank.W[0].cpu(), expect, atol=1e-12)
    # only the server's (global) model is evaluated
    _, acc = sim.model.evaluate(sim.bank.W[:1], sim.X_test, sim.y_test)
    assert sim.metrics[-1]["accuracy"] == pytest.approx(float(acc[0]))
    assert sim.metrics[-1]["consensus"] == 0.0


def test_aggregate_weights_and_server_lr():
    from netsim.algorithms.fedavg import Update, aggregate

    x = torch.tensor([1.0, 1.0], dtype=torch.float64)
    ups = {3: Update(torch.tensor([3.0, 1.0], dtype=torch.float64), 1),
           1: Update(torch.tensor([1.0, 5.0], dtype=torch.float64), 3)}
    assert torch.equal(aggregate(x, ups, 1.0), torch.tensor([1.5, 4.0], dtype=torch.float64))
    assert torch.equal(aggregate(x, ups, 0.5), torch.tensor([1.25, 2.5], dtype=torch.float64))


def test_fedavg_samples_a_fraction_and_counts_server_traffic(tmp_path):
    from netsim.scenario import scenario_from_dict

    d = merge(BASE, {"run": {"seed": 1, "rounds": 4, "until": 50.0},
                     "agents": {"count": 11, "activation": {"kind": "periodic", "period": 1.0}},
                     "topology": {"kind": "star"},
                     "algorithm": {"name": "fedsam", **ALGO, "sample_fraction": 0.3}})
    res = api.run(scenario_from_dict(d), out=tmp_path / "f")
    ev = res.events.to_pandas()
    sends = ev[ev.kind == "send"]
    down, up = sends[sends.tag == "global"], sends[sends.tag == "update"]
    assert set(down.agent) == {0} and len(down) == 4 * 3          # ceil(0.3 * 10) = 3 clients per round
    assert len(up) == 12 and set(up.peer) == {0}
    assert (up["size"] == down["size"].iloc[0] + 8).all()          # model + the sample count
    assert res.summary["gradients"] == 12 * ALGO["local_steps"] * 2  # FedSAM: two passes per step


def test_dp_option_privatizes_both_sam_passes(tmp_path):
    a, _ = _run_trace(tmp_path, "dfedsam", rho=0.05, noise_multiplier=1.0, clip=0.5)
    b, _ = _run_trace(tmp_path, "dfedavg", noise_multiplier=1.0, clip=0.5)
    ra = (a.events.to_pandas().kind == "release").sum()
    rb = (b.events.to_pandas().kind == "release").sum()
    assert rb == 5 * 3 * ALGO["local_steps"] and ra == 2 * rb
    c, _ = _run_trace(tmp_path, "dfedavg")
    assert (c.events.to_pandas().kind == "release").sum() == 0  # no DP unless asked (as in the paper)


def test_bad_random_neighbors_is_a_clean_input_error_before_the_run(scenario):
    with pytest.raises(InputError, match=r"algorithm.random_neighbors.*must be in \[1, 5\] for 6 agents"):
        _sim(scenario, "dfedsam", random_neighbors=6, count=6, topology={"kind": "complete"})


def test_cli_validate_names_the_key(tmp_path):
    from typer.testing import CliRunner

    from netsim.cli import app

    f = tmp_path / "s.toml"
    f.write_text("""[run]\nrounds = 2\n[agents]\ncount = 4\n[topology]\nkind = "complete"\n
[algorithm]\nname = "dfedsam_mgs"\nrandom_neighbors = 4\n""")
    r = CliRunner().invoke(app, ["validate", str(f)])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "algorithm.random_neighbors" in lines[0] and str(f) in lines[0]


def test_round_from_clock_keeps_skipping_clients_in_step(tmp_path):
    """Bernoulli activation: with own round counts a client that skipped a tick tags its models with
    an older round than its neighbours'; numbered by the tick, every model sent during tick k (global
    time [k, k+1), no clock drift) belongs to round k - 1."""
    from netsim.scenario import scenario_from_dict

    Q = 4
    for how in ("count", "clock"):
        d = merge(BASE, {"run": {"seed": 4, "rounds": 8, "until": 50.0},
                         "agents": {"count": 6, "activation": {"kind": "bernoulli", "period": 1.0, "p": 0.7}},
                         "algorithm": {"name": "dfedsam_mgs", **ALGO, "round_from": how, "gossip_steps": Q},
                         "model": {"kind": "logistic", "dtype": "float64"}})
        ev = api.run(scenario_from_dict(d), out=tmp_path / how).events.to_pandas()
        sends = ev[(ev.kind == "send") & (ev.tag == "gossip")]
        aligned = (sends["round"] // Q) == (np.floor(sends["t"]).astype(int) - 1)
        assert aligned.all() if how == "clock" else not aligned.all()


def test_mgs_keeps_clients_closer_than_dfedsam_and_dfedavg(tmp_path):
    """The paper's consistency claim on a small non-IID ring: Q = 4 gossip steps give a markedly
    lower consensus distance at every evaluation (the same seeds, init and batches)."""
    from netsim.scenario import scenario_from_dict

    cons = {}
    for name in ("dfedsam_mgs", "dfedsam", "dfedavg"):
        d = merge(BASE, {"run": {"seed": 1, "rounds": 12, "until": 50.0, "trace": False},
                         "agents": {"count": 10, "activation": {"kind": "periodic", "period": 1.0}},
                         "data": {"kind": "synthetic", "samples": 1000, "features": 5,
                                  "partition": "dirichlet_classes", "alpha": 0.3},
                         "algorithm": {"name": name, **ALGO, "lr": 0.5, "local_steps": 3},
                         "evaluation": {"every": 2.0}})
        res = api.run(scenario_from_dict(d), out=tmp_path / name)
        cons[name] = np.array([m["consensus"] for m in res.metrics])
    assert (cons["dfedsam_mgs"][1:] < 0.5 * cons["dfedsam"][1:]).all()
    assert (cons["dfedsam_mgs"][1:] < 0.5 * cons["dfedavg"][1:]).all()
