"""Rich tables that fit a terminal, or a pipe's 80 columns, without losing what tells columns apart.

Rich narrows a table that is too wide by cutting its headers: ``agent_accuracy_mean`` and
``agent_accuracy_min`` both became ``agent_acc…``, three swept keys ``algorith…``. Here a header wider than
its column's cells folds at its own word breaks (``_``, ``.``, spaces: ``agent_`` / ``accuracy_`` / ``mean``)
before rich narrows anything, so every header is shown whole; a cell is never cut inside a word (a number
stays one number), and a table that still cannot fit is printed wider than the screen rather than cut.
"""

from __future__ import annotations

import re
from typing import Any

_PART = re.compile(r"[^_.\s]+[_.]*\s*|[_.\s]+")


def fold(name: str, width: int) -> str:
    """``name`` in lines of at most ``width`` characters, broken only after ``_``, ``.`` or a space (a part
    longer than ``width`` keeps its own line)."""
    lines: list[str] = []
    for part in _PART.findall(name):
        if lines and len(lines[-1]) + len(part.rstrip()) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(x.rstrip() for x in lines) or name


def _widths(col: Any) -> tuple[int, int]:
    """A column's content width: (its longest line, of header or cell; its longest word)."""
    from rich.cells import cell_len

    lines = [ln for c in [col.header, *col.cells] for ln in str(c).split("\n")]
    return max(map(cell_len, lines), default=1), max([cell_len(w) for ln in lines for w in ln.split()] + [1])


def fit(table: Any, width: int) -> int:
    """Fit ``table`` (a ``rich.table.Table``, changed in place) to ``width`` columns and return the console
    width to print it at: ``width``, or more where its words cannot fit (the table is then wider, never cut).
    Headers fold at their word breaks, widest first, only while the table is too wide; then the widest
    columns narrow (their cells wrap at spaces), none below its longest word. (Rich's own narrowing would
    cut a word, or crop the table's right-hand columns where its minimum widths add up past the screen.)"""
    from rich.console import Console

    wide = Console(width=100_000)
    cols = table.columns
    heads = [str(col.header) for col in cols]
    content = [max((len(str(c)) for c in col.cells), default=0) for col in cols]
    for i in sorted(range(len(cols)), key=lambda i: len(heads[i]) - content[i], reverse=True):
        if wide.measure(table).maximum <= width:
            break
        if len(heads[i]) > content[i]:
            cols[i].header = fold(heads[i], max(content[i], 1))
    most, least = zip(*map(_widths, cols), strict=True) if cols else ((), ())
    overhead = wide.measure(table).maximum - sum(most)  # borders and padding
    budget = width - overhead
    if sum(most) <= budget:
        return width
    if sum(least) >= budget:
        for col, w in zip(cols, least, strict=True):
            col.width = w
        return sum(least) + overhead
    level = max(most)  # the widest columns down to one level, none below its longest word
    while sum(min(m, max(lo, level)) for m, lo in zip(most, least, strict=True)) > budget:
        level -= 1
    while True:  # and as measured (rich's padding between columns is not quite additive)
        for col, m, lo in zip(cols, most, least, strict=True):
            col.width = min(m, max(lo, level))
        if wide.measure(table).maximum <= width or level <= max(least):
            return max(width, wide.measure(table).maximum)
        level -= 1


def print_fitted(table: Any, console: Any = None) -> None:
    """Print ``table`` at the console's width (a pipe's: 80 columns), fitted by ``fit``: wider only where
    its words cannot fit."""
    from rich.console import Console

    console = console or Console()
    width = console.width
    need = fit(table, width)
    console.width = need
    try:
        console.print(table)
    finally:
        console.width = width
