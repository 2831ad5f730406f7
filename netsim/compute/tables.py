"""Tabular data files (``data.kind = "table"``): CSV, Parquet or NPZ with named feature, label and group
columns. Read through pyarrow (CSV, Parquet) or numpy without pickle (NPZ); never downloaded."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from netsim.errors import InputError

SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq", ".npz")


def _columns(path: Path, key: str) -> dict[str, np.ndarray]:
    """Every column of the file as a numpy array (an NPZ 2-D array stays 2-D)."""
    name = path.name.lower()
    if name.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # a pickled array is refused, never loaded
            raise InputError(key, f"{path}: not a readable NPZ file (no pickled arrays): {_first(e)}") from None
    import pyarrow as pa

    try:
        if name.endswith((".csv", ".csv.gz")):
            from pyarrow import csv

            table = csv.read_csv(path)
        elif name.endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            raise InputError(key, f"{path}: a table is {', '.join(SUFFIXES)}, not {path.suffix or 'no suffix'!r}")
        columns = list(zip(table.column_names, table.columns, strict=True))
    except (pa.ArrowException, OSError, ValueError) as e:  # ValueError: bytes that are not UTF-8 text
        raise InputError(key, f"{path}: cannot read the table: {_first(e)}") from None
    out = {}
    for col, arr in columns:
        if arr.null_count:
            raise InputError(key, f"{path}: column {col!r} has {arr.null_count} empty or missing (NA, NaN) cells")
        out[col] = arr.to_numpy()
    return out


def _names(cols) -> str:
    """Column names for a one-line message: quoted (a name may hold any character), at most 12."""
    names = list(cols)
    return ", ".join(map(repr, names[:12])) + (f", ... ({len(names)} columns)" if len(names) > 12 else "")


def _first(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def read_table(path: Path, key: str, columns: tuple[str, ...] | None, label: str,
               group: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[str, ...]]:
    """(features (n, d) float32, labels (n,), groups (n,) or None, the feature columns used). Feature columns
    default to every column but the label and group, in file order; they must be numbers (or booleans)."""
    cols = _columns(path, key)
    for what, name in (("label", label), ("group", group)):
        if name is not None and name not in cols:
            raise InputError(f"data.{what}", f"{path}: no column {name!r}; columns: {_names(cols)}")
    names = tuple(columns) if columns is not None else tuple(c for c in cols if c not in (label, group))
    missing = [c for c in names if c not in cols]
    if missing:
        raise InputError("data.columns", f"{path}: no column {missing[0]!r}; columns: {_names(cols)}")
    if not names:
        raise InputError("data.columns", f"{path}: no feature columns besides the label and group")
    y = cols[label]
    n = len(y)
    if not n:
        raise InputError(key, f"{path}: no rows")
    parts = []
    for c in names:
        a = cols[c]
        if a.ndim not in (1, 2) or len(a) != n:
            raise InputError("data.columns", f"{path}: column {c!r} has shape {a.shape}; the label has {n} rows")
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise InputError("data.columns", f"{path}: column {c!r} is not numeric ({a.dtype})")
        parts.append(a.reshape(n, -1).astype(np.float32))
    X = np.concatenate(parts, axis=1)
    if not np.isfinite(X).all():
        raise InputError("data.columns", f"{path}: feature columns hold NaN or infinite values")
    if y.ndim != 1:
        raise InputError("data.label", f"{path}: the label column {label!r} must be one value per row")
    groups = cols[group] if group is not None else None
    if groups is not None and groups.shape != (n,):
        raise InputError("data.group", f"{path}: the group column {group!r} must be one value per row")
    return X, y, groups, names
