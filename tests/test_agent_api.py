"""The Agent API is the whole interface algorithms use: no algorithm (or comm part they build on) reaches
through ``agent.sim`` or touches another object's private attribute (an AST check, so a new file is
covered the day it is added). The fast drivers (rounds/) and the restore (sim/restore.py) drive the simulation
itself, so they may hold it, but they too touch no other object's private attribute: what they need is a
public operation of its owner. The privacy layer (privacy/) is held to the same: its ledger reads an agent's
mixing record through ``mixing_record``, never through a private name that a change to Agent would silently empty."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import netsim

ROOT = Path(netsim.__file__).parent
CHECKED = sorted([*(ROOT / "algorithms").glob("*.py"), *(ROOT / "comm").glob("*.py"),
                  *(ROOT.parent / "examples" / "plugins").glob("*.py")])
DRIVERS = sorted([*(ROOT / "rounds").glob("*.py"), ROOT / "sim" / "restore.py",  # private attributes only
                  *(ROOT / "privacy").glob("*.py")])
# a named tuple's public methods, underscored only so as not to clash with its fields
NAMEDTUPLE = {"_asdict", "_replace", "_make", "_fields", "_field_defaults"}


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__") and attr not in NAMEDTUPLE


def violations(source: str, name: str = "<string>", sim: bool = True) -> list[str]:
    """Lines that touch a private attribute of anything but ``self``/``cls``, and (``sim``) ``.sim``."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr == "sim" and sim:
                out.append(f"{name}:{node.lineno}: .sim")
            elif _private(node.attr) and owner not in ("self", "cls"):
                out.append(f"{name}:{node.lineno}: private attribute {node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and ((node.args[1].value == "sim" and sim) or _private(node.args[1].value))):
            out.append(f"{name}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return out


def test_algorithms_use_only_the_agent_api():
    found = [v for path in CHECKED for v in violations(path.read_text(), str(path.relative_to(ROOT.parent)))]
    assert not found, "\n".join(found)


def test_drivers_and_restore_touch_no_private_attribute():
    found = [v for path in DRIVERS for v in violations(path.read_text(), str(path.relative_to(ROOT.parent)), False)]
    assert not found, "\n".join(found)
    assert {p.name for p in DRIVERS} >= {"windowed.py", "lookahead.py", "sync.py", "push.py", "restore.py", "ledger.py"}


@pytest.mark.parametrize("code", [
    "def f(a):\n    return a._compute() * a.compute_scale",
    "def f(a):\n    a._ahead.pos = 3",
    "def f(log):\n    log._spec_ids = {}",
    "def f(b):\n    return hasattr(b, '_sent')",
])
def test_the_drivers_check_catches_private_access_but_allows_the_simulation(code):
    assert violations(code, sim=False)
    assert not violations("def f(agent):\n    return agent.sim.loop.marks, p._asdict()", sim=False)


@pytest.mark.parametrize("code", [
    "def f(agent):\n    return agent.sim.bank",
    "def f(agent):\n    agent._tick = 3",
    "def f(ps):\n    return ps._seq",
    "def f(sim):\n    return getattr(sim, '_random_in_neighbors', None)",
    "def f(agent):\n    return getattr(agent, 'sim')",
])
def test_the_check_catches_private_access(code):
    assert violations(code)


@pytest.mark.parametrize("code", [
    "class A:\n    def f(self):\n        return self._seq",
    "def f(agent):\n    return agent.state('m'), agent.stats, agent.__class__",
    "def f(row):\n    return row._asdict(), row._replace(t=1), hasattr(row, '_fields')",
])
def test_the_check_allows_own_state_and_public_names(code):
    assert not violations(code)


def test_api_reference_is_generated_and_current():
    from netsim.sim.reference import agent_api_markdown, undocumented

    assert undocumented() == []
    text = agent_api_markdown()
    for name in ("recv", "gather", "state", "finish", "lookahead", "privatize", "spawn", "rng", "stats"):
        assert f"### `agent.{name}" in text
    doc = (ROOT.parent / "docs" / "agent-api.md").read_text()
    assert doc == text + "\n", "docs/agent-api.md is stale: netsim algorithms --api > docs/agent-api.md"


# an event's state: Completion (its value) and the environment's own Timeout and event loop (sim/env.py)
_EVENT = frozenset({"netsim/sim/services.py", "netsim/sim/env.py"})
SIMPY_PRIVATE = {"_value": _EVENT, "_ok": _EVENT, "_delay": _EVENT, "_now": frozenset({"netsim/sim/env.py"}),
                 "_queue": frozenset({"netsim/sim/env.py"}), "_eid": frozenset({"netsim/sim/env.py"})}


def test_simpy_internals_are_touched_by_one_class_each():
    """A simpy event's value is rewritten in one place (sim/services.py, ``Completion``) and its state made and read
    by netsim's own Environment (sim/env.py: its ``Timeout`` and event loop); the environment's clock, queue and
    event ids are read and set by that Environment only; nothing else reads them."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Attribute) and rel not in SIMPY_PRIVATE.get(node.attr, (rel,)):
                found.append(f"{rel}:{node.lineno}: .{node.attr}")
    assert not found, "\n".join(found)


def test_nothing_replaces_an_agents_methods():
    """Replay, churn and dynamic topologies go through schedules and listeners, never ``agent.wake = ...``."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                if (isinstance(t, ast.Attribute) and t.attr in ("wake", "send", "recv", "gather", "mix")
                        and not (isinstance(t.value, ast.Name) and t.value.id == "self")):
                    found.append(f"{rel}:{node.lineno}: assigns .{t.attr}")
    assert not found, "\n".join(found)
