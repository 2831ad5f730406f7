"""DO-ADP and PrivSGP-VR under conditions their papers do not model: message loss, random delays, clock
jitter / asynchronous activation. One change at a time against the cheapest scenario, seed 0.

    python examples/do_adp_privsgp_variants.py 003     # DO-ADP, 1500 rounds, p = 0.8, k/d = 0.3
    python examples/do_adp_privsgp_variants.py 004     # PrivSGP-VR at K = K*

Prints final test accuracy/loss (and f(x_bar) - f* where the scenario measures it), consensus distance,
the comm counters (do_adp_late) and the trace's drop/timeout/stale counts; for 004 also the push-sum
weight mass sum_i w_i (n when nothing is lost).
"""

from __future__ import annotations

import sys
import time

from netsim import api
from netsim.comm.stats import comm_summary
from netsim.metrics.summary import EventCounts
from netsim.trace.io import TraceWriter

VARIANTS = {
    "004": ("scenarios/privsgp_vr_cheapest.toml", {}, {
        "reference": {},
        "loss 5%": {"network.loss": 0.05},
        "latency exp(mean 0.5 s)": {"network.latency": {"kind": "exponential", "mean": 0.5}},
        "poisson activation": {"agents.activation": {"kind": "poisson", "rate": 1.0}},
    }),
    "003": ("scenarios/do_adp_cheapest.toml",
            {"algorithm.rounds": 1500, "run.until": 1502.0, "agents.activation.p": 0.8,
             "algorithm.ratio": 0.3}, {
                "reference": {},
                "loss 5%": {"network.loss": 0.05},
                "latency exp(mean 0.3 s)": {"network.latency": {"kind": "exponential", "mean": 0.3}},
                "clock jitter U(0, 0.3)": {"agents.clock_jitter": {"kind": "uniform", "low": 0.0,
                                                                   "high": 0.3}},
            }),
}


def main(which: str) -> None:
    path, short, variants = VARIANTS[which]
    for name, ov in variants.items():
        sc = api.resolve_scenario(path, {"run.seed": 0, "run.trace": False, **short, **ov})
        counts = EventCounts()
        sim = api.prepare(sc, TraceWriter(None, {}, on_batch=counts))
        t = time.time()
        sim.run()
        m = sim.metrics[-1]
        extra = ""
        if which == "004":
            w = sim.bank.state("push_weight", shape=())
            extra = f"sum w = {float(w.sum()):.3f} (n = {len(w)}), min w = {float(w.min()):.3f} "
        kinds = {k: counts.kinds[k] for k in ("drop", "timeout", "stale") if counts.kinds[k]}
        sub = f"subopt {m['suboptimality']:.4f} " if "suboptimality" in m else ""
        print(f"{name:26s} acc {m['accuracy']:.4f} loss {m['loss']:.4g} {sub}"
              f"consensus {m.get('consensus', 0):.4g} "
              f"{extra}{comm_summary(sim)} {kinds} wall {time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "003")
