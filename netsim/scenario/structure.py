"""Strict TOML-dict -> frozen attrs structuring.

Why not cattrs: it silently coerces (``1.5 -> 1``, ``true -> 1``) and loses the key path of a
validator's error, and failing loudly with the key's name needs both. This walker knows the
handful of types a scenario uses and names the key path and what is allowed in every error.
Range checks live in field metadata (``check``) and cross-field checks in ``__check__``.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

import attrs

from netsim.errors import InputError, did_you_mean

Check = Callable[[Any], "str | None"]


def field(default: Any = attrs.NOTHING, check: Check | None = None, doc: str = "",
          when: dict[str, tuple[Any, ...]] | None = None, quiet_default: bool = False, **kw: Any) -> Any:
    """An attrs field with a range check, a one-line doc (shown in errors and the scenario reference) and
    ``when``: the sibling keys' values under which it applies (``{"kind": ("synthetic",)}``); a field that
    does not apply is left out of the resolved scenario text while it holds its default. ``quiet_default``: left
    out of it while it holds its default whatever its siblings (a switch whose default changes nothing a run
    records: runs that leave it alone keep the scenario text, hash and trace bytes they had before it)."""
    return attrs.field(default=default, metadata={"check": check, "doc": doc, "when": when,
                                                  "quiet_default": quiet_default}, **kw)


def applies(obj: Any, f: attrs.Attribute) -> bool:
    """Whether field ``f`` of the record ``obj`` applies, given its siblings (``when`` metadata)."""
    when = f.metadata.get("when")
    return not when or all(getattr(obj, k) in v for k, v in when.items())


def omitted(obj: Any, f: attrs.Attribute) -> bool:
    """Whether field ``f`` of ``obj`` is left out of the resolved scenario text: it holds its default and does
    not apply (``when``) or is a quiet default."""
    return getattr(obj, f.name) == f.default and (f.metadata.get("quiet_default") or not applies(obj, f))


def positive(v: float) -> str | None:
    return None if v > 0 else f"must be > 0, got {v}"


def nonneg(v: float) -> str | None:
    return None if v >= 0 else f"must be >= 0, got {v}"


def probability(v: float) -> str | None:
    return None if 0 <= v <= 1 else f"must be in [0, 1], got {v}"


def fraction(v: float) -> str | None:
    """A share or a step that must be positive and at most one: (0, 1]."""
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}"


def at_least(lo: float) -> Check:
    return lambda v: None if v >= lo else f"must be >= {lo}, got {v}"


def _tname(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _join(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


def convert(value: Any, tp: Any, path: str) -> Any:
    """Convert one TOML value to ``tp`` or raise InputError naming ``path``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if attrs.has(tp):
        return structure(value, tp, path)
    if origin is Literal:
        if value in args and type(value) is type(args[0]):
            return value
        allowed = ", ".join(repr(a) for a in args)
        raise InputError(path, f"got {value!r}; allowed: {allowed}")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:  # ``X | None``: X's own error, with its inner key path
            return convert(value, inner[0], path)
        errors = []
        for a in inner:
            try:
                return convert(value, a, path)
            except InputError as e:
                errors.append(e.message)
        raise InputError(path, " or ".join(dict.fromkeys(errors)))
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise InputError(path, f"expected a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(convert(v, item, _join(path, i)) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise InputError(path, f"expected a table, got {value!r}")
        return {k: convert(v, args[1], _join(path, k)) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - schema bug, not user input
        raise TypeError(f"unsupported schema type {tp!r} at {path}")
    raise InputError(path, f"expected {_tname(tp)}, got {value!r}")


def structure(data: Any, cls: type, path: str = "") -> Any:
    """Build the frozen attrs ``cls`` from a TOML table, checking keys, types and ranges."""
    if not isinstance(data, dict):
        raise InputError(path or "<root>", f"expected a table, got {data!r}")
    fields = attrs.fields_dict(cls)
    for key in data:
        if key not in fields:
            names = [n for n in fields if not n.startswith("_")]
            raise InputError(_join(path, key), f"unknown key; {did_you_mean(key, names)}allowed keys here: "
                                               f"{', '.join(names)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, f in fields.items():
        p = _join(path, name)
        if name not in data:
            if f.default is attrs.NOTHING:
                doc = f.metadata.get("doc", "")
                raise InputError(p, "required key is missing" + (f" ({doc})" if doc else ""))
            continue
        value = convert(data[name], hints[name], p)
        check = f.metadata.get("check")
        if check is not None and (msg := check(value)):
            raise InputError(p, msg)
        kwargs[name] = value
    obj = cls(**kwargs)
    cross = getattr(obj, "__check__", None)
    if cross is not None and (problem := cross()):
        key, msg = problem
        raise InputError(_join(path, key), msg)
    return obj


def unstructure(obj: Any) -> Any:
    """attrs tree -> plain dict with ``None`` values dropped (TOML has no null), and the defaults of keys
    that do not apply (``when`` metadata) or are quiet (``quiet_default``) left out."""
    if attrs.has(type(obj)):
        out = {}
        for f in attrs.fields(type(obj)):
            if omitted(obj, f):  # e.g. data.samples of a libsvm run
                continue
            v = unstructure(getattr(obj, f.name))
            if v is not None:
                out[f.name] = v
        return out
    if isinstance(obj, tuple | list):
        return [unstructure(v) for v in obj]
    if isinstance(obj, dict):
        return {k: unstructure(v) for k, v in obj.items() if v is not None}
    return obj


def plugin_keys(section: str, what: str, kind: str, cls: type | None, spec_cls: type, given: dict) -> Any:
    """A ``[section]`` table's keys that belong to its registered ``kind`` (a model's, a dataset's), structured
    into that kind's params class ``cls``; a key neither the section (``spec_cls``) nor ``cls`` knows is one line
    naming the allowed keys."""
    own = list(attrs.fields_dict(cls)) if cls is not None else []
    for key in given:
        if key not in own:
            allowed = [f.name for f in attrs.fields(spec_cls) if f.name != "params"] + own
            raise InputError(f"{section}.{key}", f"unknown key for {what} {kind!r}; allowed keys here: "
                                                 f"{', '.join(allowed)}")
    return structure(given, cls, section) if cls is not None else None
