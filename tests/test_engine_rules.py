"""Each rule of the engine is stated once, in netsim/sim/, and the events engine and every fast driver (netsim/rounds/)
call it: an AST scan of the whole package finds any re-statement outside its one definition (so a new driver is
covered the day it is added), with planted violations that the scan must find.

The rules: a gradient's compute time (``Agent.compute_time``: the draw times the agent's scale), message ids
(``Network.take_ids``), wake counting (``Simulation.count_wakes``), a message's delay (``network.delay``), how long a
send holds its sender (``network.hold_time``) and the
shapes of the trace rows the rules make (netsim/sim/rows.py: activate, compute_start, compute_end, send, drop,
deliver, timeout, finish, in scalar, packed and columnar form)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import netsim
from netsim.sim import rows as shapes

ROOT = Path(netsim.__file__).parent
KINDS = frozenset(shapes.TEXT) - {"", "loss"}  # the row kinds the rules make
CODES = {k.upper() for k in KINDS}  # a code's name as a driver would spell it (``SEND``)
RECORDS = {"Activate", "ComputeStart", "ComputeEnd", "Send", "Drop", "Deliver", "Timeout", "Finish"}  # their records
ROWS_MODULE = "netsim/sim/rows.py"
# where each rule is defined: (module, qualified name of the function)
HOME = {
    "next_id": {("netsim/sim/network.py", "Network.__init__"), ("netsim/sim/network.py", "Network.take_ids")},
    "compute draw": {("netsim/sim/agent.py", "Agent.compute_time")},
    "wake count": {("netsim/sim/kernel.py", "Simulation.count_wakes")},
    "delay": {("netsim/sim/network.py", "delay")},
    "hold": {("netsim/sim/network.py", "hold_time"), ("netsim/sim/network.py", "delay")},
}


def _is_kind(node: ast.AST) -> bool:
    """A row kind as a string, or as a code: ``"send"``, ``SEND``, ``CODES.send`` / ``TEXT.send``."""
    if isinstance(node, ast.Constant):
        return node.value in KINDS
    if isinstance(node, ast.Name):
        return node.id in CODES
    if isinstance(node, ast.Attribute) and node.attr in KINDS:
        owner = node.value
        name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        return name in ("CODES", "TEXT")
    return False


def _mentions_latency(node: ast.AST) -> bool:
    names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    names += [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
    return any(n == "lat" or "latency" in n for n in names)


class _Scan(ast.NodeVisitor):
    def __init__(self, path: str):
        self.path, self.scope, self.found = path, [], []
        self.records: set[str] = set()  # the row records' names as this module imports them

    def where(self) -> tuple[str, str]:
        return self.path, ".".join(self.scope)

    def flag(self, node: ast.AST, rule: str, what: str) -> None:
        if self.where() not in HOME.get(rule, ()):
            self.found.append(f"{self.path}:{node.lineno}: {what}")

    def _scoped(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "netsim.trace.events":
            self.records |= {a.asname or a.name for a in node.names if a.name in RECORDS}
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "next_id":
            self.flag(node, "next_id", "message ids outside Network.take_ids (next_id)")
        if _is_kind(node) and self.path != ROWS_MODULE:
            self.found.append(f"{self.path}:{node.lineno}: a row kind's code outside sim/rows.py ({node.attr})")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name == "_compute":
            self.flag(node, "compute draw", "a compute-time draw outside Agent.compute_time (_compute())")
        if self.path != ROWS_MODULE:
            args = node.args
            if name in ("words", "Words", "codes") and args and _is_kind(args[0]):
                self.found.append(f"{self.path}:{node.lineno}: a row kind's code outside sim/rows.py ({name}(...))")
            elif len(args) == 9 and not any(isinstance(a, ast.Starred) for a in args) and any(map(_is_kind, args)):
                self.found.append(f"{self.path}:{node.lineno}: a row's shape outside sim/rows.py ({name}(9 fields))")
            if isinstance(f, ast.Name) and f.id in self.records or (
                    isinstance(f, ast.Attribute) and f.attr in RECORDS and isinstance(f.value, ast.Name)
                    and f.value.id == "events"):
                self.found.append(f"{self.path}:{node.lineno}: a row's record made outside sim/rows.py ({name})")
        self.generic_visit(node)

    def _literal(self, node: ast.Tuple | ast.List) -> None:
        if self.path != ROWS_MODULE and len(node.elts) == 9 and any(map(_is_kind, node.elts)):
            self.found.append(f"{self.path}:{node.lineno}: a row's shape outside sim/rows.py (a 9-field literal)")
        self.generic_visit(node)

    visit_Tuple = visit_List = _literal

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Mult) and any(isinstance(s, ast.Attribute) and s.attr == "compute_scale"
                                                 for s in (node.left, node.right)):
            self.flag(node, "compute draw", "a compute-time product outside Agent.compute_time (compute_scale)")
        if isinstance(node.op, ast.Add) and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Sub):
            sub = node.left
            if ast.dump(sub.left) == ast.dump(sub.right) or _mentions_latency(node.right):
                self.flag(node, "delay", "a message's delay outside network.delay (x - now + latency)")
        if isinstance(node.op, ast.Sub) and (isinstance(node.left, ast.Name) and node.left.id == "tx_end" or
                                             isinstance(node.left, ast.Attribute) and node.left.attr == "tx_end"):
            self.flag(node, "hold", "a send's hold on its sender outside network.hold_time (tx_end - now)")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        t = node.target
        if isinstance(t, ast.Attribute) and t.attr in ("round", "activations") and isinstance(node.op, ast.Add):
            self.flag(node, "wake count", f"wake counting outside Simulation.count_wakes (.{t.attr} +=)")
        self.generic_visit(node)


def violations(source: str, path: str = "netsim/rounds/planted.py") -> list[str]:
    """Re-statements of the engine's rules in ``source`` (a module at ``path``, relative to the repository)."""
    scan = _Scan(path)
    scan.visit(ast.parse(source, path))
    return scan.found


