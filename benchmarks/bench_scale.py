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

``--limit``: also the same arithmetic as plain torch array code (``limit``: each agent's mini-batch gathered,
the logistic gradient, the ring mix and the update over all agents at once; no events, no trace), in a fresh
subprocess of the same run, and the fast path's (or the events engine's) simulation time over it.

``--against DIR [DIR ...]``: the same runs with the netsim of another checkout (``git worktree add /tmp/old
987affe``; this file runs with ``PYTHONPATH=DIR``), interleaved with this one's, and each engine's ratio to this
checkout. ``--repeat R`` runs every (checkout, engine) R times, interleaved, and prints medians (the machine is
shared: compare medians of interleaved runs). "sim CPU" is the CPU time of what "sim s" times (``Simulation.start``,
``advance``, ``finish``: the run's CPU less its set-up and the run folder's plots; a checkout without them: the run's
CPU less ``api.prepare``'s).

    python benchmarks/bench_scale.py [--agents 1000 2000 5000 10000] [--rounds 100] [--threads 1]
        [--dp | --choco | --muffliato | --dfedavg]
        [--engine events|windowed|both] [--device auto|cpu|cuda] [--split] [--limit]
        [--against DIR ...] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

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
    from netsim.scenario import scenario_from_dict
    from netsim.trace.io import TraceWriter

    split: dict = {}
    timed(api, "prepare", split, "setup")
    try:  # (a checkout from before round kernels has no SyncRounds: --against)
        from netsim.rounds.sync import SyncRounds

        timed(SyncRounds, "play", split, "play")
    except ImportError:
        pass
    timed(TraceWriter, "flush", split, "flush")
    try:  # what the simulation's wall time covers ("sim CPU")
        from netsim.sim.kernel import Simulation

        for name in ("start", "advance", "finish"):
            timed(Simulation, name, split, "sim")
    except ImportError:
        pass
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
        trace_bytes = sum(f.stat().st_size for f in Path(tmp).glob("trace*"))
    s = r.summary
    end = s["simulated_time"]
    inside = [x for x in samples if 0 < x[0] < end]
    mid = min(inside, key=lambda x: abs(x[0] - end / 2)) if inside else (end / 2, None)
    last = max((x for x in samples if x[0] <= end), key=lambda x: x[0])
    return {"agents": n, "total": total, "cpu": cpu, "sim": s["wall_time"], "events": s["events"],
            "sim_cpu": split["sim"][1] if "sim" in split else cpu - split.get("setup", (0.0, 0.0))[1],
            "steps": s["gradients"], "accuracy": s["accuracy"], "stop": s["stop_reason"],
            "releases": s.get("privacy_releases", 0), "epsilon": s.get("privacy_epsilon_max"),
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_setup": samples[0][1], "rss_mid": mid[1], "rss_end": last[1], "split": split, "trace": trace_bytes,
            "gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
            "netsim": str(Path(netsim.__file__).resolve().parent)}


def limit(n: int, rounds: int, threads: int, device: str = "auto", seed: int = 1) -> dict:
    """The scenario's arithmetic as plain torch array code, every agent at once: each agent's mini-batch of 16
    gathered from its 50 rows, the logistic gradient (the gradient service's batched float operations), the ring
    mix with Metropolis weights 1/3 and the step; no events, no trace, no per-agent Python. What the simulators
    cannot beat; the ``--limit`` line."""
    import resource
    import time

    import torch

    torch.set_num_threads(threads)
    t0, c0 = time.perf_counter(), time.process_time()
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)  # its own seeded stream
    m, d, batch, lr = 50, 20, 16, 0.5
    w_star = torch.randn(d, generator=gen, device=dev)
    w_star *= 3.0 / w_star.norm()
    X = torch.randn(n * m, d, generator=gen, device=dev)
    y = (X @ w_star + 0.3 * torch.randn(n * m, generator=gen, device=dev) > 0).float()  # data.noise 0.1, x 3
    W = torch.zeros(n, d + 1, device=dev)
    first = (torch.arange(n, device=dev) * m).unsqueeze(1)  # agent i's rows: i*m .. i*m + m - 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t1, c1 = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        rows = first + torch.randint(0, m, (n, batch), generator=gen, device=dev)  # each agent's mini-batch
        W = limit_round(W, X, y, rows, lr)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t2, c2 = time.perf_counter(), time.process_time()
    mean = W.mean(0)
    accuracy = float((((X @ mean[:d] + mean[d]) > 0).float() == y).float().mean())
    return {"agents": n, "total": t2 - t0, "cpu": c2 - c0, "sim": t2 - t1, "sim_cpu": c2 - c1, "events": 0,
            "steps": n * rounds, "accuracy": accuracy, "stop": "rounds", "releases": 0, "epsilon": None,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_setup": None,
            "rss_mid": None, "rss_end": None, "split": {}, "netsim": None}


