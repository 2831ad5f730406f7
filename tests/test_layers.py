"""The layer rules docs/architecture.md states, checked over every import in the package (module-level and
inside functions alike: a lazy import still couples the layers), relative imports and ``importlib`` included,
and the packages' import graph free of cycles. A self-test plants violations and checks each is found."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import netsim

ROOT = Path(netsim.__file__).parent


def _module(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((root.name, *parts))


def _resolve(mod: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module a relative ``from ... import`` names."""
    base = mod.split(".") if is_package else mod.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def imports(root: Path = ROOT) -> list[tuple[str, str, int]]:
    """(importing module, imported module of the package, line) for every import: absolute, relative, and
    ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name."""
    top = root.name
    out = []
    for path in sorted(root.rglob("*.py")):
        mod = _module(root, path)
        pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = node.module if node.level == 0 else _resolve(mod, pkg, node.level, node.module)
                if not src:
                    continue
                names = [f"{src}.{a.name}" for a in node.names] if src == top else [src]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                    or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
                names = [node.args[0].value]
            else:
                continue
            out += [(mod, n, node.lineno) for n in names if n == top or n.startswith(top + ".")]
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


# (importing layer, the layers it may import besides its own), from docs/architecture.md "Layers"
RULES = {
    "scenario": {"errors"},                                       # only attrs and netsim.errors
    "compute": {"errors", "scenario"},                            # no agents, time or events
    "trace": {"errors", "scenario"},                              # never algorithms, the kernel or the API
    "sim": {"errors", "scenario", "compute", "trace"},            # the kernel: never comm, privacy, rounds, algorithms
    "comm": {"errors", "scenario", "sim", "compute"},             # parts algorithms use, never the reverse
    "privacy": {"errors", "scenario", "sim", "compute", "trace"},
    "rounds": {"errors", "scenario", "sim", "comm", "privacy", "compute", "trace"},  # the kernel form, its drivers
    "algorithms": {"errors", "scenario", "sim", "rounds", "comm", "privacy", "compute", "trace"},  # never CLI/API
    "metrics": {"errors", "scenario", "trace"},
    "explore": {"errors", "scenario", "trace", "metrics", "privacy"},  # reads run folders, never runs anything
}


def violations(found: list[tuple[str, str, int]]) -> list[str]:
    bad = []
    for mod, target, line in found:
        src, dst = layer(mod), layer(target)
        if src in RULES and dst != src and dst not in RULES[src]:
            bad.append(f"{mod}:{line} imports {target}")
        if dst == "cli" and src not in ("cli", "__main__"):
            bad.append(f"{mod}:{line} imports the CLI")
    return bad


def cycles(found: list[tuple[str, str, int]]) -> list[list[str]]:
    """Cycles between the layers (packages) in the import graph."""
    g = nx.DiGraph()
    for mod, target, _ in found:
        src, dst = layer(mod), layer(target)
        if src and dst and src != dst:
            g.add_edge(src, dst)
    return [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def test_layer_rules_hold():
    bad = violations(imports())
    assert not bad, "\n".join(bad)


def test_no_package_cycles():
    found = cycles([i for i in imports() if layer(i[0]) in RULES and layer(i[1]) in RULES])
    assert not found, found


def test_the_walk_sees_lazy_imports():
    """Function-level imports are found (the kernel imports the streaming tracker lazily)."""
    found = {(m, t) for m, t, _ in imports()}
    assert ("netsim.sim.kernel", "netsim.compute.streaming") in found
    assert ("netsim.replay", "netsim.api") in found  # replay is a way to run, beside the API


@pytest.mark.parametrize("layer_name", sorted(RULES))
def test_every_layer_exists(layer_name):
    assert (ROOT / layer_name).is_dir()


def test_a_planted_violation_of_each_kind_is_found(tmp_path):
    """Self-test: an upward absolute import, a relative one, an importlib one, and a cycle."""
    pkg = tmp_path / "netsim"
    for sub in ("sim", "algorithms", "compute", "scenario"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "sim" / "up.py").write_text("def f():\n    from netsim.algorithms import registry\n")
    (pkg / "sim" / "rel.py").write_text("from ..algorithms import dpsgd\nfrom . import up\n")
    (pkg / "compute" / "dyn.py").write_text("import importlib\nm = importlib.import_module('netsim.sim.up')\n")
    (pkg / "scenario" / "ok.py").write_text("from netsim import errors\n")
    (pkg / "algorithms" / "back.py").write_text("from netsim.sim import up\n")
    found = imports(pkg)
    bad = violations(found)
    assert "netsim.sim.up:2 imports netsim.algorithms" in bad
    assert "netsim.sim.rel:1 imports netsim.algorithms" in bad
    assert "netsim.compute.dyn:2 imports netsim.sim.up" in bad
    assert not any(b.startswith("netsim.scenario") for b in bad)  # errors is allowed
    assert ("netsim.sim.rel", "netsim.sim", 2) in found  # a relative import inside the package
    assert cycles(found) == [["algorithms", "sim"]]
