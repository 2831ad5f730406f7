"""agent_accuracy.png at scale: beyond a few hundred agents, quantile bands instead of one line per agent."""

from __future__ import annotations

import numpy as np
import pytest

from netsim.metrics import report


@pytest.mark.parametrize("n", [20, 5000])
def test_agent_accuracy_plot_draws_lines_or_bands(tmp_path, monkeypatch, n):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    monkeypatch.setattr(plt, "close", lambda fig: None)
    rng = np.random.default_rng(1)
    rows = [(float(k), rng.random(n), np.sort(rng.random(n))) for k in range(4)]
    report.write_agent_metrics(rows, tmp_path, "t")
    ax = made[0][1]
    assert (tmp_path / "agent_accuracy.png").stat().st_size > 0
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert np.allclose(lines["mean over agents"].get_ydata(), [r[2].mean() for r in rows])
    assert np.allclose(lines["worst agent"].get_ydata(), [r[2].min() for r in rows])
    if n <= report.LINES_UP_TO:
        assert len(ax.get_lines()) == n + 2 and not ax.collections
    else:
        assert len(ax.get_lines()) == 2 and len(ax.collections) == 2  # the 5-95% and 25-75% bands
        band = ax.collections[0].get_paths()[0].vertices[:, 1]
        want = np.quantile(np.stack([r[2] for r in rows]), [0.05, 0.95], axis=1)
        assert np.isclose(band.min(), want[0].min()) and np.isclose(band.max(), want[1].max())
    with open(tmp_path / report.AGENT_METRICS) as f:
        assert sum(1 for _ in f) == 1 + 4 * n
