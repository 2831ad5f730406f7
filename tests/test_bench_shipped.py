"""benchmarks/bench_shipped.py's ``--floor``: the model's own arithmetic, timed inside the simulation only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(*extra: str) -> dict:
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_shipped.py"),
                        str(ROOT / "scenarios" / "quickstart.toml"), "--child", "auto", "--set", "agents.count=6",
                        "--set", "run.until=3", *extra], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_floor_is_a_part_of_the_simulations_cpu():
    """The model's grad and evaluate calls are counted (a run of gradient steps spends some CPU in them), never
    more than the simulation's own CPU they are part of; without ``--floor`` nothing is patched."""
    got = child("--floor")
    assert 0 < got["model"] <= got["cpu"] + 1e-3
    assert 0 <= got["model_user"] <= got["user"] + 1e-2
    plain = child()
    assert plain["model"] == 0.0 and plain["model_user"] == 0.0
