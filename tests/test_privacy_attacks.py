"""The reconstruction attack (netsim/privacy/attack.py): against an independent knowledge-matrix computation on
lossless synchronous gossip (ring, complete graph, Erdos-Renyi; 1 to 3 colluding observers), monotone in the
observers, on lossy and asynchronous runs (where the recorded payloads check the linear system value for value),
the noise left in a reconstructed noisy release, the CLI, and bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import csv
import shutil
from collections import defaultdict

import numpy as np
import pytest
from typer.testing import CliRunner

from netsim.cli import app
from tests.conftest import BASE, merge
from tests.test_privacy_pairwise import muffliato_view, nominal_W

runner = CliRunner()


def gossip_scenario(n: int, topology: dict, K: int, rounds: int = 1, sigma: float = 0.0, loss: float = 0.0,
                    record: str = "payloads", **agents) -> dict:
    """Muffliato without noise and one round: gossip averaging of each agent's private value (its clipped
    gradient, times -lr), K synchronous gossip steps: El Mrini et al.'s setting."""
    return merge(BASE, {"run": {"seed": 5, "rounds": rounds}, "agents": {"count": n, **agents},
                        "topology": topology, "network": {"loss": loss},
                        "data": {"kind": "synthetic", "samples": 40 * n, "features": 5},
                        "algorithm": {"name": "muffliato", "lr": 1.0, "batch": 16, "clip": 1.0, "clip_mode": "batch",
                                      "sigma": sigma, "gossip_steps": K, "round_timeout": 0.2},
                        "evaluation": {"every": 100.0}, "privacy": {"record": record}})


def run_attack(folder, sc: dict, sets, **kw) -> list[dict]:
    from netsim.api import run
    from netsim.privacy.attack import load_run, reconstruct
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(sc), out=folder)
    f, trace, s = load_run(folder, "--attack")
    return reconstruct(f, trace, s, sets, **kw)


def independent(W: np.ndarray, nbrs, K: int, T: int, A) -> tuple[np.ndarray, np.ndarray]:
    """(reconstructed, x_uu) of every release column t * n + u from the stacked views of A plus the unit rows of
    A's own releases (what A knows), by the pseudo-inverse's projector (not the attack's SVD basis)."""
    n = len(W)
    rows = [muffliato_view(W, nbrs, K, T, a) for a in A]
    own = np.zeros((len(A) * T, n * T))
    for i, (a, t) in enumerate((a, t) for a in A for t in range(T)):
        own[i, t * n + a] = 1.0
    Kmat = np.vstack([*(r for r in rows if len(r)), own])
    P = np.linalg.pinv(Kmat, rcond=1e-10) @ Kmat
    d = np.clip(np.diag(P), 0.0, 1.0)
    return d > 1 - 1e-8, d


def by_release(rows: list[dict]) -> dict[tuple[str, int, int], dict]:
    """(observers, victim, k-th release of the victim) -> row."""
    seen: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        seen[(r["observers"], r["victim"])].append(r)
    return {(o, u, k): r for (o, u), rs in seen.items() for k, r in enumerate(sorted(rs, key=lambda r: r["round"]))}


@pytest.mark.parametrize("topology, n, K, T", [
    ({"kind": "ring"}, 8, 2, 1),
    ({"kind": "complete"}, 5, 1, 1),
    ({"kind": "erdos_renyi", "p": 0.35}, 10, 3, 1),
    ({"kind": "erdos_renyi", "p": 0.3}, 9, 2, 2),  # decentralized gradient descent: one unknown per agent and round
])
def test_reconstruction_agrees_with_an_independent_knowledge_matrix(tmp_path, topology, n, K, T):
    W, nbrs = nominal_W(n, topology)
    rng = np.random.default_rng(n * 10 + K)
    sets = [tuple(sorted(rng.choice(n, size, replace=False).tolist())) for size in (1, 2, 3)]
    rows = by_release(run_attack(tmp_path, gossip_scenario(n, topology, K, rounds=T), sets))
    assert len(rows) == sum((n - len(A)) * T for A in sets)
    some = 0
    for A in sets:
        want, x = independent(W, nbrs, K, T, A)
        label = ";".join(map(str, A))
        for u in range(n):
            if u in A:
                continue
            for t in range(T):
                r = rows[(label, u, t)]
                assert r["reconstructed"] == int(want[t * n + u]), (A, u, t)
                assert r["x_uu"] == pytest.approx(x[t * n + u], abs=1e-8)
                if r["reconstructed"]:  # the values solve the system: the recorded payloads give the release back
                    assert r["error"] < 1e-5
                    some += 1
    assert some  # every case reconstructs something (a neighbour's release seen directly)


