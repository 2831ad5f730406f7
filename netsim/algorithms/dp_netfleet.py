"""DP-NET-FLEET [reconstructed]: local steps with a recursive gradient estimator and tracking.

Zhang et al., "NET-FLEET: Achieving Linear Convergence Speedup for Fully Decentralized Federated
Learning with Heterogeneous Data" (MobiHoc 2022, arXiv:2208.08490). RECONSTRUCTED from a
description of the method as PDSL's baseline, not verified against the original paper. Round t of agent i:

  1  exchange (x_i, v_i); x <- sum_j w_ij x_j, v <- sum_j w_ij v_j                (consensus, tracking)
  2  xi <- a fresh mini-batch; g^0 = DP grad F_i(x; xi); v^0 = v + g^0 - g_prev    (tracking correction)
  3  for k = 0..K-1: x^{k+1} = x^k - eta v^k; g^{k+1} = DP grad F_i(x^{k+1}; xi);
                     v^{k+1} = v^k + g^{k+1} - g^k                               (recursive, same xi)
  4  keep x = x^K, v = v^K, g_prev = g^K

DP: every stochastic-gradient evaluation is clipped to C and noised with N(0, sigma^2 I)
before it enters v (one ledger release each, K + 1 per round); x and v are post-processing.
Defaults K = 5 and eta = gamma. Once an agent's budget cap is reached (a release refused) it takes no more
gradients that round (its x and v as they stand) and only gossips from then on.

As barrier rounds (``SyncRounds``): step 1 is the round's exchange (one message (x_i, v_i) per neighbour, the two
rows concatenated), steps 2-4 are ``combine``'s K + 1 waves of gradients at the mixed point, so the gradients of
every agent of a round are one batched call per wave in both engines.
"""

from __future__ import annotations

import attrs

from netsim.algorithms.pdsl import DPGradientParams, check_setting, resolve_sigma
from netsim.algorithms.registry import register
from netsim.rounds import SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, positive


@attrs.frozen
class DPNetFleetParams(DPGradientParams):
    lr: float = field(0.001, check=positive, doc="eta: local step size")
    local_steps: int = field(5, check=at_least(1), doc="K local recursive steps per round")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours")


