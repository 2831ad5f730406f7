"""Scale benchmark: N agents x 100 synchronous D-PSGD rounds of logistic regression.

D-PSGD (Lian et al. 2017) on a ring (the paper's own topology), synthetic logistic data (20 features,
50 samples per agent, IID), batch 16, every agent wakes each 0.1 s, computes for 10 ms and exchanges
models with its two neighbours over 5 ms links with a round timeout; the run stops when every agent
has done 100 rounds. The trace is written to a temporary folder, as in a normal run. Each size runs
in a fresh subprocess (so peak RSS is its own). Reported: setup and simulation wall time, the call's
CPU time (process_time: the honest figure when other jobs share the cores), events/s,
agent-steps/s (agent rounds per second of simulation wall time), peak RSS, and growth from the
smallest size. Memory over the run (Linux): RSS after setup, at half the simulated time and at the end
of the simulation (sampled by a simpy process every 1/20 of the expected run), so "2nd half" is what
the run's second half added (bounded memory: about zero).

``--engine windowed``: the same runs through ``netsim run --engine windowed`` (rounds played as batched
windows, byte-identical trace; netsim/rounds/); ``--engine both`` runs each size with both engines, one
after the other in fresh subprocesses, and prints their ratio.

``--dp``: DP-D-PSGD instead (per-example clipping, Gaussian noise through ``Agent.privatize``, one
release per agent and round in each agent's privacy ledger), the case where memory once grew per
release; the summary's epsilon is then composed from the ledgers at the end.

``--split`` (windowed): the time split per agent, as µs of CPU time: set-up (``api.prepare``, building the
simulation) per agent, and per agent-round the driver's ``play`` with the trace writing it does
(``TraceWriter.flush`` and ``emit_columns``: rows to Arrow, the file) and without it.

``--choco``: CHOCO-SGD instead (Koloskova et al. 2019: top-10% compressed differences and public copies,
gamma 0.4), the case where compression, not mixing, is the per-agent tensor work. ``--muffliato`` (three gossip
exchanges a round after a noisy step) and ``--dfedavg`` (four local steps, then one exchange; period 0.2 s): two
more round kernels, each played by the same windowed driver.

    python benchmarks/bench_scale.py [--agents 1000 2000 5000 10000] [--rounds 100] [--threads 1]
        [--dp | --choco | --muffliato | --dfedavg]
        [--engine events|windowed|both] [--device auto|cpu|cuda] [--split]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ALGORITHMS = {  # the job's algorithm table: D-PSGD and the other round kernels, each run by both engines
    "dpsgd": {"name": "dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.05},
    "dp": {"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.05, "clip": 1.0, "noise_multiplier": 1.0},
    "choco": {"name": "choco", "lr": 0.5, "batch": 16, "round_timeout": 0.05, "gamma": 0.4, "compressor": "topk",
              "ratio": 0.1},
    # Muffliato (Cyffers et al. 2022): a noisy step, then K_g = 3 gossip exchanges a round (round timeout each)
    "muffliato": {"name": "muffliato", "lr": 0.5, "batch": 16, "round_timeout": 0.02, "sigma": 0.01,
                  "gossip_steps": 3},
    # DFedAvg (Sun, Li, Wang 2022): 4 local steps, then one gossip exchange
    "dfedavg": {"name": "dfedavg", "lr": 0.5, "lr_decay": 1.0, "batch": 16, "local_steps": 4, "weight_decay": 0.0,
                "round_timeout": 0.05},
}


def scenario(n: int, seed: int, rounds: int, trace: bool = True, dp: bool = False, device: str = "auto",
             choco: bool = False, algorithm: str | None = None) -> dict:
    alg = algorithm or ("dp" if dp else "choco" if choco else "dpsgd")
    sc = {
        "name": f"scale_{n}",
        "run": {"seed": seed, "rounds": rounds, "until": 1.0e6, "trace": trace, "device": device},
        "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.01},
                   "activation": {"kind": "periodic", "period": 0.1}},
        "topology": {"kind": "ring"},
        "network": {"latency": {"kind": "constant", "value": 0.005}},
        "data": {"kind": "synthetic", "samples": 50 * n, "features": 20, "partition": "iid"},
        "model": {"kind": "logistic"},
        "algorithm": dict(ALGORITHMS[alg]),
        "evaluation": {"every": 1.0e6, "metrics": ["loss", "accuracy"]},
    }
    if alg == "dp":
        sc["privacy"] = {"delta": 1e-5}
    if alg == "dfedavg":  # 4 local steps of 10 ms and a gossip exchange fit the 0.1 s period
        sc["agents"]["activation"]["period"] = 0.2
    return sc


def rss_mib() -> float | None:
    """Current resident set size (Linux /proc), None elsewhere."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def rss_sampler(every: float, samples: list):
    """setup hook: record (simulated time, RSS) after setup and every ``every`` simulated seconds."""

    def setup(sim) -> None:
        samples.append((0.0, rss_mib()))

        def watch():
            while True:
                yield sim.env.timeout(every)
                samples.append((sim.env.now, rss_mib()))
        sim.env.process(watch())
    return setup


