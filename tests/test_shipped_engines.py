"""Which engine ``--engine auto`` runs each shipped scenario on: the fast path wherever it is exact
(docs/architecture.md, "Which engine runs"). A scenario that leaves the fast path, or one that joins it, changes
this table on purpose."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import ROOT

FAST = {
    "attack_audit", "attack_er", "compare_sync_async", "compare_sync_async_gossip", "dfedsam_cheapest",
    "do_adp_cheapest", "do_adp_cpgt", "do_adp_dp_dda",
    "do_adp_dpdo", "do_adp_full", "dpsgd_bursty", "dpsgd_scale", "ldp_online_cheapest", "ldp_online_cheapest_dola",
    "ldp_online_cheapest_dola_eq", "ldp_online_cheapest_dsgd", "ldp_online_cheapest_dsgd_eq",
    "ldp_online_cheapest_pdop", "ldp_online_full", "mnist_mlp", "pdsl_cheapest", "pdsl_cheapest_dp_cga",
    "pdsl_cheapest_dp_dpsgd", "pdsl_cheapest_dp_netfleet", "pdsl_cheapest_muffliato", "pdsl_full",
    "privacy_activation", "privacy_event_triggered", "privacy_pairwise", "privacy_utility", "privsgp_vr_baselines",
    "privsgp_vr_cheapest", "privsgp_vr_full", "quickstart",
}
DATA = ROOT.parent / "shared" / "data"  # the benchmark datasets beside the checkout, where there are any
NEEDS = {"dfedsam_full"}  # CIFAR-10, which the shipped data folder does not hold
SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.toml") if "sweep" not in p.stem and p.stem not in NEEDS)


def test_the_table_names_shipped_scenarios():
    assert FAST <= {p.stem for p in SCENARIOS} and len(SCENARIOS) == 38


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_auto_runs_each_shipped_scenario_where_the_table_says(path: Path, monkeypatch):
    from netsim.api import prepare, resolve_scenario, source_of
    from netsim.errors import InputError
    from netsim.rounds import exactness, windowed

    if DATA.is_dir() and "NETSIM_DATA" not in os.environ:
        monkeypatch.setenv("NETSIM_DATA", str(DATA))
    try:
        sim = prepare(resolve_scenario(path), None, source_of(path))
    except InputError as e:
        if "data." in str(e) and "not found" in str(e):
            pytest.skip(f"its data files are not here: {e}")
        raise
    why = windowed.reason(sim) or exactness.refusal(sim)
    if path.stem in FAST:
        assert why is None
    else:  # one line: the rule, then what to change
        assert why is not None and "\n" not in why and " — " in why
