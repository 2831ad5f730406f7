"""Gossip-learning job: mushrooms logistic regression over a random 4-regular graph.

Each node, once per round (period 1 s), takes the models that reached it since the last round, each
merged and followed by one full-batch SGD step on its local data (merge-then-update on every receipt), and
pushes its model to one random neighbour (netsim/algorithms/push_gossip.py). The step size is 1.0: the
peer's model is a two-logit softmax (cross-entropy) trained with step 0.5, which is exactly this binary
logistic regression (with intercept) at step 1.0, since the gradient of its logit difference is twice the
logistic one. Messages are lost with probability 0.1 and delayed
uniformly in [0.01, 0.5] s. 100 rounds; the models are evaluated at the end only (plus the start, which
the kernel always does). Reported: simulation wall time (the simpy run, as summary.wall_time), the
whole call (data loading and setup included) in wall and CPU seconds, and the mean test accuracy of
the nodes' own models.
With ``--peer-python``, the same job also runs in the peer simulator gossipy (benchmarks/peers/gossipy_job.py,
under that interpreter, which must have gossipy-dfl installed) right after netsim's, for each size, and the
speed-up is gossipy's simulation time over netsim's, both measured in this run. Without it no speed-up is
printed (timings from another run or machine are not comparable).

``--engine windowed`` runs netsim's side with ``netsim run --engine windowed`` (the rounds played as batched
windows; the trace is the events engine's, byte for byte: tests/test_windowed.py); ``--engine both`` prints a
line for each.

    NETSIM_DATA=../shared/data python benchmarks/bench_gossip_learning.py [--nodes 100 1000] [--no-trace]
        [--peer-python PATH] [--engine events|windowed|both]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import netsim
from netsim.scenario import scenario_from_dict

PEER_JOB = Path(__file__).resolve().parent / "peers" / "gossipy_job.py"


def peer_run(python: str, nodes: int, seed: int) -> dict:
    """gossipy on the same job, in its own interpreter; its JSON line (simulation wall/CPU s, accuracy)."""
    data = Path(os.environ["NETSIM_DATA"]) / "mushrooms" / "mushrooms.libsvm"
    out = subprocess.run([python, str(PEER_JOB), "--nodes", str(nodes), "--seed", str(seed), "--data", str(data)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def scenario(nodes: int, seed: int, trace: bool) -> dict:
    return {
        "name": f"gossip_learning_{nodes}",
        "run": {"seed": seed, "rounds": 100, "until": 1.0e6, "trace": trace},
        "agents": {"count": nodes, "compute_time": {"kind": "constant", "value": 0.001},
                   "activation": {"kind": "periodic", "period": 1.0}},
        "topology": {"kind": "random_regular", "degree": 4},
        "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 0.5}, "loss": 0.1},
        "data": {"kind": "libsvm", "path": "mushrooms/mushrooms.libsvm", "test_fraction": 0.2,
                 "partition": "iid"},
        "model": {"kind": "logistic"},
        "algorithm": {"name": "push_gossip", "lr": 1.0, "batch": 0, "update": "per_receipt"},  # see above
        "evaluation": {"every": 1.0e6, "metrics": ["accuracy", "agent_accuracy"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-trace", action="store_true", help="count events without writing the trace")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (small tensors: 1 is fastest)")
    ap.add_argument("--peer-python", help="a Python with gossipy-dfl installed: run the peer's job too")
    ap.add_argument("--engine", choices=["events", "windowed", "both"], default="events")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("NETSIM_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    engines = ["events", "windowed"] if args.engine == "both" else [args.engine]
    print(f"{'nodes':>6} {'engine':>8} {'sim wall s':>10} {'total s':>8} {'CPU s':>6} {'events':>9} {'events/s':>9} "
          f"{'mean node acc':>13} {'avg-model acc':>13} {'peer sim s':>10} {'peer acc':>8} {'speed-up':>8}")
    for n in args.nodes:
        runs = []
        for engine in engines:
            with tempfile.TemporaryDirectory() as tmp:
                t0, c0 = time.perf_counter(), time.process_time()
                r = netsim.run(scenario_from_dict(scenario(n, args.seed, not args.no_trace)), out=tmp, engine=engine)
                runs.append((engine, r.summary, time.perf_counter() - t0, time.process_time() - c0))
        peer = peer_run(args.peer_python, n, args.seed) if args.peer_python else None
        for engine, s, total, cpu in runs:
            line = (f"{n:>6} {engine:>8} {s['wall_time']:>10.2f} {total:>8.2f} {cpu:>6.2f} {s['events']:>9,} "
                    f"{s['events_per_s']:>9,.0f} {s['agent_accuracy_mean']:>13.4f} {s['accuracy']:>13.4f} ")
            if peer is None:
                line += f"{'-':>10} {'-':>8} {'-':>8}  (no --peer-python: peer not run)"
            else:
                line += (f"{peer['sim_s']:>10.2f} {peer['accuracy']:>8.4f} {peer['sim_s'] / s['wall_time']:>7.1f}x "
                         f"(CPU {peer['cpu_s'] / cpu:.1f}x, netsim's whole call {peer['sim_s'] / total:.1f}x)")
            print(line, flush=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
