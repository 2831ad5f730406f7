"""The Agent API reference, generated from ``Agent``'s docstrings: ``netsim algorithms --api`` prints it,
docs/agent-api.md is the same text (a test keeps them equal)."""

from __future__ import annotations

import inspect


def agent_api_markdown() -> str:
    """Markdown: the module's and class's docstrings, then every public method and property in the order
    the class defines them, with its signature and docstring."""
    from netsim.sim import agent as mod

    cls = mod.Agent
    out = ["# The Agent API", "",
           "<!-- generated from netsim/sim/agent.py by `netsim algorithms --api`; do not edit by hand -->", "",
           inspect.cleandoc(mod.__doc__ or ""), "", "## `Agent`", "", inspect.cleandoc(cls.__doc__ or ""), ""]
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            head = f"### `agent.{name}`" + (" (settable)" if member.fset is not None else "")
            doc = member.fget.__doc__
        elif inspect.isfunction(member):
            sig = str(inspect.signature(member, eval_str=True)).replace("(self, ", "(").replace("(self)", "()")
            head = f"### `agent.{name}{sig}`"
            doc = member.__doc__
        else:
            continue
        out += [head, "", inspect.cleandoc(doc or "(undocumented)"), ""]
    return "\n".join(out)


def undocumented() -> list[str]:
    """Public methods and properties of ``Agent`` without a docstring (a test keeps this empty)."""
    from netsim.sim.agent import Agent

    missing = []
    for name, member in vars(Agent).items():
        if name.startswith("_"):
            continue
        fn = member.fget if isinstance(member, property) else member if inspect.isfunction(member) else None
        if fn is not None and not (fn.__doc__ or "").strip():
            missing.append(name)
    return missing
