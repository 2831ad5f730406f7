"""Window-synchronous vectorised execution: a prototype of the step after the per-message engine.

The engine (kernel.py) runs every message as its own event: exact, and ~10 µs of Python per event. When no
agent's activation can affect another's inside a window of simulated time, the whole window can run as a
few tensor operations over all agents. This module does it for the simplest such case, D-PSGD (Lian et al.,
"Can Decentralized Algorithms Outperform Centralized Algorithms?", Algorithm 1) with every activation of
a round simultaneous and every message landing before the round's barrier times out: then a window is a
round, and round k is

    rows_i <- agent i's own ``batch`` stream            (the draws the engine makes, in the same order)
    G      <- one batched gradient call for all agents  (the gradient service's own model call)
    X      <- diag(w_ii) X + sum over neighbour slots s of diag(w_s) X[nbr_s]
    X      <- X - gamma_k G

It emits no trace and is not a way to run scenarios; it measures what the engine's per-event Python costs
(benchmarks/bench_windowed.py) and is checked against the engine by a differential test. Exactness: the
engine sums received models in arrival order, and simultaneous arrivals come in event-queue order, which
varies from round to round; the vectorised step sums in ascending sender order. The two agree to float
round-off, and bit for bit when the engine mixes in sender order too (tests/test_windowed.py).
"""

from __future__ import annotations

import numpy as np
import torch

from netsim.scenario.schema import Scenario


def unsupported(sc: Scenario) -> str | None:
    """Why this scenario's rounds are not independent windows (None: they are)."""
    ag, net, alg = sc.agents, sc.network, sc.algorithm
    if alg.name != "dpsgd":
        return f"algorithm {alg.name!r}: only dpsgd"
    if ag.activation.kind != "periodic":
        return f"activation {ag.activation.kind!r}: only periodic (simultaneous activations)"
    same_clocks = all(d.kind == "constant" and d.value == 0.0 for d in (ag.clock_offset, ag.clock_drift))
    if not same_clocks or ag.clock_jitter is not None:
        return "clock offsets, drift or jitter: activations are not simultaneous"
    if ag.compute_time.kind != "constant" or ag.stragglers:
        return "compute times differ between agents"
    if ag.offline or ag.churn or ag.availability:
        return "agents go offline"
    if net.latency.kind != "constant" or net.loss or net.burst or net.outages or net.links or net.trace:
        return "links are not lossless with one constant latency"
    if net.bandwidth is not None or net.uplink is not None:
        return "bandwidth-limited links (transmission times) are not modelled here"
    if ag.compute_time.value + net.latency.value >= float(alg.params.get("round_timeout", 1.0)):
        return "a round's messages can miss the barrier's timeout"
    if sc.topology.dynamic is not None:
        return "the topology changes over time"
    return None


def slots(sim) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """In-neighbours per agent in ascending sender order, padded to the largest in-degree (agent itself at
    weight 0); own weights as Agent.mix computes them: 1 - the received weights, summed in that order."""
    n = len(sim.agents)
    deg = max(len(a.in_neighbors) for a in sim.agents)
    nbr = np.tile(np.arange(n)[:, None], (1, deg))
    w = np.zeros((n, deg))
    own = np.empty(n)
    for a in sim.agents:
        js = sorted(a.in_neighbors)
        nbr[a.id, :len(js)] = js
        w[a.id, :len(js)] = [a.weights[j] for j in js]
        own[a.id] = 1.0 - sum(a.weights[j] for j in js)
    return nbr, w, own


def run_dpsgd(sim, rounds: int) -> torch.Tensor:
    """``rounds`` D-PSGD rounds of every agent of a built (not started) simulation; the final models."""
    why = unsupported(sim.scenario)
    if why is not None:
        raise ValueError(f"not a window-synchronous scenario: {why}")
    p = sim.params
    nbr, w, own = slots(sim)
    W = sim.bank.W.clone()
    dt = W.dtype
    n = W.shape[0]
    # per slot, the agents that share a weight: add_ with a scalar alpha, the very kernel Agent.mix uses
    # (a per-row weight tensor would round differently: multiply, then add)
    groups = []
    for s in range(w.shape[1]):
        for v in np.unique(w[:, s]):
            if v != 0.0:
                at = np.flatnonzero(w[:, s] == v)
                groups.append((torch.from_numpy(at), torch.from_numpy(nbr[at, s]), float(v), len(at) == n))
    own_t = torch.from_numpy(own).to(dt)[:, None]
    svc = sim.gradients
    for k in range(rounds):
        rows = [a.sample_rows(p.batch) for a in sim.agents]
        idx = torch.from_numpy(np.concatenate(rows).astype(np.int64))
        b = len(rows[0])
        G = svc.model.grad(W, svc.X.index_select(0, idx).view(n, b, -1), svc.y.index_select(0, idx).view(n, b),
                           None, "l2")
        out = W * own_t
        for at, src, v, everyone in groups:
            if everyone:
                out.add_(W.index_select(0, src), alpha=v)
            else:
                out[at] = out.index_select(0, at).add_(W.index_select(0, src), alpha=v)
        W = out - (p.lr / (1.0 + p.lr_decay * k)) * G
    return W
