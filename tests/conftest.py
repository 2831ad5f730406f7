"""Shared helpers: small scenarios built in code, runs into tmp folders."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def netsim_cli(*args: str) -> list[str]:
    """argv running the CLI with this interpreter (``python -m netsim``: no installed entry point needed)."""
    return [sys.executable, "-m", "netsim", *args]


def cli_env() -> dict[str, str]:
    """os.environ for a CLI subprocess, with the repository first on PYTHONPATH (whatever the cwd) and the
    caller's PYTHONPATH kept (dependencies installed outside site-packages)."""
    parts = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}

BASE: dict[str, Any] = {
    "name": "t",
    "run": {"seed": 3, "until": 20.0},
    "agents": {"count": 8, "compute_time": {"kind": "constant", "value": 0.01},
               "activation": {"kind": "periodic", "period": 0.5}},
    "topology": {"kind": "ring"},
    "network": {"latency": {"kind": "constant", "value": 0.01}},
    "data": {"kind": "synthetic", "samples": 800, "features": 5},
    "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2},
    "evaluation": {"every": 5.0},
}


def merge(base: dict, extra: dict) -> dict:
    """Deep merge; a table with a ``kind`` or ``name`` (a distribution, an algorithm) replaces the old one whole."""
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not {"kind", "name"} & set(v):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


@pytest.fixture
def scenario():
    """scenario(**sections) -> Scenario built from BASE with the given sections merged in."""
    from netsim.scenario import scenario_from_dict

    def make(**extra):
        return scenario_from_dict(merge(BASE, extra))

    return make


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """A pytest-xdist worker reports that it has finished when this hook returns; execnet then gives it 5 s to
    end before it interrupts it with SIGINT, and pytest's exit collects garbage five times over the whole
    heap (2-4 s with torch, Textual and DuckDB loaded, more on a busy machine): the interrupt landed in a
    garbage-collector callback and a green run ended with a KeyboardInterrupt traceback. Collect once
    here, before the report (a finalizer's error is still reported), and freeze what survives, so the exit's
    collections look only at what is newer."""
    import gc

    gc.collect()
    gc.freeze()
