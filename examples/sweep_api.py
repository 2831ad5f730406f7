"""Notebook-style tour of the Python API: one run, its tables, then a sweep and its aggregated table.

    python examples/sweep_api.py        (from the repository root; about a minute on 2 cores)

``netsim sweep examples/sweep_quickstart.toml`` writes the same sweep.csv (runs already complete are
skipped, so running both costs one sweep).
"""

from pathlib import Path

import netsim
from netsim.sweep import run_sweep

HERE = Path(__file__).parent


def main() -> None:
    # One run: summary, metrics and events are tables.
    result = netsim.run(HERE.parent / "scenarios/quickstart.toml",
                        overrides={"run.until": 5.0, "agents.count": 8, "data.samples": 1000},
                        out="runs/example_one")
    print(f"final accuracy {result.summary['accuracy']:.4f} after {result.summary['events']} events")
    print(result.metrics.to_pandas().tail(3))                       # evaluation rows over time
    events = result.events.to_pandas()                              # the trace, read lazily
    print(events["kind"].value_counts().head())

    # A sweep: learning rate x loss x 2 seeds on a local process pool.
    sweep = run_sweep(HERE / "sweep_quickstart.toml", jobs=2)
    print(f"ran {sweep.ran} runs; aggregated table (mean and std over seeds):")
    table = sweep.table.to_pandas()
    print(table[["algorithm.lr", "network.loss", "seeds", "accuracy_mean", "accuracy_std",
                 "messages_dropped_mean"]].to_string(index=False))


if __name__ == "__main__":  # the process pool spawns workers that import this file
    main()
