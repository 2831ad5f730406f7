"""Scenario files: TOML text -> validated ``Scenario``; ``--set`` overrides; canonical text and hash."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from netsim.errors import InputError
from netsim.scenario.schema import Scenario
from netsim.scenario.structure import structure, unstructure


def parse_override(item: str) -> tuple[str, Any]:
    """``a.b.c=value`` -> (``a.b.c``, TOML-parsed value; bare words stay strings)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise InputError("--set", f"expected key.path=value, got {item!r}")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except (ValueError, RecursionError):  # not TOML (TOMLDecodeError), or a 4300-digit integer
        value = raw
    return key, value


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise InputError(f"--set {key}", f"{'.'.join(parts[: i + 1])} is a value, not a table")
            node = nxt
        node[parts[-1]] = value
    return out


def _lift_algorithm(data: dict[str, Any]) -> dict[str, Any]:
    """``[algorithm] name = 'x'; lr = 0.1`` -> ``{'name': 'x', 'params': {'lr': 0.1}}``."""
    algo = data.get("algorithm")
    if isinstance(algo, dict) and "params" not in algo:
        params = {k: v for k, v in algo.items() if k != "name"}
        data = {**data, "algorithm": {**({"name": algo["name"]} if "name" in algo else {}), "params": params}}
    return data


def scenario_from_dict(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    try:
        return structure(_lift_algorithm(data), Scenario)
    except InputError as e:
        raise _elsewhere(e).at(source) from None


def _elsewhere(e: InputError) -> InputError:
    """An unknown key with no near name in its table, that another section has (``[run] loss``): say where
    it belongs."""
    if not e.message.startswith("unknown key; allowed") or not e.key:
        return e
    from netsim.scenario.reference import sections

    name = e.key.rsplit(".", 1)[-1]
    home = [r["key"] for rows in sections().values() for r in rows if r["key"].rsplit(".", 1)[-1] == name]
    if not home:
        return e
    return InputError(e.key, f"unknown key; did you mean {' or '.join(home[:3])}? "
                             + e.message.removeprefix("unknown key; "), e.source)


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read, override and validate a scenario file. Raises InputError naming file and key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("", "file not found", str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("", f"cannot read: {e}", str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError("", f"not valid TOML: {e}", str(path)) from None
    except RecursionError:
        raise InputError("", "not valid TOML: nested too deeply", str(path)) from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise InputError("", f"not valid TOML: {e}", str(path)) from None
    data.setdefault("name", path.stem)
    try:
        data = apply_overrides(data, overrides or {})
        return scenario_from_dict(data, str(path))
    except InputError as e:
        raise e.at(str(path)) from None
    except RecursionError:  # tables nested thousands deep ([a.a.a...]): copying them recurses
        raise InputError("", "tables nested too deeply", str(path)) from None


def to_dict(scenario: Scenario) -> dict[str, Any]:
    data = unstructure(scenario)
    algo = data["algorithm"]
    data["algorithm"] = {"name": algo["name"], **algo.get("params", {})}
    return data


def to_toml(scenario: Scenario) -> str:
    """Canonical TOML of a resolved scenario (defaults filled in); loads back to an equal Scenario."""
    return tomli_w.dumps(to_dict(scenario))


def scenario_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
