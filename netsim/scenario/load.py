"""Scenario files: TOML text -> validated ``Scenario``; ``--set`` overrides; canonical text and hash."""

from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path
from typing import Any

import attrs
import tomli_w
import tomllib

from netsim.errors import InputError
from netsim.scenario.schema import DataSpec, ModelSpec, Scenario
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
    """``[algorithm] name = 'x'; lr = 0.1`` -> ``{'name': 'x', 'params': {'lr': 0.1}}``; in ``[model]`` and
    ``[data]``, the keys that are not the section's own are a plugin's arguments (``params``)."""
    algo = data.get("algorithm")
    if isinstance(algo, dict) and "params" not in algo:
        params = {k: v for k, v in algo.items() if k != "name"}
        data = {**data, "algorithm": {**({"name": algo["name"]} if "name" in algo else {}), "params": params}}
    for section, cls in (("model", ModelSpec), ("data", DataSpec)):
        table = data.get(section)
        if isinstance(table, dict) and "params" not in table:
            own = attrs.fields_dict(cls)
            extra = {k: v for k, v in table.items() if k not in own}
            if extra:
                data = {**data, section: {**{k: v for k, v in table.items() if k in own}, "params": extra}}
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


EDGES_KEYS = (("topology", "path"),)
"""Keys naming a file that is always resolved against the scenario's folder (an edges file)."""
FOUND_KEYS = (("network", "trace"), ("agents", "availability"), ("data", "path"), ("data", "test_path"),
              ("data", "partition_file"))
"""Keys naming a data file or folder (measured traces too): resolved against the scenario's folder when it is
there, else left for the data folder ($NETSIM_DATA) to find when the run is prepared."""


def _absolute(value: Any, base: Path, must_exist: bool) -> Any:
    """``base / value`` (normalised) for a relative path, if it need not or does exist; else ``value``."""
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
        return value
    p = Path(os.path.abspath(base)) / value
    try:
        found = not must_exist or p.exists()
    except (OSError, ValueError):  # a name too long, a NUL byte: left for the readers' one-line errors
        found = False
    return os.path.normpath(p) if found else value


def resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """The scenario dict with its relative paths made absolute against ``base``, the scenario file's folder:
    edges files (a dynamic schedule's too) always; data files and folders, link and availability traces when
    they exist there (otherwise the data folder is searched when the run is prepared). Values of the wrong
    type are left for the schema's checks."""
    out = copy.copy(data)
    for keys, must_exist in ((EDGES_KEYS, False), (FOUND_KEYS, True)):
        for section, key in keys:
            table = out.get(section)
            if isinstance(table, dict) and key in table:
                out[section] = {**table, key: _absolute(table[key], base, must_exist)}
    topo = out.get("topology")
    dyn = topo.get("dynamic") if isinstance(topo, dict) else None
    if isinstance(dyn, dict) and isinstance(dyn.get("graphs"), list):
        graphs = [{**g, "path": _absolute(g["path"], base, False)} if isinstance(g, dict) and "path" in g else g
                  for g in dyn["graphs"]]
        out["topology"] = {**topo, "dynamic": {**dyn, "graphs": graphs}}
    return out


def resolve_override_paths(overrides: dict[str, Any], base: Path) -> dict[str, Any]:
    """``--set`` values of path keys, typed in a shell, follow the working directory ``base`` the same way."""
    edges = {".".join(k) for k in EDGES_KEYS}
    found = {".".join(k) for k in FOUND_KEYS}
    return {k: _absolute(v, base, False) if k in edges else _absolute(v, base, True) if k in found else v
            for k, v in overrides.items()}


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None,
                  overrides_base: Path | None = None) -> Scenario:
    """Read, override and validate a scenario file. Raises InputError naming file and key. Relative paths in
    the file follow the file (``resolve_paths``), those of ``overrides`` the folder ``overrides_base`` (default:
    the working directory, where ``--set`` values are typed; a sweep file's folder for its own), so the resolved
    scenario names the files it used wherever it is run from."""
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
        overrides = resolve_override_paths(overrides or {}, overrides_base or Path.cwd())
        data = apply_overrides(resolve_paths(data, path.parent), overrides)
        return scenario_from_dict(data, str(path))
    except InputError as e:
        raise e.at(str(path)) from None
    except RecursionError:  # tables nested thousands deep ([a.a.a...]): copying them recurses
        raise InputError("", "tables nested too deeply", str(path)) from None


def to_dict(scenario: Scenario) -> dict[str, Any]:
    data = unstructure(scenario)
    algo = data["algorithm"]
    data["algorithm"] = {"name": algo["name"], **algo.get("params", {})}
    for section in ("model", "data"):
        table = data[section]
        data[section] = {**{k: v for k, v in table.items() if k != "params"}, **table.get("params", {})}
    return data


def to_toml(scenario: Scenario) -> str:
    """Canonical TOML of a resolved scenario (defaults filled in); loads back to an equal Scenario."""
    return tomli_w.dumps(to_dict(scenario))


def scenario_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
