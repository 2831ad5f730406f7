"""Lines of the lanes widget as Textual strips: the time axis, a pane's title, its lanes from a grid of kind
codes, the pinned lane, and metric strips under them. No state: the lanes widget says what to draw.

Each lane becomes a strip of segments directly, one per run of equal style found with numpy: the same
segments rich would make of the equivalent Text (label, '|', a span per run of style, '|'), without building
it: a screen of 10,000 agents' lanes has thousands of styled runs."""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from netsim.trace.timeline import glyphs

PLOT_ROWS = 4  # rows of a metric strip: 4 x 8 levels of bar
BARS = " ▁▂▃▄▅▆▇█"
PIN = "◆"
_NULL = Style.null()


def _segment(text: str, style: Style) -> Segment:
    return _new(Segment, (text, style, None))  # Segment(text, style) without the named tuple's own __new__


_new = tuple.__new__


class Painter:
    """Draws strips; styles are parsed once (rich Text would parse them per span per redraw)."""

    def __init__(self, console):
        self.console = console
        self._styles: dict[str, Style] = {}

    def style(self, name: str) -> Style:
        st = self._styles.get(name)
        if st is None:
            st = self._styles[name] = self.console.get_style(name, default=_NULL) if name else _NULL
        return st

    def line(self, text: str, width: int, style: str = "") -> Strip:
        return Strip([Segment(text, self.style(style))]).adjust_cell_length(width)

    def axis(self, lw: int, w: int, t0: float, t1: float, width: int) -> Strip:
        axis = [" "] * w
        for q in range(5):
            col = min(w - 1, round(q * (w - 1) / 4))
            lab = f"{t0 + q * (t1 - t0) / 4:.5g}"
            start = max(0, min(w - len(lab), col - (len(lab) if q == 4 else 0)))
            axis[start:start + len(lab)] = list(lab)
        return self.line(f"{'t (s)':>{lw}} " + "".join(axis), width)

    def lanes(self, grid: np.ndarray, kind_names: list[str], labels: list[str], lw: int, width: int, col: int,
              lane: int, sel_cell: tuple[int, int] | None, past: list[float | None], col_t: np.ndarray) -> list[Strip]:
        """One strip per grid row: its label (reversed on the cursor lane, magenta when in the causal past),
        its glyphs styled by kind, the cursor column shaded, the selected cell reversed; a lane's events
        after ``past`` (the last moment its state could reach the causal agent) dimmed."""
        w = grid.shape[1]
        known = glyphs()
        chars = [known[k][0] if k in known else "?" for k in kind_names] + [" "]  # code -1: empty
        chars = np.array(chars, dtype="<U1" if all(len(c) == 1 for c in chars) else object)
        names = [known[k][1] if k in known else "white" for k in kind_names]
        distinct = list(dict.fromkeys(["", "dim", *names]))
        styles = [self.style(x) for x in distinct]
        style_ix = np.array([distinct.index(x) for x in names] + [0], dtype=np.int32)  # code -1: ""
        exact = lw + w + 2 == width
        ix_all = style_ix[grid]  # -1 indexes the last entry: empty
        for li, p in enumerate(past):
            if p is not None:
                ix_all[li] = np.where((grid[li] >= 0) & (col_t > p), 1, ix_all[li])  # "dim"
        under = ix_all[:, col].tolist()  # each lane's style under the cursor column
        # the cursor's and the selection's cells get styles of their own: ids past the named ones
        ix_all[:, col] = len(styles)
        if sel_cell is not None and 0 <= sel_cell[0] < len(grid) and 0 <= sel_cell[1] < w:
            ix_all[sel_cell] = len(styles) + 1
        new_run = np.ones(ix_all.shape, dtype=bool)  # where a run of one style begins
        new_run[:, 1:] = ix_all[:, 1:] != ix_all[:, :-1]
        picked = chars[grid]
        texts = (picked.tobytes().decode("utf-32-le") if picked.dtype != object
                 else "".join(picked.ravel().tolist()))
        out = []
        for li, ix in enumerate(ix_all):
            lstyle = "reverse bold" if li == lane else "bold"
            if past[li] is not None:
                lstyle += " magenta"
            lane_styles = [*styles, self.style((distinct[under[li]] + " on grey30").strip())]
            if sel_cell is not None and sel_cell[0] == li:
                lane_styles.append(self.style("reverse bold"))
            starts = np.flatnonzero(new_run[li])
            text = texts[li * w:(li + 1) * w]
            bounds = [*starts.tolist(), w]
            runs = [text[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
            sxs = ix[starts].tolist()
            run_styles = [lane_styles[sx] for sx in sxs]
            # unstyled text (style 0) runs on into the borders, as in rich's rendering; runs alternate, so only
            # the first and the last run can join a border
            if not sxs[0]:
                runs[0] = "|" + runs[0]
            else:
                runs.insert(0, "|")
                run_styles.insert(0, _NULL)
            if not sxs[-1]:
                runs[-1] += "|"
            else:
                runs.append("|")
                run_styles.append(_NULL)
            segs = [Segment(f"{labels[li]:>{lw}}", self.style(lstyle)), *map(_segment, runs, run_styles)]
            out.append(Strip(segs, width) if exact else Strip(segs).adjust_cell_length(width))
        return out

    def pins(self, cols: np.ndarray, lw: int, w: int, width: int, label: str = "pins") -> Strip:
        """The pinned lane: a mark at each column holding a pinned result."""
        cells = np.full(w, " ", dtype="<U1")
        cells[cols[(cols >= 0) & (cols < w)]] = PIN
        return Strip([Segment(f"{label:>{lw}}", self.style("bold yellow")), Segment("|", _NULL),
                      Segment("".join(cells.tolist()), self.style("bold yellow")),
                      Segment("|", _NULL)]).adjust_cell_length(width)

    def bars(self, val: np.ndarray, lo: float, hi: float, name: str, style: str, lw: int, width: int,
             rows: int = PLOT_ROWS) -> list[Strip]:
        """A metric over the columns as bars ``rows`` high (NaN: nothing there), between ``lo`` and ``hi``
        (shared by the panes of two runs); the top row's label is ``hi``, the bottom one's ``lo``, the
        metric's name between."""
        levels = len(BARS) - 1
        finite = np.isfinite(val)
        h = np.zeros(len(val))
        if hi > lo:
            h[finite] = (val[finite] - lo) / (hi - lo) * rows * levels
        else:
            h[finite] = rows * levels
        out = []
        for row in range(rows - 1, -1, -1):
            label = fit(hi, lw) if row == rows - 1 else fit(lo, lw) if row == 0 else name if row == rows - 2 else ""
            cell = np.clip(h - row * levels, 1 if row == 0 else 0, levels).astype(np.int64)  # lo: a sliver
            text = "".join(BARS[c] if f else " " for c, f in zip(cell.tolist(), finite.tolist()))
            out.append(Strip([Segment(f"{label[:lw]:>{lw}} ", self.style("dim")), Segment(text, self.style(style))])
                       .adjust_cell_length(width))
        return out


def step_values(t: np.ndarray, v: np.ndarray, col_t: np.ndarray) -> np.ndarray:
    """A step function's value at each column time (the last point at or before it; NaN before the first)."""
    idx = np.searchsorted(t, col_t, side="right") - 1
    return np.where(idx >= 0, v[np.clip(idx, 0, None)] if len(v) else np.nan, np.nan)


def fit(x: float, width: int) -> str:
    """x in at most ``width`` characters, with as many significant digits as fit (at least one)."""
    for digits in range(4, 0, -1):
        text = f"{x:.{digits}g}"
        if len(text) <= width:
            return text
    return text
