"""Resume check and cost: run a scenario uninterrupted, run it again and SIGKILL it after a checkpoint
late in the run, resume, and compare (metrics, trace bytes) and time both, in one process.

Prints whether the resumed run is identical and the ratio resume wall / uninterrupted wall, both in this
process after a warm-up run. The events engine's resume rebuilds the run up to the checkpoint without
evaluation or trace output, then runs the rest (docs/checkpoints.md).

``--engine windowed``: a D-PSGD job of ``--agents`` agents (benchmarks/bench_scale.py's scenario, ``--rounds``
rounds) played by the windowed engine with one checkpoint at ``--kill-after`` of its rounds, killed after it
and resumed: the checkpoint is restored, nothing before it is recomputed. ``--engine lookahead``: the same with
asynchronous gossip learning played as lookahead windows (benchmarks/bench_async.py's job, ``--seconds``
simulated seconds; ``--invariant``: batch-invariant gradients), its checkpoint at ``--kill-after`` of them,
between two windows. ``--engine barrier``: the D-PSGD job of ``--engine windowed`` on the quickstart's clocks (offsets,
drift, lognormal compute times of each agent's own) over lossy links, played as the barrier windows (lookahead windows
of barrier rounds), its checkpoint at ``--kill-after`` of the rounds' activations, between two tensor works. Prints
the uninterrupted run's wall time and its setup (from the call until play starts:
building and starting the simulation), the time to read the checkpoint (``checkpoint.load``), the resume's wall
time and its restore part (from the resume's start until play goes on: building the simulation, loading and
restoring the checkpoint, checking it), restore / (setup + reading: the target is <= 1.3), the ratios to the
uninterrupted run, and whether the trace, metrics and final models are identical. The resume still plays what
comes after the checkpoint, so its total is about (1 - kill-after) of the run plus the restore part.

    python benchmarks/bench_resume.py [scenario.toml] [--set key=value ...] [--kill-after 0.7]
    python benchmarks/bench_resume.py --engine windowed [--agents 10000] [--rounds 100] [--kill-after 0.8]
    python benchmarks/bench_resume.py --engine lookahead [--agents 10000] [--seconds 30] [--invariant]
    python benchmarks/bench_resume.py --engine barrier [--agents 10000] [--rounds 100] [--kill-after 0.8]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios" / "quickstart.toml"))
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--kill-after", type=float, default=None,
                    help="kill after the checkpoint past this fraction (default 0.7; --engine windowed: 0.8)")
    ap.add_argument("--every", type=float, default=None, help="run.checkpoint_every (default: until / 10)")
    ap.add_argument("--engine", choices=("events", "windowed", "lookahead", "barrier"), default="events")
    ap.add_argument("--agents", type=int, default=10000, help="--engine windowed, lookahead: the job's agents")
    ap.add_argument("--rounds", type=int, default=100, help="--engine windowed: its rounds")
    ap.add_argument("--seconds", type=float, default=30.0, help="--engine lookahead: its simulated seconds")
    ap.add_argument("--invariant", action="store_true", help="--engine lookahead: model.batch_invariant")
    ap.add_argument("--device", default="auto", help="--engine windowed, lookahead: run.device (auto, cpu, cuda)")
    a = ap.parse_args()
    if a.engine != "events":
        windowed(a.agents, a.rounds, 0.8 if a.kill_after is None else a.kill_after, a.device,
                 lookahead=a.seconds if a.engine == "lookahead" else None, invariant=a.invariant,
                 barrier=a.engine == "barrier")
        return
    kill_after = 0.7 if a.kill_after is None else a.kill_after

    from netsim import api
    from netsim.scenario import parse_override
    from netsim.sim import checkpoint
    from netsim.trace.io import TRACE_FILE

    over = dict(parse_override(s) for s in a.sets)
    sc = api.resolve_scenario(a.scenario, over)
    until = sc.run.until
    every = a.every or until / 10
    over["run.checkpoint_every"] = every
    sets = [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in over.items()]
    tmp = Path(tempfile.mkdtemp(prefix="bench_resume_"))

    api.run(a.scenario, over, out=tmp / "warm", interruptible=False)  # imports, first kernels, first plot
    t0 = time.perf_counter()
    ref = api.run(a.scenario, over, out=tmp / "ref", interruptible=False)
    t_ref = time.perf_counter() - t0

    out = tmp / "killed"
    cmd = [sys.executable, "-m", "netsim", "run", a.scenario, "--out", str(out), "-q"]
    for s in sets:
        cmd += ["--set", s]
    target = kill_after * until
    ck = killed_after(cmd, out, lambda cks: checkpoint.load(cks[-1]).meta["time"] >= target,
                      f"a checkpoint past t={target}")
    size = sum(f.stat().st_size for f in ck.path.iterdir()) / 1e6  # (a complete run deletes its checkpoints)

    t0 = time.perf_counter()
    res = api.resume(out, interruptible=False)
    t_res = time.perf_counter() - t0

    same_metrics = (out / "metrics.csv").read_bytes() == (ref.out / "metrics.csv").read_bytes()
    same_trace = (out / TRACE_FILE).read_bytes() == (ref.out / TRACE_FILE).read_bytes()
    print(f"scenario {sc.name}: until {until} s, checkpoint every {every:g} s, device {res.summary['device']}")
    print(f"killed after the checkpoint at t = {ck.meta['time']:.4g} s (event {ck.step:,}); "
          f"checkpoint {size:.2f} MB")
    print(f"identical final metrics: {same_metrics}; byte-identical trace: {same_trace}")
    print(f"uninterrupted run {t_ref:.2f} s; resume {t_res:.2f} s; ratio resume / run = {t_res / t_ref:.2f}")


def windowed(n: int, rounds: int, kill_after: float, device: str = "auto", lookahead: float | None = None,
             invariant: bool = False, barrier: bool = False) -> None:
    """Kill a windowed run after its checkpoint at ``kill_after`` of it, restore it, compare: D-PSGD's rounds (on the
    agents' own clocks: ``barrier``), or (``lookahead``: its simulated seconds) asynchronous gossip learning as
    lookahead windows."""
    import gc
    import os

    import tomli_w
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from netsim import api
    from netsim.sim import checkpoint
    from netsim.sim.kernel import Simulation
    from netsim.trace.io import TRACE_FILE

    tmp = Path(tempfile.mkdtemp(prefix="bench_resume_windowed_"))
    if lookahead is None:
        from bench_scale import scenario

        at = max(1, round(kill_after * rounds))
        sc = scenario(n, 1, rounds, device=device)
        sc["run"]["checkpoint_every_rounds"] = at  # one checkpoint, at kill_after of the rounds
        warm = scenario(200, 1, 3)
        small = {"agents.count": 200, "data.samples": warm["data"]["samples"], "run.rounds": 3}
        job, where = f"windowed D-PSGD, {n:,} agents, {rounds} rounds", f"its checkpoint at round {at}"
        if barrier:  # the quickstart's clocks and compute times, lossy links: the barrier windows
            sc["agents"] |= {"clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.05},
                             "clock_drift": {"kind": "normal", "mean": 0.0, "sigma": 0.001},
                             "compute_time": {"kind": "lognormal", "mean": 0.01, "sigma": 0.3}}
            sc["network"]["loss"] = 0.05
            job = f"barrier windows, D-PSGD on the agents' own clocks, {n:,} agents, {rounds} rounds"
            where = f"its checkpoint at {at} rounds' activations"
    else:
        from bench_async import scenario

        at = kill_after * lookahead
        sc = scenario(n, lookahead, 1, device, invariant)
        sc["run"]["checkpoint_every"] = at  # one checkpoint, the first window boundary past kill_after of the time
        small = {"agents.count": 200, "run.until": 2.0}
        job = (f"lookahead windows, asynchronous gossip learning, {n:,} agents, {lookahead:g} s"
               f"{', batch-invariant' if invariant else ''}")
        where = f"its checkpoint at t = {at:g} s"
    path = tmp / "job.toml"
    path.write_text(tomli_w.dumps(sc))
    models: list = []
    finish, advance = Simulation.finish, Simulation.advance
    started: list[float] = []

    def keep(self, interrupted=False):
        if not interrupted:
            models.append(self.world.bank.W.clone())
        finish(self, interrupted)

    def timed_advance(self, *args, **kwargs):  # where the run's setup ends and its play begins
        started.append(time.perf_counter())
        return advance(self, *args, **kwargs)

    Simulation.finish, Simulation.advance = keep, timed_advance
    api.run(path, small, out=tmp / "warm", engine="windowed", interruptible=False)
    models.clear()
    written = []
    write = checkpoint.write

    def timed(*args, **kwargs):
        t = time.perf_counter()
        p = write(*args, **kwargs)
        written.append(time.perf_counter() - t)
        return p

    checkpoint.write = timed
    started.clear()
    gc.collect()  # each measured part starts from a collected heap, as in a fresh process
    t0 = time.perf_counter()
    ref = api.run(path, out=tmp / "ref", engine="windowed", interruptible=False)
    t_ref = time.perf_counter() - t0
    t_setup = started[0] - t0
    checkpoint.write = write

    out = tmp / "killed"
    ck = killed_after([sys.executable, "-m", "netsim", "run", str(path), "--engine", "windowed", "--out", str(out),
                       "-q"], out, lambda cks: True, where)
    size = sum(f.stat().st_size for f in ck.path.iterdir()) / 1e6
    t0 = time.perf_counter()
    checkpoint.load(ck.path)  # what reading it costs (the resume reads it again)
    t_load = time.perf_counter() - t0

    gc.collect()  # (the uninterrupted run's simulation, whose cycles only a collection frees)
    t0 = time.perf_counter()
    res = api.resume(out, interruptible=False)
    t_res = time.perf_counter() - t0
    t_restore = res.summary["resume_wall_time"]

    same = {name: (out / name).read_bytes() == (ref.out / name).read_bytes() for name in (TRACE_FILE, "metrics.csv")}
    same["models"] = len(models) == 2 and torch.equal(models[0], models[1])
    load = os.getloadavg()
    print(f"{job}, device {res.summary['device']}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")
    unit = "window" if lookahead is not None or barrier else "round"
    print(f"checkpoint at {unit} {ck.step} (t = {ck.meta['state']['windowed']['end']:.4g} s, {size:.1f} MB, "
          f"written in {written[0]:.2f} s); killed after it; resumed by {res.summary['resumed_by']}")
    print(f"identical: trace {'yes' if same[TRACE_FILE] else 'NO'}, metrics {'yes' if same['metrics.csv'] else 'NO'}, "
          f"final models {'yes' if same['models'] else 'NO'}")
    print(f"uninterrupted run {t_ref:.2f} s (setup {t_setup:.2f} s, play {ref.summary['wall_time']:.2f} s); "
          f"reading the checkpoint {t_load:.2f} s; resume {t_res:.2f} s, of which restore {t_restore:.2f} s and "
          f"play {t_res - t_restore:.2f} s")
    print(f"restore / (setup + reading) = {t_restore / (t_setup + t_load):.2f} (target <= 1.3); "
          f"restore / uninterrupted = {t_restore / t_ref:.3f}; resume / uninterrupted = {t_res / t_ref:.3f}")


def killed_after(cmd: list[str], out: Path, ready, what: str):
    """Run ``cmd`` (a run writing into ``out``), SIGKILL it once ``ready(checkpoints)`` holds; its last checkpoint."""
    from netsim.sim import checkpoint

    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    while True:
        cks = checkpoint.checkpoints(out)
        try:
            if cks and ready(cks):
                break
        except checkpoint.CorruptCheckpoint:  # pruned while we read it
            pass
        if proc.poll() is not None:
            sys.exit(f"run ended before {what}: {proc.stderr.read()}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return checkpoint.load(checkpoint.checkpoints(out)[-1])


if __name__ == "__main__":
    main()
