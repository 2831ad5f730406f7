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


PARTS = ("sim", "world", "loop", "recorder")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _own(scope: ast.AST):
    """The nodes of a scope, and the functions and classes inside it but not their nodes."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, _SCOPES):
            stack.extend(ast.iter_child_nodes(n))


def _reaches(e: ast.AST, names: set[str], attrs: set[str]) -> bool:
    """``e`` is a simulation or one of its parts (or in one): a chain of attributes and subscripts from the name
    ``sim`` or an alias ``names``, through ``.sim``/``.world``/``.loop``/``.recorder`` or an alias ``self.X``."""
    while isinstance(e, ast.Attribute | ast.Subscript | ast.Starred):
        if isinstance(e, ast.Attribute) and (e.attr in PARTS or (e.attr in attrs and isinstance(e.value, ast.Name)
                                                                  and e.value.id == "self")):
            return True
        e = e.value
    return isinstance(e, ast.Name) and (e.id == "sim" or e.id in names)


def _unpack(t: ast.AST, v: ast.AST):
    if isinstance(t, ast.Tuple | ast.List):
        same = isinstance(v, ast.Tuple | ast.List) and len(v.elts) == len(t.elts)
        for n, x in enumerate(t.elts):
            yield from _unpack(x, v.elts[n] if same else v)
    else:
        yield t, v


def _bindings(n: ast.AST):
    """(target, value) of what ``n`` binds; a loop binds its targets to the collection (a part's elements are
    the simulation's objects too: its agents)."""
    if isinstance(n, ast.Assign):
        for t in n.targets:
            yield from _unpack(t, n.value)
    elif isinstance(n, ast.AnnAssign | ast.NamedExpr) and n.value is not None:
        yield n.target, n.value
    elif isinstance(n, ast.For | ast.AsyncFor | ast.comprehension):
        yield from ((t, n.iter) for t in ast.walk(n.target) if isinstance(t, ast.Name))


def _names(scope: ast.AST, outer: set[str], attrs: set[str]) -> set[str]:
    """The local names bound, anywhere in ``scope``, to a part (to a fixed point: an alias of an alias)."""
    names, grew = set(outer), True
    while grew:
        grew = False
        for n in _own(scope):
            for t, v in _bindings(n):
                if isinstance(t, ast.Name) and t.id not in names and _reaches(v, names, attrs):
                    names.add(t.id)
                    grew = True
    return names


def _class_attrs(cls: ast.ClassDef, outer: set[str]) -> set[str]:
    """The attributes ``self.X`` some method of ``cls`` binds to a part (``self.marks = sim.loop.marks``)."""
    attrs: set[str] = set()
    while True:
        found = set(attrs)
        for m in cls.body:
            if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef):
                names = _names(m, outer, attrs)
                for n in ast.walk(m):
                    for t, v in _bindings(n):
                        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                                and _reaches(v, names, attrs)):
                            found.add(t.attr)
        if found == attrs:
            return attrs
        attrs = found


def _assignments(scope: ast.AST, outer: set[str], attrs: set[str], rel: str, found: list[str]) -> None:
    names = outer if isinstance(scope, ast.ClassDef) else _names(scope, outer, attrs)
    for n in _own(scope):
        if isinstance(n, ast.ClassDef):
            _assignments(n, names, _class_attrs(n, names), rel, found)
        elif isinstance(n, _SCOPES):
            _assignments(n, names, attrs, rel, found)
        elif isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign):
            for top in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                for t, _ in _unpack(top, top):
                    if isinstance(t, ast.Attribute | ast.Subscript) and _reaches(t.value, names, attrs):
                        found.append(f"{rel}:{n.lineno}")
                        break


def _assigned_outside_sim(root: Path) -> list[str]:
    """Assignments, outside netsim/sim/, to an attribute (or item) of a simulation or of its parts: a target
    whose object is reached through a name ``sim``, an attribute ``.sim``/``.world``/``.loop``/``.recorder``,
    or an alias of one (a local, a loop variable over one, or an attribute ``self.X`` bound to one)."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if not rel.startswith("netsim/sim/"):
            _assignments(ast.parse(path.read_text(), rel), set(), set(), rel, found)
    return sorted(set(found), key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


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


ALIASED = '''\
class Driver:
    def __init__(self, sim):
        self.marks = sim.loop.marks
        self.writer, self.net = sim.recorder.writer, sim.world.network
        self.agents = sim.loop.agents
        self.again = self.marks

    def run(self, other):
        self.marks.activations += 1
        self.writer.buffer = []
        self.again.mark = 3
        for a in self.agents:
            a.round = 2
        net = self.net
        net.next_id += 1
        other.next_id = 1
        self.count = 0

        def later():
            net.positions[0] = 1
        return later


def f(sim, other):
    marks = sim.loop.marks
    m = marks
    m.x = 1
    other.x = 1
    w = (v := sim.world)
    v.y, other.y = 2, 2
    return w
'''


def test_the_guard_follows_aliases(tmp_path):
    """A part reached through a local, a loop over one, an attribute ``self.X`` bound to one, an alias of an
    alias or a closure's name is the part: assigning into it is caught; other objects are not."""
    planted = tmp_path / "netsim" / "driver.py"
    planted.parent.mkdir()
    planted.write_text(ALIASED)
    assert _assigned_outside_sim(tmp_path / "netsim") == [f"netsim/driver.py:{n}"
                                                          for n in (9, 10, 11, 13, 15, 20, 27, 30)]
