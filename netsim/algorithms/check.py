"""``netsim check NAME``: a registered round kernel (or every one a plugin file registers) through
``rounds.exactness.check``. Here, not in rounds/, because it resolves names in the algorithms' registry."""

from __future__ import annotations

from collections.abc import Sequence

from netsim.rounds import RoundKernel
from netsim.rounds.exactness import Outcome, check


def check_registered(name: str | None, plugins: Sequence[str] = (), overrides: dict | None = None) -> list[Outcome]:
    """``netsim check``: kernel ``name`` (with its parameters' defaults and ``overrides``, ``{field: value}``), or
    with no name every kernel the ``plugins`` files register (they are loaded already); InputError for a name that
    is not a round kernel, or nothing to check."""
    import sys
    from pathlib import Path

    from netsim.algorithms.registry import REGISTRY, names, resolve
    from netsim.errors import InputError
    from netsim.scenario.schema import AlgorithmSpec

    registered = names()
    if name is None:
        files = {Path(p).resolve() for p in plugins}
        picked = [n for n in registered if isinstance(REGISTRY[n][0], RoundKernel)
                  and Path(getattr(sys.modules.get(type(REGISTRY[n][0]).__module__), "__file__", "") or ".").resolve()
                  in files]
        if not picked:
            raise InputError("check", "name a round-kernel algorithm (netsim check NAME), or give --plugin files that "
                                      "register one" + (f"; {', '.join(map(str, plugins))} register none"
                                                        if plugins else ""))
        if overrides:
            raise InputError("--set", "parameters apply to one algorithm: name it (netsim check NAME --set KEY=VALUE)")
    elif name not in REGISTRY:
        raise InputError("check", f"unknown algorithm {name!r}; registered: {', '.join(registered)} (a plugin's "
                                  "needs --plugin)")
    elif not isinstance(REGISTRY[name][0], RoundKernel):
        raise InputError("check", f"algorithm {name!r} is a coroutine program, not a round kernel: it runs on the "
                                  "events engine only, one agent at a time (nothing to check)")
    else:
        picked = [name]
    out = []
    for n in picked:
        kernel, params = resolve(AlgorithmSpec(n, dict(overrides or {})))
        out.append(check(n, kernel, params))
    return out
