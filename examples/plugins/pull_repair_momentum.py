"""A plugin algorithm written against the Agent API only: D-PSGD with heavy-ball momentum whose rounds
repair a lost neighbour's model by pulling it.

Each round (Lian et al. 2017's D-PSGD, Algorithm 1, with Polyak's heavy-ball momentum on the local step):

    m_i <- beta m_i + grad F_i(x_i)                 (momentum: named per-agent state, ``agent.state``)
    broadcast x_i; gather {x_j} of the round         (``agent.gather``: {src: payload}, whatever arrived)
    for each neighbour j whose model did not arrive:
        ask j for its current model, wait for ONE reply  (``agent.send`` + ``agent.recv``: a Message or None)
    x_i <- sum_j W_ij x_j - gamma m_i                (``agent.mix``: a neighbour still missing keeps its
                                                      weight on x_i)

Every agent also runs a helper program (``agent.spawn``) that answers pull requests with its current model.
Counters go to summary.json through ``agent.stats`` (``pull_requests``, ``pull_repaired``).

    netsim run scenarios/quickstart.toml --plugin examples/plugins/pull_repair_momentum.py \\
        --set algorithm.name=pull_repair_momentum --out runs/pull_repair
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.scenario.structure import at_least, field, positive


@attrs.frozen
class PullRepairParams:
    lr: float = field(0.5, check=positive, doc="gamma, the step size")
    beta: float = field(0.5, check=lambda v: None if 0 <= v < 1 else f"must be in [0, 1), got {v}",
                        doc="heavy-ball momentum")
    batch: int = field(16, check=at_least(1), doc="rows per gradient")
    round_timeout: float = field(0.2, check=positive, doc="seconds the round's gather waits")
    pull_timeout: float = field(0.1, check=positive, doc="seconds a pull waits for its reply")


def serve(agent):
    """Answer every pull request with this agent's current model, tagged with the request's round."""
    while True:
        req = yield agent.recv(tag="pull.req")            # one Message: its sender matters
        yield agent.send(req.src, agent.params, tag="pull.rep", round=req.round)


@register("pull_repair_momentum", PullRepairParams)
def pull_repair_momentum(agent, p: PullRepairParams):
    m = agent.state("pull_repair.momentum")               # a view of the bank: checkpoints keep it
    agent.spawn(serve(agent))
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        g = yield agent.gradient(batch=p.batch, params=x)
        m.mul_(p.beta).add_(g)
        yield agent.broadcast(x, tag="model", round=k)
        got = yield agent.gather(tag="model", round=k, timeout=p.round_timeout)
        for j in agent.in_neighbors:
            if j in got:
                continue
            agent.stats.add("pull_requests")
            yield agent.send(j, None, tag="pull.req", round=k, size=8)
            reply = yield agent.recv(tag="pull.rep", round=k, timeout=p.pull_timeout)
            if reply is not None:
                got[reply.src] = reply.payload
                agent.stats.add("pull_repaired")
        agent.params = agent.mix(x, got) - p.lr * m
        k += 1
