"""Asynchronous gossip learning, events engine against lookahead windows (``--engine windowed``).

The job of benchmarks/bench_gossip_learning.py with agents on their own clocks: Poisson activation (rate 1/s on
each local clock), clock drift uniform in [-0.01, 0.01], latency uniform in [0.05, 0.5] s, 10% loss, constant
compute time 1 ms, mushrooms logistic regression, merge-then-update on every receipt. N agents run for T
simulated seconds (``run.until``); beyond mushrooms' 6,499 training rows, synthetic data of its width (112
features, 5 rows per agent, 2,000 test rows). Both engines run in fresh subprocesses, back to back, for each size; the
trace is written (both write the same bytes: tests/test_windowed.py). Printed: simulation wall time (the
summary's), events, events/s, the ratio events/windowed, and the windowed run's lookahead, events per window and
share of its wall time in batched tensor calls; the sha256 (16 hex) of each run's trace, metrics and final models
(equal: the same bytes); the whole call's CPU seconds too (less disturbed by other work on
the machine than wall time). ``--profile N`` prints the top N cProfile entries of each run. ``--engine`` runs one
engine only; the job leaves ``model.batch_invariant`` at its default ("auto": true for these agents on their own
clocks, so the windows evaluate each step's gradients in one call, in both engines the same bits in any batch),
``--invariant`` sets it true, ``--default-gradient`` false (the windows then replay the engine's gradient batches),
``--device cuda`` puts the bank and the gradients on the
GPU, ``--algorithm`` runs the same job with asynchronous push SGD (``async_push``: every activation asks for a
gradient, merges what arrived, broadcasts to every out-neighbour), push-sum (``pushsum``) or event-triggered D-PSGD
(``event_triggered``: relative trigger, threshold 0.05), SPARQ-SGD (``sparq``: its defaults, top-10%, decaying
threshold), AD-PSGD (``adpsgd``: reply timeout 1 s) or randomized gossip (``gossip``: the same) instead of push
gossip,
``--peer-python`` runs the same job in gossipy's asynchronous node mode right after netsim's (sizes up to
mushrooms' rows), for the peer ratio. Each run's peak memory is printed too: its peak resident set (``peak GiB``)
and its largest proportional set size (``PSS GiB``: shared pages counted once; sampled every 0.5 s).

    NETSIM_DATA=../shared/data python benchmarks/bench_async.py [--agents 2000] [--seconds 30] [--profile 15]
        [--engine events|windowed|both] [--invariant | --default-gradient] [--device auto|cpu|cuda] [--peer-python PATH]
        [--algorithm push_gossip|async_push|pushsum|event_triggered|sparq|adpsgd|gossip]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MUSHROOMS_ROWS = 6499  # training rows of mushrooms (test fraction 0.2): at most one agent per row


ALGORITHMS = {"push_gossip": {"name": "push_gossip", "lr": 1.0, "batch": 0, "update": "per_receipt"},
              "async_push": {"name": "async_push", "lr": 1.0, "batch": 0},
              "pushsum": {"name": "pushsum", "lr": 1.0, "batch": 0},
              "event_triggered": {"name": "event_triggered", "lr": 1.0, "batch": 0, "trigger": "relative",
                                  "threshold": 0.05},
              "sparq": {"name": "sparq", "lr": 1.0, "batch": 0},
              "adpsgd": {"name": "adpsgd", "lr": 1.0, "batch": 0, "reply_timeout": 1.0},
              "gossip": {"name": "gossip", "lr": 1.0, "batch": 0, "reply_timeout": 1.0}}


def scenario(agents: int, seconds: float, seed: int, device: str = "auto", invariant: bool | None = None,
             algorithm: str = "push_gossip") -> dict:
    data = {"kind": "libsvm", "path": "mushrooms/mushrooms.libsvm", "test_fraction": 0.2, "partition": "iid"}
    if agents > MUSHROOMS_ROWS:  # synthetic rows of mushrooms' width, ~4 per agent as mushrooms gives 2,000 agents
        data = {"kind": "synthetic", "samples": 5 * agents, "features": 112, "partition": "iid",
                "test_samples": 2000}  # every agent scored on 2,000 held-out rows, not on a fifth of 5N
    return {
        "name": f"async_gossip_{agents}",
        "run": {"seed": seed, "until": seconds, "device": device},
        "agents": {"count": agents, "compute_time": {"kind": "constant", "value": 0.001},
                   "activation": {"kind": "poisson", "rate": 1.0},
                   "clock_drift": {"kind": "uniform", "low": -0.01, "high": 0.01}},
        "topology": {"kind": "random_regular", "degree": 4},
        "network": {"latency": {"kind": "uniform", "low": 0.05, "high": 0.5}, "loss": 0.1},
        "data": data,
        "model": {"kind": "logistic", **({} if invariant is None else {"batch_invariant": invariant})},
        "algorithm": ALGORITHMS[algorithm],
        "evaluation": {"every": 1.0e6, "metrics": ["accuracy", "agent_accuracy"]},
    }


class PssPeak:
    """The largest proportional set size of this process and its children together (shared pages counted once),
    sampled every half second from /proc (Linux; 0 elsewhere), in KiB."""

    def __init__(self):
        import threading

        self.peak, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    @staticmethod
    def _pss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            return 0

    def _sample(self) -> None:
        me = os.getpid()
        while not self.done.wait(0.5):
            kids = []
            for tid in os.listdir(f"/proc/{me}/task") if os.path.isdir(f"/proc/{me}/task") else ():
                try:
                    kids += open(f"/proc/{me}/task/{tid}/children").read().split()
                except OSError:
                    pass
            self.peak = max(self.peak, self._pss(me) + sum(self._pss(int(k)) for k in kids))

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def child(engine: str, agents: int, seconds: float, seed: int, profile: int, device: str = "auto",
          invariant: bool | None = None, threads: int = 1, algorithm: str = "push_gossip") -> None:
    """One run in this (fresh) process; its summary as the last line of JSON, the profile before it."""
    import torch

    import netsim
    from netsim.scenario import scenario_from_dict

    torch.set_num_threads(threads)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    pss = PssPeak()
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        if prof is not None:
            prof.enable()
        built = []
        r = netsim.run(scenario_from_dict(scenario(agents, seconds, seed, device, invariant, algorithm)),
                       out=tmp, engine=engine, setup=built.append)
        if prof is not None:
            prof.disable()
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        digest = {k: hashlib.sha256(b).hexdigest()[:16] for k, b in
                  (("trace", (Path(tmp) / "trace.arrows").read_bytes()),
                   ("metrics", (Path(tmp) / "metrics.csv").read_bytes()),
                   ("models", built[0].bank.W.contiguous().cpu().numpy().tobytes()))}
    pss.stop()
    if prof is not None:
        import pstats

        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(profile)
    s = r.summary
    print(json.dumps({"wall": s["wall_time"], "total": total, "cpu": cpu, "events": s["events"],
                      "gradient_batches": s["gradient_batches"], "gradients": s["gradients"],
                      "accuracy": s["accuracy"], "windows": s.get("windows"),
                      "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "peak_pss_gib": pss.peak / 2**20, "sha256": digest}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[2000])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", type=int, default=0, help="print this many cProfile entries of each run")
    ap.add_argument("--engine", choices=["events", "windowed", "both"], default="both")
    ap.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="push_gossip",
                    help="the job's algorithm (gossipy's peer job is push gossip: --peer-python runs with it only)")
    ap.add_argument("--invariant", dest="invariant", action="store_const", const=True, default=None,
                    help="model.batch_invariant = true in both engines (windows batch each step's gradients; the "
                    "default 'auto' resolves to it for this job)")
    ap.add_argument("--default-gradient", dest="invariant", action="store_const", const=False,
                    help="model.batch_invariant = false (the windows replay the engine's gradient batches)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each run (default 1: the engines "
                    "compared on one core each; 2 uses both cores of a 2-core machine for the tensor work)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="run.device: where models and gradients live (auto: cuda when torch sees a GPU)")
    ap.add_argument("--peer-python", help="a Python with gossipy-dfl installed: the same job in gossipy's "
                    "asynchronous node mode (benchmarks/peers/gossipy_job.py --async) at each size up to "
                    "6,499 agents (mushrooms' rows), right after netsim's, for the peer ratio")
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "AGENTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("NETSIM_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    if args.child:
        child(args.child[0], int(args.child[1]), args.seconds, args.seed, args.profile, args.device, args.invariant,
              args.threads, args.algorithm)
        return
    print(f"{'agents':>7} {'sim s':>6} {'engine':>8} {'wall s':>8} {'events':>10} {'events/s':>9} {'grad calls':>10} "
          f"{'accuracy':>8} {'peak GiB':>8} {'PSS GiB':>8}")
    for n in args.agents:
        got = {}
        for engine in ("events", "windowed") if args.engine == "both" else (args.engine,):
            cmd = [sys.executable, __file__, "--child", engine, str(n), "--seconds", str(args.seconds),
                   "--seed", str(args.seed), "--profile", str(args.profile), "--device", args.device,
                   "--threads", str(args.threads),
                   *{True: ["--invariant"], False: ["--default-gradient"], None: []}[args.invariant],
                   "--algorithm", args.algorithm]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            if args.profile:
                print(f"--- {engine}, {n} agents: cProfile (tottime)\n" + done.stderr[-6000:], file=sys.stderr)
            s = got[engine] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{n:>7} {args.seconds:>6g} {engine:>8} {s['wall']:>8.2f} {s['events']:>10,} "
                  f"{s['events'] / s['wall']:>9,.0f} {s['gradient_batches']:>10,} {s['accuracy']:>8.4f} "
                  f"{s['peak_gib']:>8.2f} {s['peak_pss_gib']:>8.2f}  "
                  + " ".join(f"{k} {v}" for k, v in s["sha256"].items()), flush=True)
        if args.peer_python and n <= MUSHROOMS_ROWS and args.algorithm == "push_gossip":
            peer(args.peer_python, n, args.seconds, args.seed, got)
        if len(got) < 2:
            continue
        ev, win = got["events"], got["windowed"]
        w = win["windows"]
        print(f"  events/windowed = {ev['wall'] / win['wall']:.2f}x (whole call, setup included: wall "
              f"{ev['total'] / win['total']:.2f}x, CPU {ev['cpu'] / win['cpu']:.2f}x); "
              f"lookahead {w['lookahead_s']:g} s, {w['windows']:,} windows, events per window mean "
              f"{w['events_per_window_mean']:.1f} min {w['events_per_window_min']}, batched tensor calls "
              f"{100 * w['tensor_share']:.0f}% of the windowed wall time (gradients {100 * w['gradient_share']:.0f}%); "
              f"same bytes (trace, metrics, models): {ev['sha256'] == win['sha256']}", flush=True)


def peer(python: str, n: int, seconds: float, seed: int, got: dict) -> None:
    """gossipy's asynchronous nodes on the same job (its time is discrete: 100 steps a 1 s round, delays of 5 to
    50 steps for [0.05, 0.5] s); its simulation time against netsim's, measured in this run."""
    job = Path(__file__).resolve().parent / "peers" / "gossipy_job.py"
    data = Path(os.environ["NETSIM_DATA"]) / "mushrooms" / "mushrooms.libsvm"
    cmd = [python, str(job), "--nodes", str(n), "--rounds", str(int(seconds)), "--data", str(data), "--seed",
           str(seed), "--async", "--delay", "5", "50"]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    g = json.loads(done.stdout.strip().splitlines()[-1])
    ratios = ", ".join(f"{g['sim_s'] / s['wall']:.1f}x {e}" for e, s in got.items())
    print(f"{n:>7} {seconds:>6g} {'gossipy':>8} {g['sim_s']:>8.2f} {'':>10} {'':>9} {'':>10} {g['accuracy']:>8.4f}  "
          f"(asynchronous nodes; gossipy / netsim: {ratios})", flush=True)


if __name__ == "__main__":
    main()
