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
    """Import a user's Python file that registers algorithms, closed forms, accountants, event kinds, stream
    purposes, link models or activation schedules (an explicit CLI choice, never a scenario's). An error while
    it loads (a name another registration already holds, say) is one line naming the plugin's own line that
    raised it."""
    import traceback

    p = Path(path)
    if not p.is_file():
        raise InputError("--plugin", f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"netsim_plugin_{p.stem}", p)
    loaded = sys.modules.get(spec.name)  # type: ignore[union-attr]
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == p.resolve():
        return  # this process has it already (commands run in-process): its registrations stand
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as e:
        del sys.modules[spec.name]  # type: ignore[union-attr]
        own = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == p.resolve()
               or Path(f.filename) == p]
        where = f"{path}:{own[-1].lineno}" if own else path
        raise InputError("--plugin", f"{where}: {type(e).__name__}: {e}") from None


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


def describe(name: str) -> str:
    """``netsim algorithms NAME``: what the algorithm is (its docstring's first paragraph and the paper and
    equation after it), where it lives, and its parameters with type, default, allowed values and meaning."""
    import inspect
    import typing

    from netsim.scenario.reference import _allowed_by_check, _default, _type

    fn, params_cls = REGISTRY[name]
    module = inspect.getmodule(fn)
    paras = [p.strip() for p in (inspect.getdoc(module) or "").split("\n\n") if p.strip()]
    own = [p.strip() for p in (inspect.getdoc(fn) or "").split("\n\n") if p.strip()]
    lines = [f"{name}: {own[0] if own else (paras[0] if paras else '(no description)')}"]
    if own and paras:
        lines += ["", paras[0]]
    if len(paras) > 1:
        lines += ["", paras[1]]
    source = getattr(module, "__file__", None)
    if module is not None and module.__name__.startswith("netsim."):
        source = module.__name__.replace(".", "/") + ".py"
    lines += ["", f"source: {source}" if source else "source: (unknown)", "", "parameters ([algorithm] keys):"]
    hints = typing.get_type_hints(params_cls)
    for f in attrs.fields(params_cls):
        tp, allowed = _type(hints[f.name])
        check = _allowed_by_check(f.metadata.get("check"))
        lines.append(f"  {f.name}  ({tp}, default {_default(f)})")
        for extra in ("; ".join(x for x in (allowed, check) if x), f.metadata.get("doc", "")):
            if extra:
                lines.append(f"      {extra}")
    return "\n".join(lines) + "\n"
