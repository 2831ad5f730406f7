"""``netsim explore`` on a large trace: time to open it and render the first screen, and to scroll.

The trace is the one ``benchmarks/bench_scale.py`` writes (N agents of D-PSGD on a ring, 100 rounds by
default, every event traced), generated into a temporary folder unless ``--trace`` names one. Measured
in one process, headless (Textual's pilot at a fixed terminal size):

- open: reading and indexing the trace (``RunData``: every batch validated, columns to numpy, per-agent
  and per-message indexes);
- first screen: from creating the app to its first screen rendered (the lanes aggregated, all agents),
  as the pilot sees it: its pause waits until the process is idle, so it includes the columns and
  indexes that following needs, read in a thread after the first screen; "drawn" is when the first
  lanes were drawn, before that thread;
- scroll: one screen of lanes down (``PgDn``, one lane per agent), one screen of time right (``d`` x 4)
  and a zoom in (``w``), each the mean of repeated presses, redraw included; an unbound key gives the
  pilot's own cost of a key press and a pause (the floor under the others: the pilot waits in slices
  of 20 ms until one passes with under 1 ms of CPU, so wall times move in steps of 20 ms); "cpu" is
  the process's CPU time per step, the work itself.

    python benchmarks/bench_explore.py [--agents 10000] [--rounds 100] [--trace RUN] [--size 200x50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_trace(n: int, rounds: int, out: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_scale import scenario

    import netsim
    from netsim.scenario.load import scenario_from_dict

    t = time.perf_counter()
    netsim.run(scenario_from_dict(scenario(n, 0, rounds)), out=out)
    print(f"generated {n} agents x {rounds} rounds in {time.perf_counter() - t:.1f} s")
    return out


async def measure(path: Path, size: tuple[int, int], repeats: int) -> dict:
    from netsim.explore.app import Explorer
    from netsim.explore.lanes import Lanes
    from netsim.explore.model import RunData

    t = time.perf_counter()
    data = RunData(path)
    opened = time.perf_counter() - t
    drawn: list[float] = []
    draw = Lanes._draw

    def timed(self, width: int, height: int):
        out = draw(self, width, height)
        drawn.append(time.perf_counter())
        return out

    Lanes._draw = timed
    t = time.perf_counter()
    app = Explorer(path, data)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        first = time.perf_counter() - t
        out = {"events": len(data.t), "agents": data.n, "open_s": opened, "first_screen_s": first,
               "open_and_first_s": opened + first, "agents_per_lane": app.query_one(Lanes)._geom[3],
               "first_drawn_s": drawn[0] - t}
        t = time.perf_counter()
        await app.workers.wait_for_complete()  # the columns and indexes read after the first screen
        out["indexes_after_s"] = time.perf_counter() - t
        await pilot.press("m")  # one lane per agent: scrolling through them
        await pilot.pause()
        steps = (("unbound_key", ("z",)), ("page_down", ("pagedown",)), ("screen_right", ("d", "d", "d", "d")),
                 ("zoom_in", ("w",)))
        for name, keys in steps:
            times, cpu = [], []
            for _ in range(repeats):
                t, c = time.perf_counter(), time.process_time()
                await pilot.press(*keys)
                await pilot.pause()
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            out[f"{name}_ms"] = 1e3 * statistics.mean(times)
            out[f"{name}_max_ms"] = 1e3 * max(times)
            out[f"{name}_cpu_ms"] = 1e3 * statistics.mean(cpu)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--trace", type=Path, help="an existing run folder or trace.arrows (skip generating)")
    ap.add_argument("--size", default="200x50", help="terminal WIDTHxHEIGHT")
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    size = tuple(int(x) for x in a.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        path = a.trace or make_trace(a.agents, a.rounds, Path(tmp) / "run")
        trace = path / "trace.arrows" if path.is_dir() else path
        print(f"trace {trace.stat().st_size / 2**20:.0f} MiB")
        r = asyncio.run(measure(path, size, a.repeats))
    print(f"{r['events']:,} events, {r['agents']:,} agents, terminal {a.size}")
    print(f"open (read + index): {r['open_s']:.2f} s; first screen: {r['first_screen_s']:.2f} s; "
          f"total {r['open_and_first_s']:.2f} s ({r['agents_per_lane']} agents per lane); "
          f"first lanes drawn {r['open_s'] + r['first_drawn_s']:.2f} s after opening began; "
          f"indexes ready {r['indexes_after_s']:.2f} s later")
    for name in ("unbound_key", "page_down", "screen_right", "zoom_in"):
        print(f"{name.replace('_', ' ')}: {r[name + '_ms']:.0f} ms mean, {r[name + '_max_ms']:.0f} ms max, "
              f"cpu {r[name + '_cpu_ms']:.0f} ms")


if __name__ == "__main__":
    main()
