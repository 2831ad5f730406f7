"""``Simulation`` is three parts with one concern each (world, recorder, run loop), none of them a hub: each
holds at most ~15 attributes, only ``netsim/sim/`` assigns them, and the names algorithms and tools read stay
read-only properties of the simulation that give the parts' objects."""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

import netsim
from netsim.scenario import scenario_from_dict
from tests.conftest import BASE, merge

ROOT = Path(netsim.__file__).parent
MOST = 15

# Simulation's read-only names, and the part each one reads
DELEGATED = {
    "scenario": "world.scenario", "streams": "world.streams", "graph": "world.graph", "W": "world.W",
    "gap": "world.gap", "device": "world.device", "dtype": "world.dtype", "data": "world.data",
    "model": "world.model", "bank": "world.bank", "X": "world.splits.X", "y": "world.splits.y",
    "X_test": "world.splits.X_test", "y_test": "world.splits.y_test", "X_val": "world.splits.X_val",
    "y_val": "world.splits.y_val", "train_rows": "world.splits.train_rows", "f_star": "world.f_star",
    "gradients": "world.gradients", "network": "world.network", "churn": "world.churn",
    "activation_moves": "world.activation_moves",
    "writer": "recorder.writer", "emit": "recorder.emit", "emit_row": "recorder.emit_row",
    "counts": "recorder.counts", "metrics": "recorder.metrics", "agent_metrics": "recorder.agent_metrics",
    "mixing_log": "recorder.mixing_log", "progress": "recorder.progress",
    "events_emitted": "recorder.events_emitted",
    "env": "loop.env", "agents": "loop.agents", "steps": "loop.steps", "stop_reason": "loop.stop_reason",
    "engine": "loop.engine", "wall": "loop.wall", "finished_agents": "loop.finished",
    "activations": "loop.marks.activations", "interrupted": "loop.marks.interrupted",
    "programs": "loop.programs.running",
}


def _get(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@pytest.fixture(scope="module")
def sim():
    from netsim import api

    sc = scenario_from_dict(merge(BASE, {
        "run": {"until": 3.0, "checkpoint_every": 1.0},
        "agents": {"count": 6, "churn": {"mean_online": 5.0, "mean_offline": 1.0}},
        "evaluation": {"every": 1.0, "metrics": ["accuracy", "agent_accuracy"]},
    }))
    s = api.prepare(sc)
    s.run()
    return s


def _sizes(sim) -> dict[str, int]:
    parts = {"Simulation": sim, "World": sim.world, "Recorder": sim.recorder, "RunLoop": sim.loop,
             "Marks": sim.loop.marks, "Programs": sim.loop.programs}
    sizes = {name: len(vars(obj)) for name, obj in parts.items()}
    sizes["Splits"] = len(attrs.fields(type(sim.world.splits)))
    return sizes


def test_no_part_holds_more_than_fifteen_attributes(sim):
    sizes = _sizes(sim)
    print(sizes)
    assert sim.loop.stop_reason == "until" and len(sim.recorder.metrics) == 4
    assert {k for k, v in sizes.items() if v > MOST} == set(), sizes
    assert sizes["Simulation"] <= 8  # the parts, the algorithm, the ledger's factory, the services
    assert sum(sizes.values()) >= 50  # what the old hub held is all still somewhere


def test_the_simulations_names_read_the_parts_and_are_read_only(sim):
    from netsim.sim.kernel import Simulation

    for name, path in DELEGATED.items():
        got, want = getattr(sim, name), _get(sim, path)
        assert got is want or got == want, name
        assert isinstance(getattr(Simulation, name), property), name
        with pytest.raises(AttributeError):
            setattr(sim, name, None)
    assert sim.agents[0].sim is sim and sim.env.now == 3.0 and sim.metrics[-1]["time"] == 3.0


def _assigned_outside_sim(root: Path) -> list[str]:
    """Assignments, outside netsim/sim/, to an attribute of a simulation or of its parts: a target whose
    object is reached through a name ``sim`` or an attribute ``.sim``/``.world``/``.loop``/``.recorder``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith("netsim/sim/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for t in targets:
                obj = t.value if isinstance(t, ast.Attribute | ast.Subscript) else None
                while isinstance(obj, ast.Attribute | ast.Subscript):
                    if isinstance(obj, ast.Attribute) and obj.attr in ("sim", "world", "loop", "recorder"):
                        break
                    obj = obj.value
                if obj is not None and (isinstance(obj, ast.Attribute) or
                                        (isinstance(obj, ast.Name) and obj.id == "sim")):
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_nothing_outside_sim_assigns_the_simulations_attributes(tmp_path):
    repo = ROOT.parent
    found = [f for d in ("netsim", "benchmarks", "examples") if (repo / d).is_dir()
             for f in _assigned_outside_sim(repo / d)]
    assert found == [], found
    planted = tmp_path / "netsim" / "plugin.py"
    planted.parent.mkdir()
    planted.write_text("def f(agent, sim):\n    agent.sim.steps = 1\n    sim.loop.steps += 1\n"
                       "    sim.recorder.metrics[0] = {}\n    self.sim = sim\n    x.round = 2\n")
    assert _assigned_outside_sim(tmp_path / "netsim") == ["netsim/plugin.py:2", "netsim/plugin.py:3",
                                                          "netsim/plugin.py:4"]
