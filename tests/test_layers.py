"""The layer rules docs/architecture.md states, checked over every import in the package (module-level and
inside functions alike: a lazy import still couples the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import netsim

ROOT = Path(netsim.__file__).parent


def imports() -> list[tuple[str, str, int]]:
    """(importing module, imported netsim module, line) for every absolute netsim import."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = ".".join(("netsim", *path.relative_to(ROOT).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "netsim"]
            else:
                continue
            out += [(mod, n, node.lineno) for n in names if n == "netsim" or n.startswith("netsim.")]
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


# (importing layer, the layers it may import besides its own), from docs/architecture.md "Layers"
RULES = {
    "scenario": {"errors"},                                       # only attrs and netsim.errors
    "compute": {"errors", "scenario"},                            # no agents, time or events
    "trace": {"errors", "scenario"},                              # never algorithms, the kernel or the API
    "comm": {"errors", "scenario", "sim", "compute"},             # parts algorithms use, never the reverse
    "privacy": {"errors", "scenario", "sim", "compute", "trace"},
    "sim": {"errors", "scenario", "compute", "trace", "comm", "privacy"},   # never the CLI, API or algorithms
    "rounds": {"errors", "scenario", "sim", "comm", "privacy", "compute", "trace"},  # the kernel form, its drivers
    "algorithms": {"errors", "scenario", "sim", "rounds", "comm", "privacy", "compute", "trace"},  # never CLI/API
    "metrics": {"errors", "scenario", "trace"},
}


def violations() -> list[str]:
    bad = []
    for mod, target, line in imports():
        src, dst = layer(mod), layer(target)
        if src in RULES and dst != src and dst not in RULES[src]:
            bad.append(f"{mod}:{line} imports {target}")
        if dst == "cli" and src not in ("cli", "__main__"):
            bad.append(f"{mod}:{line} imports the CLI")
    return bad


def test_layer_rules_hold():
    bad = violations()
    assert not bad, "\n".join(bad)


def test_the_walk_sees_lazy_imports():
    """Function-level imports are found (the kernel imports the streaming tracker lazily)."""
    found = {(m, t) for m, t, _ in imports()}
    assert ("netsim.sim.kernel", "netsim.compute.streaming") in found
    assert ("netsim.replay", "netsim.api") in found  # replay is a way to run, beside the API


@pytest.mark.parametrize("layer_name", sorted(RULES))
def test_every_layer_exists(layer_name):
    assert (ROOT / layer_name).is_dir()
