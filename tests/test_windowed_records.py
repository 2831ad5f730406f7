"""The privacy records on the fast path: synchronous windows write ``mixing.csv`` and ``payloads.npz`` (with an audit's
canaries) byte for byte as the events engine's agents do, and ``netsim privacy`` reads the same from both folders."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from netsim.scenario import scenario_from_dict
from tests.search import search
from tests.test_round_kernels import run_both

# a run says nothing it need not (e.g. torch's warning on a read-only index array)
pytestmark = pytest.mark.filterwarnings("error::UserWarning")

RECORDS = ("trace.arrows", "metrics.csv", "mixing.csv", "payloads.npz")
MUFF = {"name": "muffliato", "lr": 0.3, "batch": 8, "clip": 1.0, "clip_mode": "batch", "sigma": 1.0,
        "gossip_steps": 3, "round_timeout": 0.05}


def private(n: int = 8, rounds: int = 3, record: str = "payloads", **changes) -> dict:
    sc = {"name": "records", "run": {"seed": 5, "rounds": rounds},
          "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.01},
                     "activation": {"kind": "periodic", "period": 0.1}},
          "topology": {"kind": "erdos_renyi", "p": 0.5, "mixing": "metropolis_hastings"},
          "network": {"latency": {"kind": "constant", "value": 0.005}},
          "data": {"kind": "synthetic", "samples": 30 * n, "features": 20, "partition": "iid"},
          "model": {"kind": "logistic"},
          "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05},
          "privacy": {"delta": 1e-5, "record": record},
          "evaluation": {"every": 1.0e6}}
    for key, value in changes.items():
        sc[key] = value if key == "algorithm" else {**sc.get(key, {}), **value}
    return sc


def same_records(got: dict, record: str) -> None:
    ev, win = got["events"], got["windowed"]
    assert win["engine"] == "windowed" and ev["engine"] == "events"
    assert win["files"] == ev["files"]
    assert ev["files"]["mixing.csv"] is not None
    assert (ev["files"]["payloads.npz"] is not None) == (record == "payloads")
    torch.testing.assert_close(win["W"], ev["W"], rtol=0, atol=0)


@pytest.mark.parametrize("changes", [
    # mix_into_params with a gradient step; lossy links: barriers time out and mix what arrived, later than the rest
    {"record": "mixing", "network": {"loss": 0.2}},
    # releases (Batch.privatize) and their steps mixed in; the delivered payloads and release values
    {"algorithm": {"name": "dp_dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "clip": 1.0,
                   "noise_multiplier": 1.0}, "network": {"loss": 0.2}},
    # Batch.mix, three barrier exchanges a round; an audit's gradient canaries in agent 2's releases
    {"algorithm": MUFF, "privacy": {"audit": {"victims": [2], "canaries": 6, "kind": "gradient"}}},
    # input canaries joined to the victims' gradients in the windowed driver's gradient block (per-example clipping)
    {"algorithm": {**MUFF, "clip_mode": "per_example", "gossip_steps": 1}, "network": {"loss": 0.2},
     "privacy": {"audit": {"victims": [0, 5], "canaries": 4, "kind": "input", "norm": 5.0}}},
    # local steps with their own releases, then Batch.mix in two gossip exchanges (DFedSAM with its DP option)
    {"algorithm": {"name": "dfedsam", "lr": 0.1, "batch": 8, "local_steps": 2, "gossip_steps": 2,
                   "round_timeout": 0.05, "noise_multiplier": 1.0, "clip": 1.0, "lr_decay": 0.9}},
])
def test_synchronous_windows_write_the_engines_privacy_records(tmp_path, changes):
    record = changes.pop("record", "payloads")
    same_records(run_both(tmp_path, private(record=record, **changes), records=RECORDS), record)


@st.composite
def private_rounds(draw) -> dict:
    """A scenario of synchronous rounds that keeps a privacy record: the algorithms that mix (a gradient step or not,
    releases or not, one barrier exchange or several), lossy links where one exchange a round, canaries or not."""
    n = draw(st.integers(4, 9))
    name = draw(st.sampled_from(["dpsgd", "dp_dpsgd", "muffliato"]))
    steps = draw(st.integers(1, 3)) if name == "muffliato" else 1
    algorithm = {"dpsgd": {"name": "dpsgd", "lr": 0.5, "batch": draw(st.integers(0, 6)), "round_timeout": 0.05},
                 "dp_dpsgd": {"name": "dp_dpsgd", "lr": 0.5, "batch": 6, "round_timeout": 0.05, "clip": 1.0,
                              "noise_multiplier": draw(st.sampled_from([0.0, 1.0]))},
                 "muffliato": {**MUFF, "gossip_steps": steps}}[name]
    record = draw(st.sampled_from(["mixing", "payloads"]))
    privacy = {"delta": 1e-5, "record": record}
    if record == "payloads" and draw(st.booleans()):
        privacy["audit"] = {"victims": [draw(st.integers(0, n - 1))], "canaries": 5,
                            "kind": draw(st.sampled_from(["gradient", "input"])), "norm": 4.0}
    topology = draw(st.sampled_from([{"kind": "ring", "mixing": "metropolis_hastings"},
                                     {"kind": "erdos_renyi", "p": 0.6, "mixing": "metropolis_hastings"}]))
    return private(n=n, rounds=draw(st.integers(1, 4)), record=record, algorithm=algorithm, privacy=privacy,
                   topology=topology, network={"loss": 0.0 if steps > 1 else draw(st.sampled_from([0.0, 0.25]))},
                   run={"seed": draw(st.integers(0, 30)), "trace_flush_every": draw(st.sampled_from([7, 1000]))})


@search(6, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=private_rounds())
def test_synchronous_windows_write_the_records_on_drawn_scenarios(tmp_path_factory, sc):
    same_records(run_both(tmp_path_factory.mktemp("drawn"), sc, records=RECORDS), sc["privacy"]["record"])


def test_netsim_privacy_reads_the_same_from_both_engines_folders(tmp_path):
    """--pairwise, --attack reconstruct and --audit on a windowed run's folder: the same lines and tables as on the
    events engine's."""
    from typer.testing import CliRunner

    from netsim.cli import app

    sc = private(n=6, rounds=2, algorithm={**MUFF, "gossip_steps": 2},
                 privacy={"audit": {"victims": [0], "canaries": 8, "kind": "gradient"}})
    got = run_both(tmp_path, sc, records=RECORDS)
    assert got["windowed"]["files"] == got["events"]["files"]
    said = {}
    for engine in ("events", "windowed"):
        folder = tmp_path / engine
        lines = []
        for args in (["--pairwise"], ["--attack", "reconstruct"], ["--audit"]):
            res = CliRunner().invoke(app, ["privacy", str(folder), *args])
            assert res.exit_code == 0, res.output
            lines.append(res.output.replace(str(folder), "RUN"))
        said[engine] = (lines, {f: (folder / f).read_bytes() for f in ("pairwise.csv", "attack.csv", "audit.csv")})
    assert said["windowed"] == said["events"]
    assert all(said["events"][1].values())  # each table has rows