def limit_round(W, X, y, rows, lr: float):
    """One D-PSGD round of every agent as arrays (``limit``): agent i's gradient at W[i] on the rows ``rows[i]`` of
    (X, y), then W[i] <- (W[i-1] + W[i] + W[i+1]) / 3 - lr * g_i (a ring's Metropolis weights)."""
    import torch

    d, batch = X.shape[1], rows.shape[1]
    Xb, yb = X[rows], y[rows]
    r = torch.sigmoid((Xb * W[:, :d].unsqueeze(1)).sum(2) + W[:, d:]) - yb  # dloss/dz
    g = torch.empty_like(W)
    g[:, :d] = torch.bmm(r.unsqueeze(1), Xb).squeeze(1) / batch
    g[:, d] = r.mean(1)
    third = 1.0 / 3.0
    return (W * third).add_(W.roll(1, 0), alpha=third).add_(W.roll(-1, 0), alpha=third).sub_(g, alpha=lr)


def checkout_label(folder: str | None) -> str:
    """A checkout's commit (short), or its folder's name."""
    where = folder or str(Path(__file__).resolve().parent)
    done = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else Path(where).name


def run_one(args, n: int, engine: str, tree: str | None) -> dict:
    """One size with one engine in a fresh subprocess (``tree``: another checkout's netsim; ``engine="limit"``:
    the plain array loop)."""
    cmd = [sys.executable, __file__, "--one", str(n), "--rounds", str(args.rounds), "--threads", str(args.threads),
           "--engine", engine, "--device", args.device]
    flags = (("--no-trace", args.no_trace), ("--dp", args.dp), ("--choco", args.choco),
             ("--muffliato", args.muffliato), ("--dfedavg", args.dfedavg))
    cmd += [flag for flag, on in flags if on]
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{n} agents, {engine}{'' if tree is None else ' at ' + tree}: the run failed:\n{done.stderr}")
    r = json.loads(done.stdout.splitlines()[-1])
    if tree is not None and not str(r["netsim"]).startswith(str(Path(tree).resolve())):
        sys.exit(f"--against {tree}: the run imported netsim from {r['netsim']}, not from that checkout")
    return r


