"""The scenario reference, generated from the schema: every key with its type, default, allowed values
(Literal types and the range checks' own messages) and description (field metadata ``doc``).
``netsim keys [SECTION]`` prints it; docs/scenario-reference.md is ``markdown()`` (a test keeps it equal)."""

from __future__ import annotations

import re
import typing
from typing import Any, Literal, Union

import attrs

from netsim.scenario.schema import Dist, Scenario

PROBES = (-1e300, -1.5, -1, 0, 0.5, 1, 2.5, 1e300)  # values fed to a range check to read what it allows


def _type(tp: Any) -> tuple[str, str]:
    """(type name, allowed values from a Literal) of a schema annotation."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "string", ", ".join(repr(a) for a in args)
    if origin in (Union, type(int | None)):
        parts = [_type(a) for a in args if a is not type(None)]  # e.g. ``bool | Literal["auto"]``: both named
        name, allowed = " or ".join(dict.fromkeys(p[0] for p in parts)), ", ".join(p[1] for p in parts if p[1])
        return name + (" (optional)" if type(None) in args else ""), allowed
    if origin in (tuple, list):
        name, allowed = _type(args[0]) if args else ("value", "")
        return f"list of {name}", allowed
    if origin is dict:
        return "table", ""
    if tp is Dist:
        return "distribution", "see [distribution]"
    if attrs.has(tp):
        return "table", "its keys follow"
    return {int: "integer", float: "number", str: "string", bool: "boolean", Any: "any"}.get(tp, str(tp)), ""


def _is_str(tp: Any) -> bool:
    return tp is str or str in typing.get_args(tp) and all(a in (str, type(None)) for a in typing.get_args(tp))


def _allowed_by_check(check, tp: Any = None) -> str:
    """What a range check allows, in its own words: the distinct messages it gives to probe values (numbers,
    or for a string key a string no key allows), less the probe itself (``got X``)."""
    if check is None:
        return ""
    seen: list[str] = []
    for v in ("\x00",) if _is_str(tp) else PROBES:
        try:
            msg = check(v)
        except Exception:  # a check written for another type (a list, a distribution)
            continue
        if msg:
            msg = re.sub(r"^got .*?; allowed: ", "", msg)
            msg = re.sub(r",? got .*$", "", msg)
            if msg not in seen:
                seen.append(msg)
    return "; ".join(seen)


def _default(f: attrs.Attribute) -> str:
    d = f.default
    if d is attrs.NOTHING:
        return "required"
    if isinstance(d, attrs.Factory):  # type: ignore[arg-type]
        return "{}"
    if d is None:
        return "none"
    if isinstance(d, Dist):
        parts = ", ".join(f"{k} = {getattr(d, k)!r}" for k in ("value", "low", "high", "mean", "sigma")
                          if getattr(d, k) is not None)
        return f'{{ kind = "{d.kind}", {parts} }}'
    if attrs.has(type(d)):
        return "(its defaults)"
    if isinstance(d, tuple):
        return "[" + ", ".join(repr(x) for x in d) + "]"
    if isinstance(d, bool):
        return str(d).lower()
    return repr(d)


def _when(f: attrs.Attribute) -> str:
    when = f.metadata.get("when")
    if f.metadata.get("quiet_default"):
        return "in a run's resolved scenario.toml only when changed"
    if not when:
        return ""
    return "only when " + " and ".join(
        f"{k} = " + " or ".join("(not given)" if v is None else repr(v) for v in vals) for k, vals in when.items())


def rows(cls: type, prefix: str, path: tuple[type, ...] = ()) -> list[dict[str, str]]:
    """One row per key of the record ``cls`` (nested records under their dotted paths; distributions and
    algorithm parameters are documented once, apart)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in attrs.fields(cls):
        if cls is Scenario and attrs.has(_record(hints[f.name]) or type(None)):
            continue  # a section: listed on its own
        tp = hints[f.name]
        name, allowed = _type(tp)
        check = _allowed_by_check(f.metadata.get("check"), tp) if tp is not Dist and _record(tp) is not Dist else ""
        doc = f.metadata.get("doc", "")
        if cls is Scenario and f.name == "name":
            doc = doc or "the run's name (default: the file's stem)"
        out.append({"key": f"{prefix}{f.name}", "type": name, "default": _default(f),
                    "allowed": "; ".join(x for x in (allowed, check) if x), "applies": _when(f), "doc": doc})
        rec = _record(tp)
        if rec is not None and rec is not Dist and rec not in path:  # a schedule's graphs are topologies again
            out += rows(rec, f"{prefix}{f.name}{'[].' if _is_list(tp) else '.'}", (*path, cls))
    return out


def _is_list(tp: Any) -> bool:
    inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return any(typing.get_origin(a) in (tuple, list) for a in inner) or typing.get_origin(tp) in (tuple, list)


def _record(tp: Any) -> type | None:
    """The attrs record inside ``tp`` (``X``, ``X | None``, ``tuple[X, ...]``), if any."""
    if attrs.has(tp):
        return tp
    for a in typing.get_args(tp):
        if a is not type(None) and (r := _record(a)) is not None:
            return r
    return None


