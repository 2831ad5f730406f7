"""Scenario files: the single source of truth of a run (pure data: attrs records)."""

from netsim.scenario.load import load_scenario, parse_override, scenario_from_dict, scenario_hash, to_toml
from netsim.scenario.schema import Scenario

__all__ = ["Scenario", "load_scenario", "parse_override", "scenario_from_dict", "scenario_hash", "to_toml"]
