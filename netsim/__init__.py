"""netsim: an asynchronous, agent-based, discrete-event simulator for decentralized and
differentially private learning. ``netsim.run(...)`` is the Python entry point."""

from __future__ import annotations

import os as _os

# OpenMP worker threads that spin while idle make torch's CPU kernels 5-10x slower when other processes
# share the cores (MNIST MLP scenario, 2 busy cores: 29.6 s spinning vs 3.8 s passive). Set before torch
# loads; a user's own OMP_WAIT_POLICY wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"


def run(*args, **kwargs):
    """See ``netsim.api.run`` (imported lazily to keep ``netsim --help`` instant)."""
    from netsim.api import run as _run

    return _run(*args, **kwargs)
