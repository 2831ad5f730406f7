"""A shipped scenario on both engines, back to back: the simulation's CPU and wall seconds (``Simulation.advance``,
without the imports, the data loading and the privacy report), events then auto, one fresh process per engine.

    python benchmarks/bench_shipped.py scenarios/ldp_online_cheapest.toml --repeats 2 \\
        --set agents.count=1000 --set run.rounds=50 --set run.until=60 --set algorithm.varsigma_step=1e-5

On a shared machine the CPU ratio is the steadier figure: the wall ratio moves with the load (printed at the end).
The CPU is also split into user and system time: a run with a large working set (an MLP at 1,000 agents) can spend
as much in the kernel, first-touching its memory, as in its own arithmetic, and how much moves with the machine's
history (docs/performance.md): the user ratio is the code's.

``--floor`` also times the arithmetic both engines do alike (CPU seconds in the simulation): every ``grad`` and
``evaluate`` call of the model, in the same batches (the exactness rule fixes them), and the DP noise draws (each
agent's from its own generator). No engine can take less, so events CPU / the fast path's share bounds the ratio the
fast path can reach on that run. An upper bound: other shared work (a mix, a kernel's QP, a validation pass outside
``evaluate``) is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def model_clock(inside: list[bool]) -> list[float]:
    """Patch every built-in model's ``grad`` and ``evaluate`` and the DP noise draws (one release's, a batch's rows)
    to add their CPU seconds (outermost calls made while ``inside[0]``: in the simulation) to the returned cell."""
    from netsim.compute import models, noise
    from netsim.privacy import mechanisms

    spent, depth = [0.0, 0.0], [0]  # CPU, of which user

    def timed(f):
        def call(*a, **k):
            if depth[0] or not inside[0]:
                return f(*a, **k)
            depth[0], c, u = 1, time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
            try:
                return f(*a, **k)
            finally:
                depth[0] = 0
                spent[0] += time.process_time() - c
                spent[1] += resource.getrusage(resource.RUSAGE_SELF).ru_utime - u
        return call

    owners = [(m, ("grad", "evaluate")) for m in (models.LogisticRegression, models.MLP, models.TorchModel)]
    owners += [(noise, ("gaussian_noise_rows", "laplace_noise_rows")),
               (mechanisms, ("gaussian_noise", "laplace_noise"))]
    for owner, names in owners:
        for name in names:
            setattr(owner, name, timed(getattr(owner, name)))
    return spent


def one(scenario: str, engine: str, sets: list[str], out: str, floor: bool = False) -> dict:
    """Run in this process (the child): the simulation's CPU and wall seconds (and the model's, with ``floor``)."""
    import netsim
    from netsim.cli import _overrides
    from netsim.sim.kernel import Simulation

    spent = [0.0, 0.0, 0.0, 0.0]  # CPU, wall, user, system
    inside = [False]
    model = model_clock(inside) if floor else [0.0, 0.0]
    advance = Simulation.advance

    def timed(self, *a, **k):
        c, w, r = time.process_time(), time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        inside[0] = True
        try:
            return advance(self, *a, **k)
        finally:
            inside[0] = False
            spent[0] += time.process_time() - c
            spent[1] += time.perf_counter() - w
            now = resource.getrusage(resource.RUSAGE_SELF)
            spent[2] += now.ru_utime - r.ru_utime
            spent[3] += now.ru_stime - r.ru_stime

    Simulation.advance = timed
    r = netsim.run(scenario, overrides=_overrides(sets) or None, out=out, engine=engine, interruptible=False)
    return {"engine": r.summary.get("engine"), "cpu": spent[0], "wall": spent[1], "user": spent[2], "sys": spent[3],
            "model": model[0], "model_user": model[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--floor", action="store_true",
                    help="also time the arithmetic both engines share (model, DP noise): the bound on the ratio")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if a.child:
            print(json.dumps(one(a.scenario, a.child, a.sets, os.path.join(tmp, "run"), a.floor)))
            return
        sets = [x for s in a.sets for x in ("--set", s)]
        for _ in range(a.repeats):
            got = {}
            for engine in ("events", "auto"):
                p = subprocess.run([sys.executable, __file__, a.scenario, "--child", engine, *sets,
                                    *(["--floor"] if a.floor else [])], check=True,
                                   capture_output=True, text=True)
                got[engine] = json.loads(p.stdout.strip().splitlines()[-1])
            e, w = got["events"], got["auto"]
            print(f"events cpu {e['cpu']:.2f} s (user {e['user']:.2f}, system {e['sys']:.2f}) wall {e['wall']:.2f} s | "
                  f"auto ({w['engine']}) cpu {w['cpu']:.2f} s (user {w['user']:.2f}, system {w['sys']:.2f}) wall "
                  f"{w['wall']:.2f} s | events / auto: cpu {e['cpu'] / w['cpu']:.2f}x user "
                  f"{e['user'] / max(w['user'], 1e-9):.2f}x wall {e['wall'] / w['wall']:.2f}x", flush=True)
            if a.floor:
                e_share, w_share = f"{e['model']:.2f} s (user {e['model_user']:.2f})", \
                    f"{w['model']:.2f} s (user {w['model_user']:.2f})"
                print(f"  shared arithmetic (grad, evaluate, noise): events {e_share}, auto {w_share} | the bound on "
                      f"events / auto: cpu {e['cpu'] / max(w['model'], 1e-9):.2f}x user "
                      f"{e['user'] / max(w['model_user'], 1e-9):.2f}x", flush=True)
    if os.path.exists("/proc/loadavg"):
        with open("/proc/loadavg") as f:
            print("load average", " ".join(f.read().split()[:3]))


if __name__ == "__main__":
    main()
