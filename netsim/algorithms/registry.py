"""Algorithms by name. An algorithm is a round kernel (``netsim.rounds.RoundKernel``: its per-round math,
run by both engines) or a generator ``fn(agent, params)`` (a coroutine program, events engine only), plus an
attrs params class.

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

from netsim.errors import InputError, claim, unknown_name
from netsim.scenario.schema import AlgorithmSpec
from netsim.scenario.structure import structure

MAX_BATCH = 2**20  # the largest mini-batch an algorithm's ``batch`` parameter may ask for
REGISTRY: dict[str, tuple[Callable, type]] = {}
SOURCES: dict[str, Any] = {}  # name -> the class or function registered under it (for the clash rule)
FIXED_TOPOLOGY: dict[str, str] = {}  # name -> why its state needs the same neighbours all run long


@attrs.frozen
class Coroutine:
    """A coroutine program with the checks it needs of the built simulation (``check(sim, params)``, called once
    before the run, when the agent count or the graph is known)."""

    fn: Callable
    checks: Callable

    def __call__(self, agent: Any, params: Any) -> Any:
        return self.fn(agent, params)

    def check(self, sim: Any, params: Any) -> None:
        self.checks(sim, params)

    @property
    def __name__(self) -> str:
        return self.fn.__name__


def register(name: str, params: type, check: Callable | None = None,
             fixed_topology: str | None = None) -> Callable[[Callable], Callable]:
    """Register an algorithm: a ``RoundKernel`` class (registered as its instance, the program both engines run)
    or a coroutine program ``fn(agent, params)``, with ``check(sim, params)`` if it needs one. ``fixed_topology``:
    why the method needs the same neighbours all run long; a time-varying topology is then refused with it
    (``check_topology``, from the scenario alone)."""
    if not attrs.has(params):
        raise TypeError(f"params of algorithm {name!r} must be an attrs class")

    def deco(fn: Callable) -> Callable:
        from netsim.rounds.kernel import RoundKernel

        have = REGISTRY.get(name)
        if have is not None and source_of(have[0]) is fn and have[1] is params:
            return fn  # the same registration again (a module imported twice): a no-op
        claim(SOURCES, "algorithm", name, fn)  # the registries' one rule: a taken name refuses another
        if isinstance(fn, type) and issubclass(fn, RoundKernel):
            program: Any = fn()
        else:
            program = fn if check is None else Coroutine(fn, check)
        REGISTRY[name] = (program, params)
        if fixed_topology is not None:
            FIXED_TOPOLOGY[name] = fixed_topology
        return fn

    return deco


def source_of(program: Any) -> Any:
    """What a registered program was written as: the kernel class or the coroutine function (docs, help)."""
    from netsim.rounds.kernel import RoundKernel

    if isinstance(program, RoundKernel):
        return type(program)
    return program.fn if isinstance(program, Coroutine) else program


BUILTIN_MODULES = {
    "adp2_sgd": "privsgp", "adpsgd": "adpsgd", "async_push": "async_push", "choco": "choco", "cpgt": "do_adp",
    "dfedavg": "dfedsam", "dfedavgm": "dfedsam", "dfedsam": "dfedsam", "dfedsam_mgs": "dfedsam", "do_adp": "do_adp",
    "dola": "ldp_online", "dp2_sgd": "privsgp", "dp_cga": "dp_cga", "dp_dda": "do_adp", "dp_dpsgd": "dp_dpsgd",
    "dp_netfleet": "dp_netfleet", "dpdo": "do_adp", "dpsgd": "dpsgd", "event_triggered": "event_triggered",
    "fedavg": "fedavg", "fedsam": "fedavg", "gossip": "gossip", "ldp_dsgd": "ldp_online", "ldp_online": "ldp_online",
    "muffliato": "muffliato", "pdop": "ldp_online", "pdsl": "pdsl", "privsgp": "privsgp", "privsgp_vr": "privsgp",
    "push_gossip": "push_gossip", "pushsum": "pushsum", "sparq": "sparq",
}
"""Each built-in algorithm's module under netsim.algorithms, so one algorithm loads without the others
(``resolve_builtin``; tests/test_validate_lean.py keeps it equal to the registry)."""


def _load_builtin() -> None:
    for module in sorted(set(BUILTIN_MODULES.values())):  # each registers on import
        importlib.import_module(f"netsim.algorithms.{module}")


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
    _load_builtin()  # a plugin that takes a built-in's name is refused, not silently replaced
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
        raise InputError("algorithm.name", unknown_name("algorithm", spec.name, names()))
    fn, params_cls = REGISTRY[spec.name]
    return fn, _params(spec, params_cls)


def check_topology(scenario: Any) -> None:
    """Refuse a time-varying topology for an algorithm registered with ``fixed_topology`` (after ``resolve``)."""
    why = FIXED_TOPOLOGY.get(scenario.algorithm.name)
    if why is not None and scenario.topology.dynamic is not None:
        raise InputError("topology.dynamic", f"algorithm {scenario.algorithm.name!r} {why}: it needs a fixed "
                                             "topology")


def resolve_builtin(spec: AlgorithmSpec) -> tuple[Callable, Any] | None:
    """``resolve`` for a built-in algorithm, importing its own module only (None for any other name): the same
    program, parameters and errors, without the other algorithms' modules (``netsim validate``)."""
    module = BUILTIN_MODULES.get(spec.name)
    if module is None:
        return None
    importlib.import_module(f"netsim.algorithms.{module}")
    fn, params_cls = REGISTRY[spec.name]
    return fn, _params(spec, params_cls)


def _params(spec: AlgorithmSpec, params_cls: type) -> Any:
    params = structure(spec.params, params_cls, "algorithm")
    batch = getattr(params, "batch", None)
    if isinstance(batch, int) and batch > MAX_BATCH:  # rows drawn per gradient, allocated at once
        raise InputError("algorithm.batch", f"must be <= {MAX_BATCH} (rows per gradient), got {batch}")
    return params


def checks_when_built(program: Any) -> bool:
    """Whether ``program`` checks the built simulation before the run: a ``check`` of its own (a kernel's or a
    coroutine's), or a program function that runs code when it is made (not a generator function)."""
    import inspect

    from netsim.rounds.kernel import RoundKernel

    if isinstance(program, RoundKernel):
        kernel = type(program)
        return kernel.check is not RoundKernel.check or kernel.__call__ is not RoundKernel.__call__ or \
            not inspect.isgeneratorfunction(type(program.pattern).program)
    return isinstance(program, Coroutine) or not inspect.isgeneratorfunction(program)