def test_a_complete_graph_reconstructs_every_release_and_a_ring_only_the_nearest(tmp_path):
    rows = run_attack(tmp_path / "c", gossip_scenario(5, {"kind": "complete"}, K=1), [(0,)])
    assert all(r["reconstructed"] for r in rows)
    rows = run_attack(tmp_path / "r", gossip_scenario(8, {"kind": "ring"}, K=1), [(0,)])
    # one step on a ring: the observer sees its two neighbours' values only (El Mrini et al., gossip averaging)
    assert {r["victim"] for r in rows if r["reconstructed"]} == {1, 7}
    assert all(r["hops"] == 1 for r in rows if r["reconstructed"])


def test_more_observers_never_reconstruct_less(tmp_path):
    topo = {"kind": "erdos_renyi", "p": 0.25}
    rng = np.random.default_rng(3)
    order = rng.permutation(12).tolist()
    sets = [tuple(sorted(order[:k])) for k in range(1, 6)]  # nested: each set holds the one before
    rows = by_release(run_attack(tmp_path, gossip_scenario(12, topo, K=2, rounds=2), sets))
    fractions = []
    for small, big in zip(sets, sets[1:], strict=False):
        ls, lb = ";".join(map(str, small)), ";".join(map(str, big))
        for (o, u, k), r in rows.items():
            if o == ls and u not in big:
                assert rows[(lb, u, k)]["reconstructed"] >= r["reconstructed"], (small, big, u, k)
                assert rows[(lb, u, k)]["x_uu"] >= r["x_uu"] - 1e-9
    for A in sets:
        label = ";".join(map(str, A))
        got = {(u, k): r["reconstructed"] for (o, u, k), r in rows.items() if o == label}
        fractions.append(sum(v for (u, _), v in got.items() if u not in sets[-1]))
    assert fractions == sorted(fractions) and fractions[-1] > fractions[0]


