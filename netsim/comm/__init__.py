"""Reusable communication parts: patterns (sync rounds, pairwise gossip, async push, push-sum),
event-triggered sends and compressed payloads. Any algorithm can combine them."""

from netsim.comm.compression import Compressor, Encoded, ErrorFeedback, PublicCopies
from netsim.comm.patterns import AsyncPush, NeighborCopies, PairwiseGossip, PushSum, drain, sync_round
from netsim.comm.stats import comm_summary, stats_of
from netsim.comm.triggers import EventTrigger

__all__ = ["AsyncPush", "Compressor", "Encoded", "ErrorFeedback", "EventTrigger", "NeighborCopies",
           "PairwiseGossip", "PublicCopies", "PushSum", "comm_summary", "drain", "stats_of", "sync_round"]
