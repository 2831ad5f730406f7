"""Round kernels: an algorithm's per-round math written once over a batch of agents, and the communication
patterns that run it in both engines (``kernel``: the form, ``Batch`` and the ``Pattern`` base; ``sync``: barrier
rounds; ``push``: push-to-one-peer gossip; ``broadcast``, ``triggered``, ``pairwise``: the asynchronous patterns;
``windowed``: the windowed engine's eligibility and dispatch)."""

from netsim.rounds.kernel import LOOKAHEAD, ROUNDS, Batch, GradientRequest, Pattern, RoundKernel
from netsim.rounds.sync import SyncKernel, SyncRounds

__all__ = ["LOOKAHEAD", "ROUNDS", "Batch", "GradientRequest", "Pattern", "RoundKernel", "SyncKernel", "SyncRounds"]
