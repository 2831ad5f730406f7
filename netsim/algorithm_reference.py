"""``netsim algorithms``: the built-in algorithms in one line each, and one algorithm in full.

The list is read from ``SUMMARIES`` without importing the algorithms (their modules import torch, ~2 s), so
it answers at once; tests/test_cli_papercuts.py keeps it equal to the registry. ``describe`` needs the
registry (the parameters' classes) and prints the algorithm's whole documentation, never a cut part.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence

SUMMARIES = {
    "adp2_sgd": "A(DP)²SGD [reconstructed] (Xu et al. 2021): AD-PSGD's asynchronous pairwise averaging, "
                "Gaussian noise on the gradient",
    "adpsgd": "AD-PSGD (Lian et al. 2018): asynchronous decentralized SGD with atomic pairwise averaging",
    "async_push": "asynchronous push gossip SGD: no barrier, merge whatever has arrived (optional staleness "
                  "weights)",
    "choco": "CHOCO-SGD (Koloskova et al. 2019): compressed messages (top-k, rand-k, QSGD) and public copies",
    "cpgt": "CPGT [reconstructed] (Xie et al. 2023): compressed private gradient tracking (DO-ADP baseline)",
    "dfedavg": "DFedAvg: decentralized FedAvg, local SGD steps then gossip (DFedSAM baseline)",
    "dfedavgm": "DFedAvgM: DFedAvg with momentum in the local steps (DFedSAM baseline)",
    "dfedsam": "DFedSAM (Shi et al. 2023): local sharpness-aware (SAM) steps, then one gossip step",
    "dfedsam_mgs": "DFedSAM-MGS (Shi et al. 2023): DFedSAM with several gossip steps per round",
    "do_adp": "DO-ADP (Huo et al.): private decentralized optimization, privacy amplified by Bernoulli "
              "activation and top-k",
    "dola": "DOLA (Li et al. 2018): private distributed online learning, Laplace-noised states (baseline B2 "
            "of ldp_online)",
    "dp2_sgd": "DP²-SGD [reconstructed] (Yu et al. 2021): D-PSGD with Gaussian gradient noise (PrivSGP-VR "
               "baseline)",
    "dp_cga": "DP-CGA: cross-gradient aggregation with Gaussian noise on the cross-gradients (PDSL baseline)",
    "dp_dda": "DP-DDA [reconstructed] (Liu, Johansson, Shi 2024): private distributed dual averaging, "
              "sampled agents",
    "dp_dpsgd": "DP-D-PSGD: D-PSGD with a clipped, Gaussian-noised gradient (per-example or whole-batch "
                "clipping)",
    "dp_netfleet": "DP-NET-FLEET [reconstructed]: local recursive-gradient steps with tracking, noised (PDSL "
                   "baseline)",
    "dpdo": "DPDO [reconstructed] (Huang, Mitra, Vaidya 2015): Laplace-noised broadcasts, consensus, "
            "gradient step",
    "dpsgd": "D-PSGD (Lian et al. 2017): synchronous rounds of a local SGD step and neighbour averaging",
    "event_triggered": "event-triggered D-PSGD (George & Gurram 2020): send only when the model moved past "
                       "a threshold",
    "fedavg": "FedAvg (McMahan et al. 2017): centralized federated averaging, the server is agent 0",
    "fedsam": "FedSAM: FedAvg with sharpness-aware (SAM) local steps, the server is agent 0",
    "gossip": "randomized pairwise gossip averaging (Boyd et al. 2006) with local SGD, asynchronous",
    "ldp_dsgd": "DSGD (Pu et al. 2021) with Laplace-noised states (baseline B1 of ldp_online)",
    "ldp_online": "locally private distributed online learning (Chen & Wang, Algorithm 1), Laplace-noised "
                  "states",
    "muffliato": "MUFFLIATO (Cyffers et al. 2022): a noisy local step, then K gossip rounds (PDSL baseline)",
    "pdop": "PDOP (Huang, Mitra, Vaidya 2015): noisy projected consensus (baseline B3 of ldp_online)",
    "pdsl": "PDSL (Wang, Yuan, Wang, Li): private decentralized SGD with Shapley-weighted cross-gradients",
    "privsgp": "PrivSGP (Zhu et al. 2024, Algorithm 2): private stochastic gradient push",
    "privsgp_vr": "PrivSGP-VR (Zhu et al. 2024): private stochastic gradient push with SAGA variance "
                  "reduction",
    "push_gossip": "gossip learning: push the model to one random neighbour per round, merge on receipt",
    "pushsum": "subgradient-push: push-sum consensus with gradient steps, for directed graphs",
    "sparq": "SPARQ-SGD (Singh et al. 2021): event-triggered and compressed decentralized SGD, asynchronous",
}


def summary(name: str, fn: Callable | None = None) -> str:
    """One line: the built-in's summary, else (a plugin's algorithm) its docstring's first sentence."""
    if name in SUMMARIES:
        return SUMMARIES[name]
    return first_paragraph(fn)


