"""Resume check and cost: run a scenario uninterrupted, run it again and SIGKILL it after a checkpoint
late in the run, resume, and compare (metrics, trace bytes) and time both, in one process.

Prints whether the resumed run is identical and the ratio resume wall / uninterrupted wall, both in this
process after a warm-up run (the resume rebuilds the run up to the checkpoint without evaluation or
trace output, then runs the rest; docs/architecture.md).

    python benchmarks/bench_resume.py [scenario.toml] [--set key=value ...] [--kill-after 0.7]
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
    ap.add_argument("--kill-after", type=float, default=0.7, help="kill after the checkpoint past this fraction")
    ap.add_argument("--every", type=float, default=None, help="run.checkpoint_every (default: until / 10)")
    a = ap.parse_args()

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
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    target = a.kill_after * until
    while True:
        cks = checkpoint.checkpoints(out)
        try:
            if cks and checkpoint.load(cks[-1]).meta["time"] >= target:
                break
        except checkpoint.CorruptCheckpoint:  # pruned while we read it
            pass
        if proc.poll() is not None:
            sys.exit(f"run ended before a checkpoint past t={target}: {proc.stderr.read()}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
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


if __name__ == "__main__":
    main()