def timed(owner, name: str, into: dict, key: str) -> None:
    """Wrap ``owner.name`` so that the wall and CPU seconds spent in it add up in ``into[key]`` (a pair)."""
    import time

    f = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t, c = time.perf_counter(), time.process_time()
        try:
            return f(*args, **kwargs)
        finally:
            wall, cpu = into.get(key, (0.0, 0.0))
            into[key] = (wall + time.perf_counter() - t, cpu + time.process_time() - c)
    setattr(owner, name, wrapper)


def one(n: int, rounds: int, threads: int, trace: bool, dp: bool = False, engine: str = "events",
        device: str = "auto", choco: bool = False, algorithm: str | None = None) -> dict:
    """Run one size in this process; return its figures (``split``: seconds in building the simulation, in the
    windowed driver's ``play`` and in trace writing)."""
    import resource
    import tempfile
    import time

    import torch

    torch.set_num_threads(threads)
    import netsim
    from netsim import api
    from netsim.rounds.sync import SyncRounds
    from netsim.scenario import scenario_from_dict
    from netsim.trace.io import TraceWriter

    split: dict = {}
    timed(api, "prepare", split, "setup")
    timed(SyncRounds, "play", split, "play")
    timed(TraceWriter, "flush", split, "flush")
    if hasattr(TraceWriter, "emit_columns"):  # rows handed over as columns (they call no flush)
        timed(TraceWriter, "emit_columns", split, "flush")

    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        samples: list = []
        # the events engine samples from a simpy process; the windowed runner, which runs none, reports each
        # round through its progress callback
        windowed = engine == "windowed"
        sc = scenario(n, 1, rounds, trace, dp, device, choco, algorithm)
        r = netsim.run(scenario_from_dict(sc), out=tmp, engine=engine,
                       setup=rss_sampler(rounds * sc["agents"]["activation"]["period"] / 20, samples),
                       progress=(lambda t: samples.append((t, rss_mib()))) if windowed else None)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = r.summary
    end = s["simulated_time"]
    inside = [x for x in samples if 0 < x[0] < end]
    mid = min(inside, key=lambda x: abs(x[0] - end / 2)) if inside else (end / 2, None)
    last = max((x for x in samples if x[0] <= end), key=lambda x: x[0])
    return {"agents": n, "total": total, "cpu": cpu, "sim": s["wall_time"], "events": s["events"],
            "steps": s["gradients"], "accuracy": s["accuracy"], "stop": s["stop_reason"],
            "releases": s.get("privacy_releases", 0), "epsilon": s.get("privacy_epsilon_max"),
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_setup": samples[0][1], "rss_mid": mid[1], "rss_end": last[1], "split": split}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[1000, 2000, 5000, 10000])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (small tensors: 1 is fastest)")
    ap.add_argument("--no-trace", action="store_true")
    alg = ap.add_mutually_exclusive_group()
    alg.add_argument("--dp", action="store_true", help="DP-D-PSGD with privacy ledgers instead of D-PSGD")
    alg.add_argument("--choco", action="store_true", help="CHOCO-SGD (top-10%% compression) instead of D-PSGD")
    alg.add_argument("--muffliato", action="store_true", help="Muffliato (3 gossip exchanges a round) instead")
    alg.add_argument("--dfedavg", action="store_true", help="DFedAvg (4 local steps a round) instead")
    ap.add_argument("--engine", choices=["events", "windowed", "both"], default="events")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="run.device: where models and gradients live (auto: cuda when torch sees a GPU)")
    ap.add_argument("--split", action="store_true",
                    help="print µs per agent of set-up and per agent-round of play, trace writing included and not")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        algorithm = "muffliato" if args.muffliato else "dfedavg" if args.dfedavg else None
        print(json.dumps(one(args.one, args.rounds, args.threads, not args.no_trace, args.dp, args.engine,
                             args.device, args.choco, algorithm)))
        return
    engines = ["events", "windowed"] if args.engine == "both" else [args.engine]
    print(f"{'agents':>7} {'engine':>8} {'setup s':>8} {'sim s':>8} {'total s':>8} {'CPU s':>7} {'events':>11} "
          f"{'events/s':>9} {'steps/s':>8} {'peak RSS MiB':>12} {'accuracy':>8} {'sim growth':>10} "
          f"{'CPU growth':>10} {'RSS setup':>9} {'RSS mid':>8} {'RSS end':>8} {'2nd half':>8}"
          + (f" {'releases':>10} {'max eps':>8}" if args.dp else ""))
    base: dict = {}
    for n in args.agents:
        sims = {}
        for engine in engines:
            cmd = [sys.executable, __file__, "--one", str(n), "--rounds", str(args.rounds), "--threads",
                   str(args.threads), "--engine", engine, "--device", args.device]
            flags = (("--no-trace", args.no_trace), ("--dp", args.dp), ("--choco", args.choco),
                     ("--muffliato", args.muffliato), ("--dfedavg", args.dfedavg))
            cmd += [flag for flag, on in flags if on]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{n} agents, {engine}: the run failed:\n{done.stderr}")
            out = done.stdout
            r = json.loads(out.splitlines()[-1])
            b = base.setdefault(engine, r)
            sims[engine] = r
            growth = f"{r['sim'] / b['sim']:.1f}x/{n / b['agents']:.0f}x"
            print(f"{n:>7} {engine:>8} {r['total'] - r['sim']:>8.1f} {r['sim']:>8.1f} {r['total']:>8.1f} "
                  f"{r['cpu']:>7.1f} {r['events']:>11,} {r['events'] / r['sim']:>9,.0f} {r['steps'] / r['sim']:>8,.0f} "
                  f"{r['rss_mib']:>12,.0f} {r['accuracy']:>8.4f} {growth:>10} {r['cpu'] / b['cpu']:>9.1f}x "
                  f"{mib(r['rss_setup']):>9} {mib(r['rss_mid']):>8} {mib(r['rss_end']):>8} "
                  f"{mib(r['rss_end'], r['rss_mid'], True):>8}"
                  + (f" {r['releases']:>10,} {r['epsilon'] or 0:>8.3g}" if args.dp else ""), flush=True)
            if args.split:
                print(split_line(r, args.rounds), flush=True)
        if len(sims) == 2:
            ev, win = sims["events"], sims["windowed"]
            same = all(ev[k] == win[k] for k in ("events", "accuracy", "steps"))
            print(f"{n:>7} windowed / events simulation time: {win['sim'] / ev['sim']:.3f} "
                  f"({ev['sim'] / win['sim']:.1f}x faster; events, gradients and accuracy "
                  f"{'equal' if same else 'DIFFER'})", flush=True)


def split_line(r: dict, rounds: int) -> str:
    """µs of CPU time per agent of set-up, per agent-round of play (with and without the trace writing inside it);
    wall seconds in brackets."""
    sp, n = r["split"], r["agents"]
    (sw, sc), (pw, pc), (fw, fc) = (sp.get(k, (0.0, 0.0)) for k in ("setup", "play", "flush"))
    per = 1e6 / (n * rounds)
    return (f"{n:>7} split (CPU): set-up {1e6 * sc / n:.1f} µs/agent [{sw:.2f} s wall]; play "
            f"{pc * per:.2f} µs/agent-round [{pw:.2f} s], of which trace writing {fc * per:.2f} µs [{fw:.2f} s]; "
            f"play without it {(pc - fc) * per:.2f} µs/agent-round")


def mib(x: float | None, minus: float | None = None, signed: bool = False) -> str:
    if x is None or (signed and minus is None):
        return "n/a"
    v = x - (minus or 0.0)
    return f"{v:+,.0f}" if signed else f"{v:,.0f}"


if __name__ == "__main__":
    main()
