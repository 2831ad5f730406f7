"""Algorithms by name. An algorithm is a generator ``fn(agent, params)`` plus an attrs params class.

Register with ``@register("name", Params)``; third-party packages register through the
``netsim.algorithms`` entry point group, and users load a file with ``--plugin``. A scenario file
names an algorithm but never causes code to be imported.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from netsim.errors import InputError
from netsim.scenario.schema import AlgorithmSpec
from netsim.scenario.structure import structure

MAX_BATCH = 2**20  # the largest mini-batch an algorithm's ``batch`` parameter may ask for
REGISTRY: dict[str, tuple[Callable, type]] = {}


def register(name: str, params: type) -> Callable[[Callable], Callable]:
    if not attrs.has(params):
        raise TypeError(f"params of algorithm {name!r} must be an attrs class")

    def deco(fn: Callable) -> Callable:
        REGISTRY[name] = (fn, params)
        return fn

    return deco


def _load_builtin() -> None:
    from netsim.algorithms import (  # noqa: F401 - registers on import
        adpsgd,
        async_push,
        choco,
        dfedsam,
        do_adp,
        dp_cga,
        dp_dpsgd,
        dp_netfleet,
        dpsgd,
        event_triggered,
        fedavg,
        gossip,
        ldp_online,
        muffliato,
        pdsl,
        privsgp,
        push_gossip,
        pushsum,
        sparq,
    )


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="netsim.algorithms"):
        ep.load()


def load_plugin(path: str) -> None:
    """Import a user's Python file that registers algorithms (an explicit CLI choice, never a scenario's)."""
    p = Path(path)
    if not p.is_file():
        raise InputError("--plugin", f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"netsim_plugin_{p.stem}", p)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]


def names() -> list[str]:
    _load_builtin()
    return sorted(REGISTRY)


def resolve(spec: AlgorithmSpec) -> tuple[Callable, Any]:
    """(program, params) for a scenario's [algorithm] table; errors name the key."""
    _load_builtin()
    if spec.name not in REGISTRY:
        _load_entry_points()
    if spec.name not in REGISTRY:
        raise InputError("algorithm.name", f"unknown algorithm {spec.name!r}; registered: {', '.join(names())}")
    fn, params_cls = REGISTRY[spec.name]
    params = structure(spec.params, params_cls, "algorithm")
    batch = getattr(params, "batch", None)
    if isinstance(batch, int) and batch > MAX_BATCH:  # rows drawn per gradient, allocated at once
        raise InputError("algorithm.batch", f"must be <= {MAX_BATCH} (rows per gradient), got {batch}")
    return fn, params