def first_paragraph(fn: Callable | None) -> str:
    """The first paragraph of ``fn``'s docstring (else its module's) on one line: a plugin's summary."""
    doc = "" if fn is None else inspect.getdoc(fn) or inspect.getdoc(inspect.getmodule(fn)) or ""
    return " ".join(doc.split("\n\n")[0].split()) or "(no description)"


def listing(entries: dict[str, str], columns: int = 100,
            footer: str = "(netsim algorithms NAME: the paper, its equations and the parameters)") -> str:
    """``name  summary`` lines, names aligned, summaries wrapped under themselves to ``columns`` (``netsim
    algorithms``, ``netsim models``, ``netsim datasets``), then ``footer``."""
    import textwrap

    width = max(map(len, entries), default=0)
    pad = " " * (width + 2)
    lines = [textwrap.fill(s, max(columns, width + 40), initial_indent=f"{n:<{width}}  ", subsequent_indent=pad)
             for n, s in sorted(entries.items())]
    lines.append(footer)
    return "\n".join(lines) + "\n"


def _docs(fn: Callable, module) -> list[str]:
    """The docstrings ``describe`` prints, what the method is first: the module's (the paper and the method)
    then the program's own (how it is run) where the module holds this one method; the program's own first
    where the module holds a family (``do_adp.py``: DO-ADP and its baselines), each method's own docstring
    naming its paper."""
    from netsim.algorithms.registry import REGISTRY, source_of

    own = inspect.cleandoc(fn.__doc__) if fn.__doc__ else None  # a kernel class's own, never its base's
    family = {source_of(p) for p, _ in REGISTRY.values() if inspect.getmodule(source_of(p)) is module}
    docs = [inspect.getdoc(module), own] if len(family - {fn}) == 0 else [own, inspect.getdoc(module)]
    return [d for d in docs if d and d.strip()]


def describe(name: str, fn: Callable, params_cls: type) -> str:
    """``netsim algorithms NAME``: the summary, the program's and its module's whole docstrings (the paper,
    equations, choices), where it lives, and its parameters with type, default, allowed values and meaning."""
    import attrs

    from netsim.scenario.reference import _allowed_by_check, _default, _type

    module = inspect.getmodule(fn)
    head = summary(name, fn)
    lines = [f"{name}: {head}"]
    for doc in _docs(fn, module):
        paragraphs = doc.strip().split("\n\n")
        if " ".join(paragraphs[0].split()) == head:  # a plugin's summary is its docstring's first paragraph
            paragraphs = paragraphs[1:]
        if paragraphs:
            lines += ["", "\n\n".join(paragraphs)]
    source = getattr(module, "__file__", None)
    if module is not None and module.__name__.startswith("netsim."):
        source = module.__name__.replace(".", "/") + ".py"
    lines += ["", f"source: {source}" if source else "source: (unknown)", "", "parameters ([algorithm] keys):"]
    hints = typing.get_type_hints(params_cls)
    for f in attrs.fields(params_cls):
        tp, allowed = _type(hints[f.name])
        check = _allowed_by_check(f.metadata.get("check"), hints[f.name])
        lines.append(f"  {f.name}  ({tp}, default {_default(f)})")
        for extra in ("; ".join(x for x in (allowed, check) if x), f.metadata.get("doc", "")):
            if extra:
                lines.append(f"      {extra}")
    return "\n".join(lines) + "\n"


def check_registered(name: str | None, plugins: Sequence[str] = (), overrides: dict | None = None) -> list:
    """``netsim check``: kernel ``name`` (with its parameters' defaults and ``overrides``, ``{field: value}``), or
    with no name every kernel the ``plugins`` files register (they are loaded already); InputError for a name that
    is not a round kernel, or nothing to check."""
    import sys
    from pathlib import Path

    from netsim.algorithms.registry import REGISTRY, names, resolve
    from netsim.errors import InputError
    from netsim.rounds import RoundKernel
    from netsim.rounds.exactness import check
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
