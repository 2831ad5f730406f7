"""Centralized FedAvg and FedSAM with the server as agent 0 of the simulated network (the centralized
baselines of Shi et al., "Improving the Model Consistency of Decentralized Federated Learning", ICML
2023, Sec. 5), so the server's traffic crosses links like everyone else's.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data" (AISTATS
2017), Algorithm 1 (FederatedAveraging), with a global learning rate (Reddi et al., ICLR 2021, Alg. 1;
Shi et al. App. B.3: 1.0): each round the server samples ceil(fraction * clients) clients uniformly
without replacement and sends them x; each runs K local steps from x and returns (y_i, n_i); the server
sets x <- x + server_lr * sum_i n_i (y_i - x) / sum_i n_i over the replies that arrived by the
timeout (a lost reply leaves its client out of that round's average).
FedSAM (Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022,
Algorithm 1) is the same with SAM local steps (``dfedsam.local_train``, Shi et al. eq. (3)); Shi et al.
use no weight decay for it (App. B.3) and take its rho from Qu et al. without stating it (default 0.05).

Agent 0 is the server (it holds a data shard it never uses; the clients are agents 1..n-1, so their
shards are those of the decentralized runs with the same seed); use ``topology.kind = "star"``, whose
centre is agent 0. Only the server's model is evaluated (``agent.evaluate_only``): it is the global
model, the clients' rows are their last local models.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

from netsim.algorithms.dfedsam import DFedSAMParams, local_train
from netsim.algorithms.registry import register
from netsim.rounds.kernel import Batch, drive
from netsim.scenario.structure import field, nonneg
from netsim.sim.network import payload_size

if TYPE_CHECKING:
    import torch

SERVER = 0


@attrs.frozen
class FedAvgParams(DFedSAMParams):
    rho: float = field(0.0, check=nonneg, doc="SAM radius (0 = plain SGD: FedAvg)")


@attrs.frozen
class FedSAMParams(DFedSAMParams):
    rho: float = field(0.05, check=nonneg, doc="SAM radius (FedSAM; Qu et al.'s, unstated: 0.05)")
    weight_decay: float = field(0.0, check=nonneg, doc="wd (FedSAM: none, App. B.3)")


@attrs.frozen(slots=True)
class Update:
    """A client's reply: its trained model and its sample count (8 bytes on the wire)."""

    x: torch.Tensor
    n: int

    @property
    def size_bytes(self) -> int:
        return payload_size(self.x) + 8


def aggregate(x: torch.Tensor, updates: dict[int, Update], server_lr: float) -> torch.Tensor:
    """x + server_lr * sum_i n_i (y_i - x) / sum_i n_i (McMahan et al. Alg. 1, with a global lr)."""
    import torch
    total = sum(u.n for u in updates.values())
    delta = torch.zeros_like(x)
    for j in sorted(updates):
        delta.add_(updates[j].x - x, alpha=updates[j].n / total)
    return x + server_lr * delta


def fedavg(agent, p: DFedSAMParams):
    if agent.id == SERVER:
        agent.evaluate_only([SERVER])
        return _server(agent, p)
    return _client(agent, p)


def _server(agent, p: DFedSAMParams):
    clients = list(range(1, agent.agent_count))
    m = max(1, math.ceil(p.sample_fraction * len(clients)))
    rng = agent.rng()
    t = 0
    while True:
        yield agent.wake()
        chosen = sorted(int(j) for j in rng.choice(clients, size=m, replace=False))
        x = agent.params
        yield agent.broadcast(x, tag="global", round=t, to=chosen)
        got = yield agent.gather(tag="update", round=t, senders=chosen, timeout=p.round_timeout)
        if got:
            agent.params = aggregate(x, got, p.server_lr)
        t += 1


def _client(agent, p: DFedSAMParams):
    agent.spawn(_serve(agent, p))
    while True:
        yield agent.wake()  # counts rounds (the run ends after run.rounds); the work is in _serve


def _serve(agent, p: DFedSAMParams):
    spent: set = set()
    while True:
        msg = yield agent.recv(tag="global")
        one = Batch([agent], msg.round, msg.payload.unsqueeze(0), None, None)  # the local steps of DFedSAM's kernel
        y = (yield from drive(agent, local_train(one, p, one.x, msg.round, spent)))[0]
        agent.params = y
        yield agent.send(SERVER, Update(y, len(agent.rows)), tag="update", round=msg.round)


register("fedavg", FedAvgParams)(fedavg)
register("fedsam", FedSAMParams)(fedavg)
