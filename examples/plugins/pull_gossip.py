"""A plugin algorithm of a one-sided exchange: pull gossip learning.

Each activation (Ormándi, Hegedűs, Jelasity, "Gossip learning with linear models on fully distributed data",
Concurrency and Computation 2013, Algorithm 1's UPDATE and MERGE, with the model pulled instead of pushed: Demers
et al., "Epidemic algorithms for replicated database maintenance", PODC 1987, the pull variant):

    x_i <- x_i - gamma grad F_i(x_i)              (the local step, once the gradient is back)
    j   <- a random out-neighbour; ask j for its model (a 1-byte request), wait for ONE reply or ``reply_timeout``
    x_i <- (1 - alpha) x_i + alpha x_j            (the merge; alpha = 1/2 is gossip learning's average)

j answers with its current model and keeps it: unlike AD-PSGD's exchange nothing is averaged on j's side, so no
lock is needed and a lost reply changes nothing. Written as a kernel of the pairwise pattern with ``pull=True``
(rounds/pairwise.py: the program; rounds/pairwise_windows.py: its lookahead windows), so ``--engine windowed`` plays
it byte for byte with no other code.

    netsim run examples/momentum_push.toml --plugin examples/plugins/pull_gossip.py \\
        --set 'algorithm={name="pull_gossip", lr=0.3, batch=8}' --out runs/pull
"""

from __future__ import annotations

import attrs

from netsim.algorithms.gossip import Gossip
from netsim.algorithms.registry import register
from netsim.rounds.pairwise import Pairwise
from netsim.scenario.structure import at_least, field, fraction, nonneg, positive


@attrs.frozen
class PullGossipParams:
    lr: float = field(0.1, check=nonneg, doc="gamma, the local step size (0: pull averaging alone)")
    batch: int = field(32, check=at_least(0), doc="rows per gradient (0: the full local batch)")
    alpha: float = field(0.5, check=fraction,
                         doc="the weight of the pulled model in the merge (1/2: the average)")
    reply_timeout: float = field(1.0, check=positive, doc="seconds an agent waits for the pulled model")


@register("pull_gossip", PullGossipParams)
class PullGossip(Gossip):
    """Randomized gossip's kernel (its local step first, its timeout, no lock) with the exchange made a pull: every
    agent pulls, none averages on a request; the reply is merged by ``combine``."""

    pattern = Pairwise(tags=("pull.req", "pull.rep"), pull=True)
    reads = Gossip.reads | {"alpha"}

    def combine(self, b, p, received):
        b.x = b.x + p.alpha * (received - b.x)
