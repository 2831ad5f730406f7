"""netsim: an asynchronous, agent-based, discrete-event simulator for decentralized and
differentially private learning. ``netsim.run(...)`` is the Python entry point."""

from __future__ import annotations

__version__ = "0.1.0"


def run(*args, **kwargs):
    """See ``netsim.api.run`` (imported lazily to keep ``netsim --help`` instant)."""
    from netsim.api import run as _run

    return _run(*args, **kwargs)
