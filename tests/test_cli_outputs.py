"""netsim compare (labels, target, x axis by time, rounds or bytes) and per-agent metrics over time."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import netsim
from netsim.cli import app
from netsim.scenario import scenario_from_dict
from tests.conftest import BASE, merge

runner = CliRunner()
SMALL = merge(BASE, {"run": {"seed": 2, "until": 6.0}, "agents": {"count": 4},
                     "data": {"samples": 300, "features": 4}, "evaluation": {"every": 2.0}})


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    a = netsim.run(scenario_from_dict(SMALL), out=root / "lossless")
    b = netsim.run(scenario_from_dict(merge(SMALL, {"network": {"loss": 0.3},
                                                    "evaluation": {"metrics": ["loss", "accuracy",
                                                                               "agent_accuracy"]}})),
                   out=root / "lossy")
    return a, b


def test_compare_labels_runs_by_folder_and_takes_labels_target_and_x(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "c.png"
    res = runner.invoke(app, ["compare", str(a.out), str(b.out), "--out", str(out)])
    assert res.exit_code == 0 and out.is_file()
    lines = res.output.splitlines()
    assert lines[0].startswith("lossless: accuracy") and lines[1].startswith("lossy: accuracy")  # not "t (dpsgd)"
    res = runner.invoke(app, ["compare", str(a.out), str(b.out), "--out", str(out), "--labels", "p=0, p=0.3",
                              "--metric", "loss", "--target", "10", "--x", "rounds"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("p=0: loss") and "\np=0.3: loss" in res.output
    assert "reached loss <= 10 at t = 0 s" in res.output  # a loss <= 10 from the first evaluation on
    res = runner.invoke(app, ["compare", str(a.out), str(b.out), "--out", str(out), "--labels", "one"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --labels: 1 labels for 2 runs")
    res = runner.invoke(app, ["compare", str(a.out), "--out", str(out), "--x", "messages"])
    assert res.exit_code == 2 and "allowed: time, rounds, bytes" in res.stderr


def test_compare_by_bytes_reads_the_bytes_sent_from_the_trace(two_runs, tmp_path):
    from netsim.metrics.compare import bytes_at

    a, _ = two_runs
    times = [r["time"] for r in a.metrics]
    sent = bytes_at(a.out, times)
    assert sent[0] == 0.0 and sent == sorted(sent) and sent[-1] == a.summary["bytes_sent"]
    res = runner.invoke(app, ["compare", str(a.out), "--out", str(tmp_path / "b.png"), "--x", "bytes"])
    assert res.exit_code == 0 and (tmp_path / "b.png").is_file()


def test_per_agent_metrics_only_when_asked_one_row_per_agent_and_evaluation(two_runs):
    a, b = two_runs
    assert not (a.out / "agent_metrics.csv").exists()
    with open(b.out / "agent_metrics.csv") as f:
        rows = list(csv.DictReader(f))
    times = [r["time"] for r in b.metrics]
    assert len(rows) == 4 * len(times) and [r["agent"] for r in rows[:4]] == ["0", "1", "2", "3"]
    by_time: dict[float, list[float]] = {}
    for r in rows:
        by_time.setdefault(float(r["time"]), []).append(float(r["accuracy"]))
    assert sorted(by_time) == times
    for m in b.metrics:  # the per-agent table agrees with metrics.csv's mean and worst agent
        accs = by_time[m["time"]]
        assert math.isclose(np.mean(accs), m["agent_accuracy_mean"], rel_tol=1e-6)
        assert min(accs) == pytest.approx(m["agent_accuracy_min"])
    assert len({tuple(v) for v in by_time.values()}) > 1 and (b.out / "agent_accuracy.png").is_file()


def test_a_resumed_run_has_the_same_per_agent_metrics(tmp_path, monkeypatch):
    from netsim import api
    from netsim.sim.kernel import Simulation

    sc = scenario_from_dict(merge(SMALL, {"run": {"checkpoint_every": 2.5},
                                          "evaluation": {"every": 1.0, "metrics": ["accuracy", "agent_accuracy"]}}))
    # the events engine's interrupt at an event boundary (the windows': tests/test_checkpoint_windowed.py)
    ref = api.run(sc, out=tmp_path / "ref", interruptible=False, engine="events").out
    original = Simulation.boundary

    def stop_after_first_checkpoint(self):  # like Ctrl-C at t = 2.5
        original(self)
        if self.env.now >= 2.5 and not self.recorder.restored_metrics:
            self.interrupt()

    monkeypatch.setattr(Simulation, "boundary", stop_after_first_checkpoint)
    stopped = api.run(sc, out=tmp_path / "cut", interruptible=False, engine="events")
    assert stopped.summary["stop_reason"] == "interrupted" and not (stopped.out / "agent_metrics.csv").exists()
    monkeypatch.setattr(Simulation, "boundary", original)
    api.resume(stopped.out, interruptible=False)
    assert (stopped.out / "agent_metrics.csv").read_bytes() == (ref / "agent_metrics.csv").read_bytes()


def test_compare_speaks_of_a_target_only_where_there_is_one(two_runs, tmp_path):
    """No target set: no "time to target never"; --metric consensus: the runs' accuracy target does not
    apply; with --target, "reached consensus <= 0.5 at t = ..." (lower is better) reads as one statement."""
    a, b = two_runs
    out = tmp_path / "c.png"
    res = runner.invoke(app, ["compare", str(a.out), str(b.out), "--out", str(out)])
    assert res.exit_code == 0 and "target" not in res.output and "never" not in res.output
    assert f"{a.summary['messages_sent']:,} messages" in res.output
    aimed = netsim.run(scenario_from_dict(merge(SMALL, {"evaluation": {"target_accuracy": 0.5}})),
                       out=tmp_path / "aimed")
    ttt = aimed.summary["time_to_target"]
    assert ttt is not None
    res = runner.invoke(app, ["compare", str(aimed.out), "--out", str(out)])
    assert f"reached accuracy >= 0.5 at t = {ttt:.4g} s" in res.output
    res = runner.invoke(app, ["compare", str(aimed.out), "--out", str(out), "--metric", "consensus"])
    assert res.exit_code == 0 and "reached" not in res.output and "target" not in res.output
    last = aimed.metrics[-1]["consensus"]
    res = runner.invoke(app, ["compare", str(aimed.out), "--out", str(out), "--metric", "consensus",
                              "--target", "1e-30"])
    assert f"consensus {last:.4g} at the end, never settled at consensus <= 1e-30" in res.output
    values = [r["consensus"] for r in aimed.metrics]
    assert values[0] == 0 and max(values) > last  # identical models at t = 0: "first <= target" would say 0
    goal = sorted(values)[len(values) // 2]
    since = next(r["time"] for k, r in enumerate(aimed.metrics) if all(v <= goal for v in values[k:]))
    assert since > 0
    res = runner.invoke(app, ["compare", str(aimed.out), "--out", str(out), "--metric", "consensus",
                              "--target", repr(goal)])
    assert f"consensus <= {goal:g} from t = {since:.4g} s on" in res.output


def test_compare_answers_without_torch(two_runs, tmp_path):
    """Reading finished runs needs no torch (~2 s to import): checked in a fresh interpreter."""
    import subprocess
    import sys

    from tests.conftest import ROOT, cli_env

    a, b = two_runs
    args = ["compare", str(a.out), str(b.out), "--out", str(tmp_path / "c.png")]
    code = ("import sys\nfrom netsim.cli import app\n"
            f"try:\n    app(args={args!r})\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT)
    assert p.returncode == 0 and "TORCH False" in p.stderr, p.stderr
    assert (tmp_path / "c.png").stat().st_size > 0 and "lossless: accuracy" in p.stdout


# a diverged run says so: when, in which agent, what; it stops there if asked ---------------------------------
def test_divergence_is_found_in_the_models_or_metrics_of_an_evaluation():
    import torch

    from netsim.compute.evaluate import divergence

    W = torch.ones(5, 3)
    assert divergence(W, {"loss": 0.3, "tracking_mse": math.nan}) is None  # tracking is NaN by design early on
    W[3, 1], W[1, 0] = math.inf, math.nan
    assert divergence(W, {"loss": 0.3}) == {"agent": 1, "agents": 2,
                                            "what": "model parameters not finite (nan or inf)"}
    W = torch.ones(5, 3)
    W[2, 2] = 3e38
    W[4, 0] = 2e38  # each finite, their sum is not (float32)
    assert divergence(W, {}) == {"agent": 2, "agents": 0, "what": "model parameters too large to add up (the largest "
                                                                  "here: |x| = 3e+38)"}
    W = torch.ones(5, 3)
    W[0, 1] = 1e30
    assert divergence(W, {"loss": math.inf, "accuracy": 0.5}) == {
        "agent": 0, "agents": 0, "what": "loss = inf (model parameters finite, the largest here: |x| = 1e+30)"}


def test_a_diverged_run_says_when_and_in_which_agent_and_stops_if_asked(tmp_path):
    """quickstart at lr = 1e6 (the l2 term multiplies the weights by 1 - lr l2 each step): summary.json and one
    line of the CLI say when (and since when it was sound), in which agent, what; run.stop_on_divergence stops
    the run at that evaluation (stop_reason 'diverged'); `netsim keys run` documents the key."""
    import json

    from tests.conftest import ROOT

    qs = str(ROOT / "scenarios" / "quickstart.toml")
    res = runner.invoke(app, ["run", qs, "--set", "algorithm.lr=1e6", "--set", "run.until=8", "--out",
                              str(tmp_path / "a"), "-q"])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    d = s["diverged"]
    assert d["t"] == 4.0 and d["after"] == 2.0 and isinstance(d["agent"], int) and s["stop_reason"] == "until"
    assert d["what"].startswith("loss = inf (model parameters finite")
    rows = list(csv.DictReader((tmp_path / "a" / "metrics.csv").open()))
    assert [float(r["time"]) for r in rows if not math.isfinite(float(r["loss"]))][0] == 4.0  # the first one seen
    warn = [x for x in res.stderr.splitlines() if x.startswith("warning: the run diverged")]
    assert warn == [f"warning: the run diverged at t = 4 s (sound at t = 2 s), agent {d['agent']}: {d['what']}; "
                    "run.stop_on_divergence = true stops there"]
    res = runner.invoke(app, ["run", qs, "--set", "algorithm.lr=1e6", "--set", "run.until=8", "--set",
                              "run.stop_on_divergence=true", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s["stop_reason"] == "diverged" and s["simulated_time"] == 4.0 and s["diverged"] == d
    assert "DIVERGED" in res.stdout and "stopped there (run.stop_on_divergence)" in res.stderr
    assert float(list(csv.DictReader((tmp_path / "b" / "metrics.csv").open()))[-1]["time"]) == 4.0
    keys = runner.invoke(app, ["keys", "run"])
    assert "run.stop_on_divergence" in keys.stdout and "default false" in keys.stdout


def test_a_sound_run_is_as_it_was_without_the_divergence_check(tmp_path, monkeypatch):
    """The check only reads: a run that does not diverge writes the same bytes with it and without it, its
    resolved scenario does not mention the switch left at its default (so its hash and trace are unchanged),
    and its summary has no 'diverged'."""
    from netsim.sim.recorder import Recorder

    plain = netsim.run(scenario_from_dict(SMALL), out=tmp_path / "with")
    assert "diverged" not in plain.summary
    assert "stop_on_divergence" not in (tmp_path / "with" / "scenario.toml").read_text()
    monkeypatch.setattr(Recorder, "watch", lambda *a: None)
    netsim.run(scenario_from_dict(SMALL), out=tmp_path / "without")
    for f in ("trace.arrows", "metrics.csv", "scenario.toml"):
        assert (tmp_path / "with" / f).read_bytes() == (tmp_path / "without" / f).read_bytes(), f