@register("dp_netfleet", DPNetFleetParams)
class DPNetFleet(SyncKernel):
    """DP-NET-FLEET's round as a barrier round whose K + 1 gradients come after the exchange (see the module
    docstring). State: v and g_prev of every agent, rows of the parameter bank (checkpoints keep them)."""

    pattern = SyncRounds(tag="fleet")
    reads = frozenset({"lr", "local_steps", "clip", "clip_mode", "calibration", "sigma", "epsilon", "delta",
                       "sigma_per_eps", "phi_min", "batch"})
    per_row = frozenset({"xv"})  # each agent's (x_i, v_i) as sent

    def init(self, agents, p):
        a = agents[0]  # sigma is the run's (the calibration's, the mixing matrix's), not an agent's
        return {"sigma": resolve_sigma(a, p), "v": a.shared_state("netfleet.v"),
                "gprev": a.shared_state("netfleet.gprev")}

    def check(self, sim, p):
        check_setting(sim, p)  # undirected graph, before the run

    def local(self, b, p):
        import torch

        b.xv = torch.cat([b.x, _rows(b, b.state["v"])], dim=1)        # (x_i, v_i), sent as one row
        b.send(b.xv)

    def combine(self, b, p, got):
        P = b.x.shape[1]
        xv = b.mix(b.xv, got)                                          # step 1: consensus and tracking
        x, v = xv[:, :P], xv[:, P:]                                    # (a fresh tensor: updated in place below)
        gprev = _rows(b, b.state["gprev"])
        xi = b.sample_rows(p.batch)                                    # step 2: one mini-batch for the round
        g, on = yield from self._dp_grad(b, p, x, xi, [True] * len(b))  # g^0 = DP grad F_i(x; xi)
        took = on                                                      # (a refused g^0: no step this round)
        v = _update(on, v, lambda v: v.add_(g).sub_(gprev))            # v^0 = v + g^0 - g_prev
        step = None
        for _ in range(p.local_steps):                                 # step 3, K recursive steps on xi
            if not any(on):
                break
            step = _scaled(v, p.lr, step)
            x = _update(on, x, lambda x, s=step: x.sub_(s))           # x^{k+1} = x^k - eta v^k
            g_next, ok = yield from self._dp_grad(b, p, x, xi, on)    # g^{k+1} = DP grad F_i(x^{k+1}; xi)
            v = _update(ok, v, lambda v, d=g_next, g=g: v.add_(d).sub_(g))  # v^{k+1} = v^k + g^{k+1} - g^k
            g = _where(ok, g_next, g)
            on = ok
        _write(b, b.state["gprev"], _where(took, g, gprev))            # step 4: g_prev = g^K, v = v^K, x = x^K
        _write(b, b.state["v"], v)
        b.set_params(x)

    def refusal(self, sim, path):
        from netsim.rounds.windowed import budget_cap_refusal

        return budget_cap_refusal(sim)  # an agent out of budget stops asking for gradients inside a round

    def _dp_grad(self, b, p, at, xi, on):
        """A wave of gradients at ``at`` on ``xi`` (agents not ``on`` ask for none), each clipped (batch mode, eqs.
        10/13) and noised, one ledger release each; returns the rows (zeros where none) and who released."""
        n = len(b)
        asks = xi if all(on) else [r if o else None for r, o in zip(xi, on, strict=True)]
        clip = p.clip if p.clip_mode == "per_example" else None
        raw = yield b.gradients(at, asks, clip=clip)
        ns = [m for m in range(n) if on[m]]
        part = b.part(ns)
        g = raw if len(ns) == n else raw[ns]
        if p.clip_mode == "batch":
            g, sens = part.clip(g, p.clip), 2.0 * p.clip
        else:
            sens = p.clip / p.batch
        q = [min(1.0, p.batch / len(a.rows)) for a in part.agents]
        noisy = part.privatize(g, [b.state["sigma"]] * len(ns), [sens] * len(ns), q, what="gradient")
        if len(ns) == n and not part.refused(noisy):
            return part.stack(noisy), on
        out, ok = raw.new_zeros(raw.shape), [False] * n
        for m, r in zip(ns, noisy, strict=True):
            if r is not None:
                out[m], ok[m] = r, True
        return out, ok


def _rows(b, state):
    """The batch's agents' rows of a state tensor (every agent's, as the bank keeps it), as a copy."""
    if len(b) == 1:
        return state[b.agents[0].id].unsqueeze(0).clone()
    return state.index_select(0, b.index())


def _write(b, state, rows) -> None:
    """The batch's agents' rows of a state tensor := ``rows``."""
    if len(b) == 1:
        state[b.agents[0].id].copy_(rows[0])
    else:
        state.index_copy_(0, b.index(), rows)


def _update(on, rows, op):
    """``op`` (in place, the same float operations as written out) on the rows of agents ``on``; the others keep
    theirs. In place over the whole batch when every agent is on: a windowed batch's (B, P) temporaries are tens
    to hundreds of MB, each paged in afresh, where the events engine's rows of one agent stay in cache."""
    if all(on):
        return op(rows)
    return _where(on, op(rows.clone()), rows)


def _scaled(v, lr, out):
    """``lr * v`` into ``out`` (reused from the last step when there is one)."""
    import torch

    if out is None or out.shape != v.shape:
        return v * lr
    return torch.mul(v, lr, out=out)


def _where(on, new, old):
    """Row n of ``new`` where ``on[n]``, else of ``old`` (agents whose budget cap stopped them keep their rows)."""
    if all(on):
        return new
    import torch

    return torch.where(torch.tensor(on, device=new.device).unsqueeze(1), new, old)
