"""A shipped scenario on both engines, back to back: the simulation's CPU and wall seconds (``Simulation.advance``,
without the imports, the data loading and the privacy report), events then auto, one fresh process per engine.

    python benchmarks/bench_shipped.py scenarios/ldp_online_cheapest.toml --repeats 2 \\
        --set agents.count=1000 --set run.rounds=50 --set run.until=60 --set algorithm.varsigma_step=1e-5

On a shared machine the CPU ratio is the steadier figure: the wall ratio moves with the load (printed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def one(scenario: str, engine: str, sets: list[str], out: str) -> dict:
    """Run in this process (the child): the simulation's CPU and wall seconds."""
    import netsim
    from netsim.cli import _overrides
    from netsim.sim.kernel import Simulation

    spent = [0.0, 0.0]
    advance = Simulation.advance

    def timed(self, *a, **k):
        c, w = time.process_time(), time.perf_counter()
        try:
            return advance(self, *a, **k)
        finally:
            spent[0] += time.process_time() - c
            spent[1] += time.perf_counter() - w

    Simulation.advance = timed
    r = netsim.run(scenario, overrides=_overrides(sets) or None, out=out, engine=engine, interruptible=False)
    return {"engine": r.summary.get("engine"), "cpu": spent[0], "wall": spent[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if a.child:
            print(json.dumps(one(a.scenario, a.child, a.sets, os.path.join(tmp, "run"))))
            return
        sets = [x for s in a.sets for x in ("--set", s)]
        for _ in range(a.repeats):
            got = {}
            for engine in ("events", "auto"):
                p = subprocess.run([sys.executable, __file__, a.scenario, "--child", engine, *sets], check=True,
                                   capture_output=True, text=True)
                got[engine] = json.loads(p.stdout.strip().splitlines()[-1])
            e, w = got["events"], got["auto"]
            print(f"events cpu {e['cpu']:.2f} s wall {e['wall']:.2f} s | auto ({w['engine']}) cpu {w['cpu']:.2f} s "
                  f"wall {w['wall']:.2f} s | events / auto: cpu {e['cpu'] / w['cpu']:.2f}x wall "
                  f"{e['wall'] / w['wall']:.2f}x", flush=True)
    if os.path.exists("/proc/loadavg"):
        with open("/proc/loadavg") as f:
            print("load average", " ".join(f.read().split()[:3]))


if __name__ == "__main__":
    main()