def sections() -> dict[str, list[dict[str, str]]]:
    """Section name -> its rows; 'distribution' for the keys of every distribution table."""
    hints = typing.get_type_hints(Scenario)
    out: dict[str, list[dict[str, str]]] = {"scenario": rows(Scenario, "")}
    for f in attrs.fields(Scenario):
        rec = _record(hints[f.name])
        if rec is not None:
            out[f.name] = rows(rec, f"{f.name}.")
    for section, what in (("algorithm", "algorithm"), ("model", "model"), ("data", "dataset")):
        for r in out[section]:
            if r["key"] == f"{section}.params":
                r.update(key=f"{section}.<parameter>", type="any", default=f"per {what}")
    out["distribution"] = rows(Dist, "")
    return out


def plugin_rows(section: str, registered: dict[str, type | None]) -> list[dict[str, str]]:
    """Rows of the keys registered plugins add to ``[section]`` (a model's or dataset's own arguments: its
    attrs params class), each marked with the kind that takes it."""
    out = []
    for name, cls in sorted(registered.items()):
        for r in rows(cls, f"{section}.") if cls is not None else []:
            r["applies"] = f"only when kind = {name!r} (registered by a plugin)"
            out.append(r)
    return out


def describe(what: str, name: str, fn: Any, params: type | None, section: str) -> str:
    """``netsim models NAME`` / ``netsim datasets NAME``: the factory's docstring, where it lives, and its own
    ``[section]`` keys with type, default, allowed values and meaning."""
    import inspect

    doc = [p.strip() for p in (inspect.getdoc(fn) or "").split("\n\n") if p.strip()]
    module = inspect.getmodule(fn)
    source = getattr(module, "__file__", None) or "(unknown)"
    lines = [f"{name}: {doc[0] if doc else '(no description)'}", *(["", *doc[1:]] if len(doc) > 1 else []),
             "", f"{what} of {section}.kind = {name!r}; source: {source}", ""]
    only = f"only when kind = {name!r}"
    own = [{**r, "applies": "" if r["applies"] == only else r["applies"]} for r in kind_rows(section, name)]
    own += [{**r, "applies": ""} for r in plugin_rows(section, {name: params})]
    if not own:
        lines.append(f"no keys of its own (the [{section}] keys: netsim keys {section})")
    else:
        lines.append(f"its own keys (in [{section}], beside the common ones: netsim keys {section}):")
    for r in own:
        lines.append(f"  {r['key']}  ({r['type']}, default {r['default']})")
        lines += [f"      {x}" for x in (r["allowed"], r["applies"], r["doc"]) if x]
    return "\n".join(lines) + "\n"


def kind_rows(section: str, kind: str) -> list[dict[str, str]]:
    """Rows of the ``[section]`` keys that apply to some kinds only, ``kind`` among them (``data.label`` of
    ``kind = 'table'``, ``model.hidden`` of ``'mlp'``): a built-in kind's own keys."""
    cls = _record(typing.get_type_hints(Scenario)[section])
    own = {f.name for f in attrs.fields(cls) if kind in (f.metadata.get("when") or {}).get("kind", ())}
    return [r for r in sections()[section] if r["key"].split(".", 1)[1] in own]


def text(section: str | None = None, extra: dict[str, list[dict[str, str]]] | None = None) -> str:
    """The reference as plain lines for the terminal (``netsim keys [SECTION]``); ``extra``: rows registered
    plugins add to a section (``plugin_rows``)."""
    secs = sections()
    for name, more in (extra or {}).items():
        secs[name] = secs[name] + more
    if section is not None:
        secs = {section: secs[section]}
    lines = []
    for name, rs in secs.items():
        lines.append(f"[{name}]")
        for r in rs:
            lines.append(f"  {r['key']}  ({r['type']}, default {r['default']})")
            for label in ("allowed", "applies", "doc"):
                if r[label]:
                    lines.append(f"      {r[label] if label != 'allowed' else 'allowed: ' + r[label]}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def markdown() -> str:
    """docs/scenario-reference.md."""
    lines = ["# Scenario reference", "",
             "Generated from `netsim/scenario/schema.py` by `netsim keys --markdown` (a test keeps this page equal "
             "to it). Every key of a scenario file, with its type, default, what is allowed and what it means; "
             "`netsim keys SECTION` prints one section in the terminal. Units: seconds, bytes, bytes/s. A key "
             "marked *only when* is left out of a run folder's resolved scenario.toml unless it applies or was "
             "changed. The `[algorithm]` table holds `name` and that algorithm's parameters: "
             "`netsim algorithms NAME` lists them.", ""]
    for name, rs in sections().items():
        lines += [f"## [{name}]" if name not in ("scenario", "distribution") else
                  ("## top level" if name == "scenario" else "## distribution tables"), ""]
        if name == "distribution":
            lines += ["A distribution is an inline table, e.g. `{ kind = \"lognormal\", mean = 0.02, sigma = 0.5 }`. "
                      "Durations drawn from one must stay in [0, 1e9] s and a clock drift in (-1, 1], over all but "
                      "~1e-17 of the draws (normal: mean ± 10 sigma; exponential: 40 means; lognormal: "
                      "exp(mu ± 10 sigma)).", ""]
        lines += ["| key | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
        for r in rs:
            desc = r["doc"] + (f" ({r['applies']})" if r["applies"] else "")
            cells = [f"`{r['key']}`", r["type"], f"`{r['default']}`" if r["default"] not in ("required", "none")
                     else r["default"], r["allowed"], desc]
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)
