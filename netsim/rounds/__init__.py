"""Round kernels: an algorithm's per-round math written once over a batch of agents, and the communication
patterns that run it in both engines (``kernel``: the form; ``sync``: barrier rounds; ``push``: push-to-one-peer
gossip; ``windowed``: the windowed engine's eligibility and dispatch)."""

from netsim.rounds.kernel import Batch, GradientRequest, RoundKernel
from netsim.rounds.sync import SyncRounds

__all__ = ["Batch", "GradientRequest", "RoundKernel", "SyncRounds"]