def median_of(rows: list[dict]) -> dict:
    """The runs' figures with each time the median over the runs (the rest from the first run)."""
    out = dict(rows[0])
    for key in ("total", "cpu", "sim", "sim_cpu"):
        out[key] = statistics.median(r[key] for r in rows)
    out["sims"] = [r["sim"] for r in rows]
    return out


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
    ap.add_argument("--engine", choices=["events", "windowed", "both", "limit"], default="events",
                    help="limit: the plain array loop alone (as --limit)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="run.device: where models and gradients live (auto: cuda when torch sees a GPU)")
    ap.add_argument("--split", action="store_true",
                    help="print µs per agent of set-up and per agent-round of play, trace writing included and not")
    ap.add_argument("--limit", action="store_true",
                    help="also the same arithmetic as plain torch array code (no events, no trace), and the ratio")
    ap.add_argument("--against", nargs="+", default=[], metavar="DIR",
                    help="also run with the netsim of these checkouts (e.g. a git worktree of an older commit)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (checkout, engine), interleaved; medians")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        if args.engine == "limit":
            print(json.dumps(limit(args.one, args.rounds, args.threads, args.device)))
            return
        algorithm = "muffliato" if args.muffliato else "dfedavg" if args.dfedavg else None
        print(json.dumps(one(args.one, args.rounds, args.threads, not args.no_trace, args.dp, args.engine,
                             args.device, args.choco, algorithm)))
        return
    for d in args.against:
        if not (Path(d) / "netsim" / "__init__.py").is_file():
            ap.error(f"--against {d}: not a netsim checkout (no netsim/__init__.py there)")
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: must be at least 1")
    if args.limit and (args.dp or args.choco or args.muffliato or args.dfedavg):
        ap.error("--limit is D-PSGD's arithmetic: run it without --dp, --choco, --muffliato or --dfedavg")
    engines = {"both": ["events", "windowed"], "limit": []}.get(args.engine, [args.engine])
    args.limit = args.limit or args.engine == "limit"
    trees: list[str | None] = [None, *args.against]
    labels = {t: checkout_label(t) for t in trees}
    runs = [(t, e) for t in trees for e in engines] + ([(None, "limit")] if args.limit else [])
    many = len(trees) > 1
    print(f"{'agents':>7} {'engine':>8}" + (f" {'checkout':>9}" if many else "")
          + f" {'setup s':>8} {'sim s':>8} {'sim CPU':>8} {'total s':>8} {'CPU s':>7} {'events':>11} "
          f"{'events/s':>9} {'steps/s':>8} {'peak RSS MiB':>12} {'accuracy':>8} {'sim growth':>10} "
          f"{'CPU growth':>10} {'RSS setup':>9} {'RSS mid':>8} {'RSS end':>8} {'2nd half':>8}"
          + (f" {'releases':>10} {'max eps':>8}" if args.dp else "")
          + (" sim s of each run" if args.repeat > 1 else ""))
    base: dict = {}
    for n in args.agents:
        got: dict = {run: [] for run in runs}
        for _ in range(args.repeat):  # interleaved: every (checkout, engine) once, then again
            for tree, engine in runs:
                got[(tree, engine)].append(run_one(args, n, engine, tree))
        sims = {run: median_of(rows) for run, rows in got.items()}
        for (tree, engine), r in sims.items():
            b = base.setdefault((tree, engine), r)
            growth = f"{r['sim'] / b['sim']:.1f}x/{n / b['agents']:.0f}x"
            rate = f"{r['events'] / r['sim']:>9,.0f}" if r["events"] else f"{'-':>9}"
            print(f"{n:>7} {engine:>8}" + (f" {labels[tree]:>9}" if many else "")
                  + f" {r['total'] - r['sim']:>8.1f} {r['sim']:>8.1f} {r['sim_cpu']:>8.1f} {r['total']:>8.1f} "
                  f"{r['cpu']:>7.1f} {r['events']:>11,} {rate} {r['steps'] / r['sim']:>8,.0f} "
                  f"{r['rss_mib']:>12,.0f} {r['accuracy']:>8.4f} {growth:>10} {r['cpu'] / b['cpu']:>9.1f}x "
                  f"{mib(r['rss_setup']):>9} {mib(r['rss_mid']):>8} {mib(r['rss_end']):>8} "
                  f"{mib(r['rss_end'], r['rss_mid'], True):>8}"
                  + (f" {r['releases']:>10,} {r['epsilon'] or 0:>8.3g}" if args.dp else "")
                  + ("  " + " ".join(f"{x:.1f}" for x in r["sims"]) if args.repeat > 1 else ""), flush=True)
            if args.split and engine != "limit":
                print(split_line(r, args.rounds), flush=True)
            if r.get("gpu_mib") is not None:
                print(f"{n:>7} {engine}: peak GPU memory {r['gpu_mib']:,.0f} MiB (torch.cuda.max_memory_allocated)",
                      flush=True)
        for tree in trees:
            if len(engines) == 2:
                ev, win = sims[(tree, "events")], sims[(tree, "windowed")]
                same = all(ev[k] == win[k] for k in ("events", "accuracy", "steps"))
                print(f"{n:>7} windowed / events simulation time{' at ' + labels[tree] if many else ''}: "
                      f"{win['sim'] / ev['sim']:.3f} ({ev['sim'] / win['sim']:.1f}x faster; events, gradients and "
                      f"accuracy {'equal' if same else 'DIFFER'})", flush=True)
        for tree in args.against:
            for engine in engines:
                ours, theirs = sims[(None, engine)], sims[(tree, engine)]
                same = all(ours[k] == theirs[k] for k in ("events", "accuracy", "steps"))
                print(f"{n:>7} {engine} {labels[None]} / {labels[tree]}: simulation time "
                      f"{ours['sim'] / theirs['sim']:.3f}, its CPU time {ours['sim_cpu'] / theirs['sim_cpu']:.3f} "
                      f"(events, gradients and accuracy {'equal' if same else 'DIFFER'})", flush=True)
        if args.limit:
            lim = sims[(None, "limit")]
            for engine in engines:
                r = sims[(None, engine)]
                print(f"{n:>7} {engine} / limit: simulation time {r['sim'] / lim['sim']:.2f}x, its CPU time "
                      f"{r['sim_cpu'] / lim['sim_cpu']:.2f}x (the limit: {lim['sim']:.2f} s, plain torch arrays, "
                      "no events, no trace)", flush=True)


def split_line(r: dict, rounds: int) -> str:
    """µs of CPU time per agent of set-up, per agent-round of play (with and without the trace writing inside it);
    wall seconds in brackets."""
    sp, n = r["split"], r["agents"]
    (sw, sc), (pw, pc), (fw, fc) = (sp.get(k, (0.0, 0.0)) for k in ("setup", "play", "flush"))
    per = 1e6 / (n * rounds)
    return (f"{n:>7} split (CPU): set-up {1e6 * sc / n:.1f} µs/agent [{sw:.2f} s wall]; play "
            f"{pc * per:.2f} µs/agent-round [{pw:.2f} s], of which trace writing {fc * per:.2f} µs [{fw:.2f} s]; "
            f"play without it {(pc - fc) * per:.2f} µs/agent-round; trace {r.get('trace', 0) / 2**20:,.0f} MiB "
            f"({r.get('trace', 0) * per / 1e6:.1f} B/agent-round)")


def mib(x: float | None, minus: float | None = None, signed: bool = False) -> str:
    if x is None or (signed and minus is None):
        return "n/a"
    v = x - (minus or 0.0)
    return f"{v:+,.0f}" if signed else f"{v:,.0f}"


if __name__ == "__main__":
    main()