@pytest.mark.parametrize("agents, loss", [
    ({}, 0.3),                                                                            # lossy links
    ({"activation": {"kind": "poisson", "rate": 2.0}}, 0.2),                              # asynchronous wake-ups
    ({"clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.3}}, 0.0),                # clocks apart: late messages
])
def test_lossy_and_asynchronous_runs_reconstruct_from_the_messages_that_arrived(tmp_path, agents, loss):
    sc = gossip_scenario(8, {"kind": "erdos_renyi", "p": 0.4}, K=2, rounds=3, loss=loss, **agents)
    sc["network"]["latency"] = {"kind": "exponential", "mean": 0.05}
    sc["algorithm"]["round_timeout"] = 0.1
    rows = run_attack(tmp_path, sc, [(a,) for a in range(8)])
    assert len(rows) == 8 * 7 * 3
    rec = [r for r in rows if r["reconstructed"]]
    assert rec and len(rec) < len(rows)
    # the knowledge matrix is the run's own: every release it says is determined comes back from the payloads
    assert max(r["error"] for r in rec) < 1e-5
    assert all(0.0 <= r["x_uu"] <= 1.0 for r in rows)


def test_a_noisy_reconstructed_release_comes_back_with_its_noise(tmp_path):
    from netsim.privacy.payloads import read_payloads

    rows = run_attack(tmp_path, gossip_scenario(6, {"kind": "ring"}, K=2, rounds=2, sigma=0.5), [(0,)])
    pay = read_payloads(tmp_path / "payloads.npz")
    rec = [r for r in rows if r["reconstructed"]]
    assert {r["victim"] for r in rec} == {1, 2, 4, 5}
    for r in rec:  # the estimate is the release itself: its error is its noise relative to the clean value
        rounds = sorted(x["round"] for x in rows if x["victim"] == r["victim"])
        i = pay.releases_of(r["victim"])[rounds.index(r["round"])]
        clean, noisy = pay.release_clean[i], pay.release_value[i]
        assert r["error"] == pytest.approx(np.linalg.norm(noisy - clean) / np.linalg.norm(clean), rel=1e-5)


def test_without_the_payloads_the_attack_still_says_what_is_reconstructible(tmp_path):
    rows = run_attack(tmp_path, gossip_scenario(5, {"kind": "complete"}, K=1, record="mixing"), [(0,)])
    assert all(r["reconstructed"] and r["error"] is None for r in rows)


def test_cli_writes_attack_csv_and_plot_and_prints_the_fraction(tmp_path):
    from netsim.api import run
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(gossip_scenario(8, {"kind": "ring"}, K=1)), out=tmp_path)
    r = runner.invoke(app, ["privacy", str(tmp_path), "--attack", "reconstruct"])
    assert r.exit_code == 0, r.output
    # each agent alone hears its two neighbours: 2 of 7 victims
    assert "16 of 56 victim releases reconstructed exactly (fraction 0.2857; 8 observer sets)" in r.stdout
    with (tmp_path / "attack.csv").open() as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == ["victim", "round", "reconstructed", "x_uu", "hops", "error", "observers"]
    assert len(got) == 56 and (tmp_path / "attack.png").stat().st_size > 0
    r = runner.invoke(app, ["privacy", str(tmp_path), "--attack", "reconstruct", "--observers", "0,3"])
    assert r.exit_code == 0 and "; 1 observer set)" in r.stdout


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path):
    from netsim.api import run
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(gossip_scenario(4, {"kind": "ring"}, K=1)), out=tmp_path / "ok")
    plain = gossip_scenario(4, {"kind": "ring"}, K=1)
    plain.pop("privacy")
    run(scenario_from_dict(plain), out=tmp_path / "plain")
    from netsim.trace.folder import END_FILES, SUMMARY_FILE

    shutil.copytree(tmp_path / "ok", tmp_path / "cut")
    for name in (SUMMARY_FILE, *END_FILES):
        (tmp_path / "cut" / name).unlink(missing_ok=True)  # a killed run writes none of these
    trace = tmp_path / "cut" / "trace.arrows"
    trace.write_bytes(trace.read_bytes()[:-8])  # without the end-of-stream marker: a cut run
    shutil.copytree(tmp_path / "ok", tmp_path / "cut_complete")  # a complete run's files beside a cut trace
    trace = tmp_path / "cut_complete" / "trace.arrows"
    trace.write_bytes(trace.read_bytes()[:-8])
    cases = [
        (tmp_path / "ok", ["--attack", "reconstruct", "--observers", "0,7"], "--observers: agent ids must be in 0..3"),
        (tmp_path / "ok", ["--attack", "replay"], "--attack: unknown attack 'replay'"),
        (tmp_path / "plain", ["--attack", "reconstruct"], "mixing.csv is missing"),
        (tmp_path / "ok", ["--audit"], "the run inserted no canaries"),
        (tmp_path / "cut", ["--attack", "reconstruct"], "the trace is incomplete"),
        (tmp_path / "cut", ["--audit"], "the trace is incomplete"),
        (tmp_path / "cut_complete", ["--attack", "reconstruct"], "trace.arrows does not record its end"),
    ]
    for folder, args, msg in cases:
        before = sorted(p.name for p in folder.iterdir())
        r = runner.invoke(app, ["privacy", str(folder), *args])
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr and not r.stdout
        assert sorted(p.name for p in folder.iterdir()) == before  # nothing written


def test_recording_the_payloads_changes_no_event_of_the_run(tmp_path):
    from netsim.api import run
    from netsim.scenario import scenario_from_dict
    from netsim.trace.io import read_trace

    sc = gossip_scenario(6, {"kind": "ring"}, K=2, rounds=2, sigma=0.5, loss=0.2)
    plain = merge(sc, {})
    plain.pop("privacy")
    run(scenario_from_dict(sc), out=tmp_path / "a")
    run(scenario_from_dict(plain), out=tmp_path / "b")
    a, b = read_trace(tmp_path / "a").table, read_trace(tmp_path / "b").table
    assert a.equals(b)
    assert (tmp_path / "a" / "metrics.csv").read_bytes() == (tmp_path / "b" / "metrics.csv").read_bytes()
    assert not (tmp_path / "b" / "payloads.npz").exists()