def test_no_rule_is_restated_outside_its_definition():
    found = [v for p in sorted(ROOT.rglob("*.py"))
             for v in violations(p.read_text(), str(p.relative_to(ROOT.parent)))]
    assert not found, "\n".join(found)


def test_every_rule_home_exists():
    """The definitions the scan allows are where it says (a rename must move the scan with it)."""
    for rule, homes in HOME.items():
        for path, qual in homes:
            tree = ast.parse((ROOT.parent / path).read_text())
            names = {f"{c.name}.{f.name}" for c in tree.body if isinstance(c, ast.ClassDef) for f in c.body
                     if isinstance(f, ast.FunctionDef)} | {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
            assert qual in names, f"{rule}: {path} has no {qual}"


@pytest.mark.parametrize("code", [
    # message ids
    "def f(net):\n    mid = net.next_id\n    net.next_id = mid + 1",
    "def f(self):\n    self.net.next_id += 3",
    # compute-time draws
    "def f(a):\n    return a._compute() * a.compute_scale",
    "def f(a, d):\n    return d() * a.compute_scale",
    # wake counting
    "def f(a, marks):\n    a.round += 1\n    marks.activations += 1",
    # row shapes: scalar, packed, columnar, records
    "def f(now, i, j, m, s, d, r, tag):\n    return (now, 'send', i, j, m, s, d, r, tag)",
    "def f(rows, t, i):\n    rows.append([t, 'finish', i, -1, -1, 0, 0.0, 3, ''])",
    "def f(put, pack, t, i, v, r, NO_TAG):\n    put(pack(t, ACTIVATE, i, -1, -1, 0, v, r, NO_TAG))",
    "def f(c, at, words):\n    c[1][at] = words('deliver')",
    "def f(c, at, CODES):\n    c[1][at] = CODES.timeout",
    "from netsim.trace.events import Finish\ndef f(emit, t, i, r):\n    emit(Finish(t, i, r))",
    "from netsim.trace.events import Timeout as T\ndef f(emit, t, i, r):\n    emit(T(t, i, r, 1.0))",
    "from netsim.trace import events\ndef f(emit, t, i, r):\n    emit(events.Drop(t, i, 1, 2, 3, 0.1, r, 'loss'))",
    "def f(emit, t, i):\n    emit((t, 'compute_start', i, -1, -1, 0, 0.5, -1, ''))",
    # the delay expression and its float imitations
    "def f(now, link):\n    return now - now + link.latency()",
    "def f(t, lat):\n    return (t - t) + lat",
    "def f(tx_end, now, latency):\n    return tx_end - now + latency",
    # how long a send holds its sender
    "def f(self, now, tx):\n    if self.tx_end - now > tx:\n        tx = self.tx_end - now\n    return tx",
    "def f(tx_end, t):\n    return max(0.0, tx_end - t)",
])
def test_the_scan_finds_a_planted_restatement(code):
    assert violations(code), code


@pytest.mark.parametrize(("code", "path"), [
    ("class Network:\n    def take_ids(self, n):\n        mid = self.next_id\n        self.next_id = mid + n\n"
     "        return mid", "netsim/sim/network.py"),
    ("class Agent:\n    def compute_time(self, now):\n        return self._compute() * self.compute_scale",
     "netsim/sim/agent.py"),
    ("class Simulation:\n    def count_wakes(self, agents):\n        for a in agents:\n            a.round += 1\n"
     "        self.loop.marks.activations += len(agents)", "netsim/sim/kernel.py"),
    ("def delay(tx_end, now, latency):\n    return tx_end - now + latency", "netsim/sim/network.py"),
    ("def hold_time(tx_end, now):\n    return tx_end - now", "netsim/sim/network.py"),
    ("def send(t, s, d, m, z, y, r, tag, k):\n    return (t, k.send, s, d, m, z, y, r, tag)", ROWS_MODULE),
    # what a driver writes instead, and what reads rows (not a shape)
    ("def f(put, pack, shapes, CODES, t, i, v, r):\n    put(pack(*shapes.activate(t, i, v, r, CODES)))",
     "netsim/rounds/planted.py"),
    ("def f(k):\n    return k in ('send', 'deliver', 'drop', 'stale')", "netsim/explore/planted.py"),
    ("def f(net, a):\n    return net.take_ids(1), a.compute_time(0.0), a.plan_wake(0.0)", "netsim/rounds/planted.py"),
])
def test_the_scan_allows_the_one_definition(code, path):
    assert not violations(code, path)


SHAPES = [  # a shape and one row's values, a tag (a string) last where the shape takes one
    (shapes.activate, (1.5, 3, 2.25, 7)),
    (shapes.compute_start, (1.5, 3, 0.125)),
    (shapes.compute_end, (1.5, 3)),
    (shapes.send, (1.5, 3, 4, 11, 80, 0.0625, 7, "model")),
    (shapes.drop, (1.5, 3, 4, 11, 80, 0.0625, 7, "outage")),
    (shapes.deliver, (1.75, 4, 3, 11, 80, 1.5, 7, "model")),
    (shapes.timeout, (1.5, 3, 7, 2.0)),
    (shapes.finish, (1.5, 3, 7)),
]


@pytest.mark.parametrize(("shape", "values"), SHAPES, ids=[s.__name__ for s, _ in SHAPES])
def test_a_shape_makes_the_same_row_in_every_form(shape, values):
    """The events engine's tuple, a driver's packed record and a driver's columns of one shape are the same row, and
    that row is the one its trace record (netsim.trace.events) makes."""
    import numpy as np

    from netsim.rounds.sync import columns
    from netsim.trace.events import record, row
    from netsim.trace.io import RECORD, column_rows

    text = shape(*values)
    words = shapes.words()
    coded = [words(v) if isinstance(v, str) else v for v in values]
    rec = RECORD.unpack(RECORD.pack(*shape(*coded, shapes.CODES)))
    packed = tuple(words.words[v] if n in (1, 8) else v for n, v in enumerate(rec))
    cols = columns(2)
    shapes.fill(cols, slice(None), shape(*[np.array([v, v]) for v in coded], shapes.CODES))
    assert packed == text and column_rows(tuple(cols), 0, 2, words) == [text, text]
    assert row(record(text)) == text  # what the kind's record makes: the same columns, the defaults where unused
