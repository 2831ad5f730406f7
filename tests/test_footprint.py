"""Scenarios that cannot fit are refused before anything is built: the estimate from the scenario's keys."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from netsim.errors import InputError
from netsim.scenario import load_scenario
from netsim.sim import footprint

ROOT = Path(__file__).resolve().parent.parent


def test_a_dense_graph_at_scale_is_refused_at_once_with_the_estimate(tmp_path):
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "netsim", "run", "scenarios/quickstart.toml", "--set",
                        "agents.count=1000000", "--set", "topology.kind=complete", "--out", tmp_path / "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and time.perf_counter() - t < 60  # seconds, not the 75 s of building it
    out = r.stdout + r.stderr
    assert "topology: this scenario needs about 545.7 TiB" in out and "999,999,000,000 directed edges" in out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


def test_the_estimate_counts_edges_agents_and_data():
    sc = load_scenario(ROOT / "scenarios/quickstart.toml", {"agents.count": 1000, "topology.kind": "complete"})
    parts = {what: size for _, what, size in footprint.estimate(sc)}
    assert parts["a complete graph of 999,000 directed edges"] == 999_000 * footprint.EDGE_BYTES
    assert parts["1,000 agents"] == 1000 * footprint.AGENT_BYTES
    ring = load_scenario(ROOT / "scenarios/quickstart.toml", {"agents.count": 100_000})
    footprint.check(ring, memory=8 * 2**30)  # the 100,000-agent ring runs in 8 GiB (measured: 2.7 GiB)
    with pytest.raises(InputError, match="agents.count: this scenario needs about"):
        footprint.check(ring, memory=2**29)
    assert footprint.edges(ring.topology, 100_000) == 200_000
