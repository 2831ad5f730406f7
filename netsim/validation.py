"""``netsim validate``: every check that building a scenario makes, without building it where that is exact.

Building (``api.prepare``) imports torch (~2-3 s) and makes the data's tensors, the model and the agents. For a
scenario whose checks need none of that (built-in synthetic data, a built-in model, a built-in algorithm whose
program checks nothing of the built simulation, no churn, dynamic graph, link trace, mixing record or
objective metrics, no plugin) ``check`` makes the same checks in the same order with the same one-line errors
from the same functions, with numpy only; any other scenario is built. tests/test_validate_lean.py holds the two
paths to the same verdict and line on every shipped scenario and on bad variants of them.
"""

from __future__ import annotations

import sys
from typing import Any

from netsim.errors import InputError
from netsim.scenario.schema import Scenario


def check(scenario: Scenario, source: str | None = None, plugins: bool = False) -> float | None:
    """The spectral gap of the scenario's mixing matrix once every check of ``api.prepare`` passed (errors
    name ``source``); ``plugins``: a plugin was loaded (its registrations are the build's to check)."""
    if not plugins and why_built(scenario) is None:
        try:
            gap = _unbuilt(scenario, source)
        except InputError as e:
            raise e.at(source) if source else e from None
        if gap is not _BUILD:
            return gap
    from netsim.api import prepare

    return prepare(scenario, source=source).gap


def why_built(sc: Scenario) -> str | None:
    """Why ``check`` builds the scenario rather than checking it without torch (None: it need not)."""
    from netsim.compute.model_checks import FLAT, IMAGE_SIDES

    metrics = sc.evaluation.metrics
    reasons = [
        (sc.run.device == "cuda", "run.device = 'cuda' (torch tells whether there is one)"),
        (sc.data.kind != "synthetic" or sc.data.partition == "file",
         "the data are read from files (or made by a plugin)"),
        (sc.model.kind not in FLAT and sc.model.kind not in IMAGE_SIDES, "a model a plugin registers"),
        ("suboptimality" in metrics or "tracking" in metrics, "an objective metric solves the model's optimum"),
        (sc.topology.dynamic is not None, "a dynamic topology"),
        (sc.network.trace is not None, "a link trace is read from a file"),
        (sc.network.model is not None, "a plugin's link model"),
        (sc.privacy is not None and sc.privacy.record == "mixing", "the mixing record"),
    ]
    return next((why for hit, why in reasons if hit), None)


_BUILD: Any = object()  # ``_unbuilt``'s answer when a check needs the built simulation after all


def _unbuilt(sc: Scenario, source: str | None) -> Any:
    """``api.prepare``'s checks in its order, for a scenario ``why_built`` passed: the gap, or ``_BUILD`` for the
    algorithms (or churn) whose checks need the built simulation."""
    from netsim.algorithms.registry import check_topology, checks_when_built, resolve, resolve_builtin
    from netsim.compute.data import find_data_file, load_dataset
    from netsim.compute.model_checks import ModelData, check_flat
    from netsim.sim import footprint
    from netsim.sim.activation import moves_for
    from netsim.sim.churn import build_churn
    from netsim.sim.dists import check_scenario, clocks
    from netsim.sim.links import needs_full_path, outages_by_link
    from netsim.sim.streams import Streams

    # api.prepare
    footprint.check(sc)
    resolved = resolve_builtin(sc.algorithm)
    if resolved is None:
        resolve(sc.algorithm)  # an entry point's algorithm, or the one-line error naming the known ones
        return _BUILD
    check_topology(sc)
    if checks_when_built(resolved[0]):
        return _BUILD
    note = closed_form_note(sc)  # printed once the checks passed here (a built scenario prints its own)
    # Simulation, then its World
    check_scenario(sc)
    streams = Streams(sc.run.seed)
    n = sc.agents.count
    gap = mixing_gap(sc, n, streams.seed_for("topology"))
    data = load_dataset(sc.data, n, Streams(sc.run.seed if sc.data.seed is None else sc.data.seed))
    if not check_flat(sc.model, ModelData(data.features, data.classes, tuple(data.shape) if data.shape else None,
                                          sc.model)):
        return _BUILD
    churn = build_churn(sc.agents, streams, find_data_file)
    if churn is not None:  # the network attaches its outages (sim/network.py)
        return _BUILD
    moves_for(sc.agents, streams, churn)
    clocks(sc.agents, streams.rng("clock"))  # back in Simulation
    if needs_full_path(sc.network):  # Network.attach: the link models' outages (no churn, no trace file here)
        outages_by_link(sc.network, n)
    _print_note(note, source)
    return gap


def mixing_gap(sc: Scenario, n: int, seed: int) -> float | None:
    """The spectral gap of the scenario's mixing matrix, as the built world's (``sim.topology``); a fixed
    topology of up to ``DENSE_GAP_MAX`` agents with numpy only (sim/graph_arrays.py)."""
    from netsim.sim.graph_arrays import DENSE_GAP_MAX, dense_gap, dense_mixing, fixed_edges

    edges = fixed_edges(sc.topology, n) if n <= DENSE_GAP_MAX else None
    if edges is not None:
        return dense_gap(dense_mixing(n, *edges, sc.topology.mixing_kind))
    from netsim.sim.topology import spectral_gap, weighted_graph

    return spectral_gap(weighted_graph(sc.topology, n, seed)[1])


def precheck(scenario: Scenario, source: str | None = None) -> float | None:
    """The checks of the scenario's keys alone (``netsim validate --quick``): the memory estimate, the closed
    form's name, the algorithm's name and the topology with its mixing weights; returns their spectral gap.
    The algorithm's parameters, the data and the model are ``check``'s."""
    from netsim.algorithm_reference import SUMMARIES
    from netsim.algorithms import REGISTRY
    from netsim.sim import footprint
    from netsim.sim.streams import Streams

    try:
        footprint.check(scenario)
        if scenario.algorithm.name not in SUMMARIES and scenario.algorithm.name not in REGISTRY:
            from netsim.algorithms import resolve

            resolve(scenario.algorithm)  # an entry point's algorithm, or the one-line error naming the known ones
        check_closed_form(scenario, source)
        return mixing_gap(scenario, scenario.agents.count, Streams(scenario.run.seed).seed_for("topology"))
    except InputError as e:
        raise e.at(source) if source else e from None


#: what ``precheck`` leaves to ``check`` (``netsim validate --quick`` says it after its ``ok``)
QUICK_SKIPS = "data not read, model not built, algorithm parameters not checked"


def data_absent(scenario: Scenario) -> InputError | None:
    """The loader's own one-line error if the scenario's data files are not where it will look (found, never
    read: ``--quick`` stays without torch); None when they are there, for generated data and for a plugin's
    kind (its loader alone knows its files)."""
    from netsim.compute.data import find_data

    try:
        find_data(scenario.data)
    except InputError as e:
        return e
    return None


def check_closed_form(scenario: Scenario, source: str | None) -> None:
    """``[privacy] closed_form`` must name a registered closed form (a plugin's is registered by now); an
    old name works and prints a one-line note."""
    _print_note(closed_form_note(scenario), source)


def closed_form_note(scenario: Scenario) -> str | None:
    """``check_closed_form``'s check; the note an old name gets, not yet printed."""
    name = scenario.privacy.closed_form if scenario.privacy is not None else "none"
    if name == "none":
        return None
    from netsim.privacy import closed_forms as cf

    cf.lookup(name)
    return cf.deprecation_note(name)


def _print_note(note: str | None, source: str | None) -> None:
    if note:
        print(f"note: {source or 'scenario'}: {note}", file=sys.stderr)
