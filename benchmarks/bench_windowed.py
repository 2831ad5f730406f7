"""Exploration: a window-synchronous vectorised step (netsim/sim/windowed.py) against the per-message engine.

The scale benchmark's setting (bench_scale.py: D-PSGD on a ring, periodic activation, constant 5 ms links,
no loss), where every round is a window in which no agent's activation can affect another's. Both run the
same scenario and seed in one process; reported: wall time of each (the engine with tracing on, as
bench_scale.py runs it), the speed-up, and whether the final models are bit-identical (they differ by float
round-off only: the engine sums simultaneous arrivals in event-queue order, the vectorised step in sender
order; tests/test_windowed.py shows bit-identity when the engine sums in sender order too). Sizes given with
``--windowed-only`` run the vectorised step alone (the engine would take too long).

    python benchmarks/bench_windowed.py [--agents 1000 10000] [--rounds 100] [--windowed-only 100000]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import scenario  # noqa: E402


def one(n: int, rounds: int, engine: bool) -> dict:
    import torch

    torch.set_num_threads(1)
    import netsim
    from netsim.api import prepare
    from netsim.scenario import scenario_from_dict
    from netsim.sim import windowed

    sc = scenario_from_dict(scenario(n, 1, rounds))
    out: dict = {"agents": n}
    t0 = time.perf_counter()
    sim = prepare(sc)
    out["setup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    W = windowed.run_dpsgd(sim, rounds)
    out["windowed"] = time.perf_counter() - t0
    del sim
    if engine:
        built: list = []
        with tempfile.TemporaryDirectory() as tmp:
            r = netsim.run(sc, out=tmp, setup=built.append)
        out["engine"] = r.summary["wall_time"]
        ref = built[0].bank.W
        out["identical"] = bool(torch.equal(ref, W))
        out["max_diff"] = float((ref - W).abs().max())
    out["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, nargs="*", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--windowed-only", type=int, nargs="*", default=[], help="sizes run without the engine")
    args = ap.parse_args()
    print(f"{'agents':>7} {'setup s':>8} {'engine s':>9} {'windowed s':>10} {'speed-up':>9} {'identical':>9} "
          f"{'max |diff|':>10} {'peak RSS MiB':>12}")
    nan = float("nan")
    for n, engine in [(n, True) for n in args.agents] + [(n, False) for n in args.windowed_only]:
        r = one(n, args.rounds, engine)
        eng = r.get("engine")
        print(f"{n:>7} {r['setup']:>8.1f} {eng or nan:>9.2f} {r['windowed']:>10.2f} "
              f"{(eng / r['windowed']) if eng else nan:>8.1f}x {str(r.get('identical', '-')):>9} "
              f"{r.get('max_diff', nan):>10.2e} {r['rss']:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