@pytest.mark.parametrize(("record", "barriers"), [("mixing", False), ("mixing", True), ("payloads", False),
                                                 ("payloads", True)])
def test_a_privacy_record_is_kept_by_a_windowed_checkpoint_and_restored(tmp_path, record, barriers):
    """Muffliato's gossip steps with a privacy record (the mixing steps; or the delivered payloads and release values
    too, with an audit's gradient canaries) and checkpoints (synchronous windows, or barrier windows on jittery
    clocks), killed after the second and restored: the uninterrupted run's records, trace and metrics, which are the
    events engine's."""
    from netsim import api
    from netsim.sim import checkpoint
    from tests.test_checkpoint_windowed import killed_at

    sc = private(n=8, rounds=6, record=record, algorithm=MUFF, run={"checkpoint_every_rounds": 2})
    if record == "payloads":
        sc["privacy"]["audit"] = {"victims": [0], "canaries": 8, "kind": "gradient"}
    if barriers:  # (their checkpoints at a time mark, cut at the window it falls in)
        sc["agents"]["clock_jitter"] = {"kind": "uniform", "low": 0.0, "high": 0.01}
        sc["algorithm"] = {**MUFF, "round_timeout": 0.2}
        sc["run"] = {"seed": 5, "until": 3.0, "checkpoint_every": 0.5}  # (a work is 64 windows of 5 ms)
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    assert ("windows" in ref.summary) == barriers
    events = api.run(scenario_from_dict(sc), out=tmp_path / "events", engine="events", interruptible=False)
    files = ("mixing.csv", "payloads.npz")[:1 + (record == "payloads")]
    for name in files:
        assert (events.out / name).read_bytes() == (ref.out / name).read_bytes(), name
    out = killed_at(tmp_path, sc, 2)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    assert 0 < len(ck.arrays["mixing.agent"]) and ck.meta["state"]["windowed"]["mixing"]
    if record == "payloads":
        assert len(ck.arrays["payloads.d_value"]) and len(ck.arrays["payloads.r_value"])
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    for name in (*files, "trace.arrows", "metrics.csv"):
        assert (out / name).read_bytes() == (ref.out / name).read_bytes(), name
