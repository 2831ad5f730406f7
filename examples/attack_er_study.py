"""Who can reconstruct whom on an Erdos-Renyi graph: El Mrini, Cyffers, Bellet, "Privacy Attacks in Decentralized
Learning" (ICML 2024), their gossip-averaging experiment (fraction of nodes reconstructed against n*p, for 1, 2 and 3
attackers, n in {20, ..., 100}, T = min(n p / |A|, n / 2) synchronous rounds), then what loss, asynchrony and DP
noise do to it. The runs are two sweeps of scenarios/attack_er.toml; every run is attacked with
``netsim.privacy.attack.reconstruct`` (the knowledge matrix of the run's own mixing record).

    python examples/attack_er_study.py [--jobs 2] [--out runs/sweeps] [--figure docs/images/attack_er.png]

Writes OUT/attack_er_study.csv (one row per run and number of attackers) and the figure. Choices the paper leaves
open: T = ceil(n p / |A|) gossip steps (n p / |A| need not be an integer); one attacker is every agent alone, 2 and 3
attackers are ``SETS`` random sets per graph; graphs are G(n, p) redrawn until connected (netsim's erdos_renyi), one
per (n, n p).
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
SETS = 20  # random attacker sets of 2 and 3 agents per graph
WITHIN = 0.1  # "recovered": estimate within this relative L2 error of the private value


def attack_run(folder: str, n: int, c: int, seed: int, sizes: tuple[int, ...], values: bool) -> list[dict]:
    """The fraction of non-attacker agents each number of attackers reconstructs in one run (mean over sets)."""
    from netsim.privacy.attack import load_run, reconstruct

    f, trace, sc = load_run(folder, "--attack")
    out = []
    for k in sizes:
        if k == 1:
            sets = [(a,) for a in range(n)]
        else:
            rng = np.random.default_rng([seed, n, c, k])
            sets = [tuple(sorted(rng.choice(n, k, replace=False).tolist())) for _ in range(SETS)]
        T = min(math.ceil(c / k), n // 2)
        rows = reconstruct(f, trace, sc, sets, rounds_seen=T, values=values)
        errs = [r["error"] for r in rows if r["error"] is not None]
        out.append({"n": n, "np": c, "attackers": k, "seed": seed, "T": T,
                    "fraction": float(np.mean([r["reconstructed"] for r in rows])),
                    "within": float(np.mean([e <= WITHIN for e in errs])) if errs else None})
    return out


def _params(task) -> tuple[int, int]:
    n = int(task.overrides.get("agents.count", 60))
    return n, int(round(n * task.overrides["topology.p"]))


def main(argv: list[str] | None = None) -> None:
    from netsim.sweep import load_sweep, run_sweep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="runs/sweeps")
    ap.add_argument("--figure", default=str(HERE / "docs" / "images" / "attack_er.png"))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    er = load_sweep(HERE / "scenarios" / "attack_er_sweep.toml", Path(a.out) / "attack_er_sweep")
    cond = load_sweep(HERE / "scenarios" / "attack_er_conditions_sweep.toml",
                      Path(a.out) / "attack_er_conditions_sweep")
    run_sweep(er, jobs=a.jobs)
    run_sweep(cond, jobs=a.jobs)
    t_runs = time.perf_counter() - t0
    jobs = []
    for t in er.tasks:
        n, c = _params(t)
        jobs.append(("er", "", (t.folder, n, c, t.seed, (1, 2, 3), c == 4 and n == 60)))
    for t in cond.tasks:
        n, c = _params(t)
        o = t.overrides
        what = (f"loss {o['network.loss']}" if "network.loss" in o else "clocks apart" if "agents.clock_offset.kind"
                in o or "agents.clock_offset" in o else f"sigma {o['algorithm.sigma']}")
        jobs.append(("conditions", what, (t.folder, n, c, t.seed, (1,), what.startswith("sigma"))))
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        results = list(ex.map(_attack, jobs))
    rows = [{"experiment": e, "condition": what, **r} for (e, what, _), rs in zip(jobs, results, strict=True)
            for r in rs]
    out = Path(a.out) / "attack_er_study.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    figure(rows, Path(a.figure))
    total = time.perf_counter() - t0
    print(f"{len(er.tasks) + len(cond.tasks)} runs in {t_runs:.0f} s, attacks in {total - t_runs:.0f} s; wrote {out}, "
          f"{a.figure}")
    for k in (1, 2, 3):
        by = {c: np.mean([r["fraction"] for r in rows if r["experiment"] == "er" and r["attackers"] == k
                          and r["np"] == c]) for c in (3, 4, 5, 6)}
        print(f"  {k} attacker(s): fraction reconstructed at n p = 3..6: "
              + ", ".join(f"{by[c]:.3f}" for c in (3, 4, 5, 6)))


def _attack(job):
    return attack_run(*job[2])


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nps = [3, 4, 5, 6]
    er = [r for r in rows if r["experiment"] == "er"]
    cond = [r for r in rows if r["experiment"] == "conditions"]

    def mean(rs, c):
        v = [r["fraction"] for r in rs if r["np"] == c]
        return float(np.mean(v)) if v else np.nan

    fig, ax = plt.subplots(1, 4, figsize=(15, 3.6))
    for k, col in zip((1, 2, 3), ("tab:red", "tab:orange", "tab:purple"), strict=True):
        rs = [r for r in er if r["attackers"] == k]
        per_n = [[mean([r for r in rs if r["n"] == n], c) for c in nps] for n in sorted({r["n"] for r in rs})]
        ax[0].fill_between(nps, np.min(per_n, 0), np.max(per_n, 0), color=col, alpha=0.15)
        ax[0].plot(nps, [mean(rs, c) for c in nps], "o-", color=col, label=f"{k} attacker{'s' if k > 1 else ''}")
    ax[0].set_title("gossip averaging on G(n, p) (El Mrini et al.)\nmean over n = 20..100 (band: min-max over n)",
                    fontsize=8)
    base = [r for r in er if r["attackers"] == 1 and r["n"] == 60]
    ax[1].plot(nps, [mean(base, c) for c in nps], "o-", color="black", label="no loss")
    for loss, col in (("loss 0.1", "tab:blue"), ("loss 0.3", "tab:cyan")):
        ax[1].plot(nps, [mean([r for r in cond if r["condition"] == loss], c) for c in nps], "s--", color=col,
                   label=loss)
    ax[1].set_title("lost messages (n = 60, 1 attacker)", fontsize=8)
    ax[2].plot(nps, [mean(base, c) for c in nps], "o-", color="black", label="synchronous")
    ax[2].plot(nps, [mean([r for r in cond if r["condition"] == "clocks apart"], c) for c in nps], "s--",
               color="tab:green", label="clocks up to 0.1 s apart\n(late messages seen, not mixed)")
    ax[2].set_title("asynchrony (n = 60, 1 attacker)", fontsize=8)
    for a in ax[:3]:
        a.set_xlabel("expected degree n p")
        a.set_xticks(nps)
        a.set_ylim(0, None)
        a.set_ylabel("fraction of agents reconstructed")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    sig = [0.0, 0.001, 0.01, 0.1]
    noisy = {0.0: [r for r in base if r["np"] == 4]}
    for s in sig[1:]:
        noisy[s] = [r for r in cond if r["condition"] == f"sigma {s}"]
    xs = [1e-4, *sig[1:]]
    ax[3].plot(xs, [np.mean([r["fraction"] for r in noisy[s]]) for s in sig], "o-", color="black",
               label="reconstructed exactly (the release)")
    ax[3].plot(xs, [np.mean([r["within"] for r in noisy[s]]) for s in sig], "^--", color="tab:red",
               label=f"private value within {WITHIN:.0%} (L2)")
    ax[3].set_xscale("log")
    ax[3].set_xticks(xs, ["0", *(f"{s:g}" for s in sig[1:])])
    ax[3].set_xlabel("noise std per coordinate (sigma)")
    ax[3].set_title("DP noise (n = 60, n p = 4, 1 attacker)", fontsize=8)
    ax[3].set_ylim(0, None)
    ax[3].grid(alpha=0.3)
    ax[3].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
