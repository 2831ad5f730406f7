"""Tabular data files (data.kind = "table"), natural partitions by group, explicit partition files, the
model and dataset registries' rules, and paths that follow the scenario file."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from netsim.api import prepare
from netsim.compute import data as cdata
from netsim.compute import models as cmodels
from netsim.compute.data import write_partition
from netsim.errors import InputError
from netsim.scenario import load_scenario, to_toml
from tests.conftest import BASE, ROOT, cli_env, merge, netsim_cli


def make_csv(path: Path, n_groups: int = 7, seed: int = 0) -> list[dict]:
    """A small sensor table: three features, a string label, a group column (devices of unequal sizes)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(n_groups):
        for _ in range(5 + 3 * g):
            x = rng.normal(size=3)
            rows.append({"t": round(float(x[0]), 5), "group": f"dev{g:02d}", "u": round(float(x[1]), 5),
                         "label": "walk" if x[0] + x[1] > 0 else "sit", "v": round(float(x[2]), 5)})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def write_scenario(folder: Path, **extra) -> Path:
    path = folder / "s.toml"
    path.write_text(tomli_w.dumps(merge(BASE, {"agents": {"count": 3}, **extra})))
    return path


def table_scenario(folder: Path, **data) -> Path:
    make_csv(folder / "train.csv")
    make_csv(folder / "test.csv", 2, seed=1)
    return write_scenario(folder, data={"kind": "table", "path": "train.csv", "test_path": "test.csv",
                                        "group": "group", "partition": "groups", **data})


def test_table_with_groups_gives_every_agent_exactly_its_groups_rows(tmp_path):
    rows = make_csv(tmp_path / "train.csv")
    make_csv(tmp_path / "test.csv", 2, seed=1)
    sc = load_scenario(table_scenario(tmp_path))
    ds = prepare(sc).data
    # features in file order without the label and group columns; labels sorted: sit -> 0, walk -> 1
    X = np.array([[r["t"], r["u"], r["v"]] for r in rows], dtype=np.float32)
    assert np.array_equal(ds.X, X) and ds.classes == 2
    assert np.array_equal(ds.y, [int(r["label"] == "walk") for r in rows])
    groups = np.array([r["group"] for r in rows])
    held = [set(groups[p]) for p in ds.parts]
    assert [len(h) for h in sorted(held, key=len)] == [2, 2, 3]  # 7 groups spread over 3 agents
    assert set().union(*held) == set(groups) and sum(map(len, held)) == 7  # every group, each once
    for part, mine in zip(ds.parts, held, strict=True):
        assert np.array_equal(part, np.flatnonzero(np.isin(groups, list(mine))))  # exactly its groups' rows
    # two groups each, the seventh dropped: nobody holds its rows
    ds = prepare(load_scenario(table_scenario(tmp_path, groups_per_agent=2, extra_groups="drop"))).data
    held = [set(groups[p]) for p in ds.parts]
    assert [len(h) for h in held] == [2, 2, 2] and len(set().union(*held)) == 6
    assert sum(map(len, ds.parts)) == len(rows) - int((groups == (set(groups) - set().union(*held)).pop()).sum())


@pytest.mark.parametrize(("data", "key", "message"), [
    ({"groups_per_agent": 3}, "data.groups_per_agent", "7 groups cannot give 3 agents 3 group(s) each"),
    ({"groups_per_agent": 2, "extra_groups": "error"}, "data.extra_groups", "7 groups for 3 agents x 2: 1 left"),
    ({"group": "nope"}, "data.group", "no column 'nope'; columns: 't', 'group', 'u', 'label', 'v'"),
    ({"columns": ["t", "label2"]}, "data.columns", "no column 'label2'"),
    ({"columns": ["t", "group"], "group": None}, "data.columns", "column 'group' is not numeric"),
    ({"group": None, "columns": ["t", "u"]}, "data.partition", "'groups' needs a group per row"),
])
def test_table_errors_are_one_line(tmp_path, data, key, message):
    path = table_scenario(tmp_path, **{k: v for k, v in data.items() if v is not None})
    if data.get("group", "") is None:
        text = path.read_text().replace('group = "group"\n', "")
        path.write_text(text)
    with pytest.raises(InputError) as e:
        prepare(load_scenario(path))
    assert e.value.key == key and message in e.value.message, str(e.value)


def test_parquet_and_npz_tables_read_like_the_csv(tmp_path):
    import pyarrow.parquet as pq
    from pyarrow import csv as pacsv

    csv_ds = prepare(load_scenario(table_scenario(tmp_path))).data
    table = pacsv.read_csv(tmp_path / "train.csv")
    pq.write_table(table, tmp_path / "train.parquet")
    cols = {c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names}
    np.savez(tmp_path / "train.npz", t=cols["t"], u=cols["u"], v=cols["v"], group=cols["group"].astype(str),
             label=cols["label"].astype(str))
    for name in ("train.parquet", "train.npz"):
        ds = prepare(load_scenario(write_scenario(tmp_path, data={
            "kind": "table", "path": name, "test_path": "test.csv", "group": "group", "partition": "groups",
            "columns": ["t", "u", "v"]}))).data
        assert np.array_equal(ds.X, csv_ds.X) and np.array_equal(ds.y, csv_ds.y)
        assert all(np.array_equal(a, b) for a, b in zip(ds.parts, csv_ds.parts, strict=True))
    # an NPZ holding an object (pickled) array is refused, never unpickled
    np.savez(tmp_path / "bad.npz", t=np.array([{"a": 1}], dtype=object), label=np.array([1]))
    with pytest.raises(InputError, match="no pickled arrays"):
        prepare(load_scenario(write_scenario(tmp_path, data={"kind": "table", "path": "bad.npz"})))


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_an_explicit_partition_file_round_trips_exactly(tmp_path, suffix):
    data = {"kind": "synthetic", "samples": 300, "features": 4, "partition": "dirichlet_classes", "alpha": 0.3}
    first = prepare(load_scenario(write_scenario(tmp_path, data=data)))
    write_partition(tmp_path / f"parts{suffix}", first.data.parts)
    again = prepare(load_scenario(write_scenario(tmp_path, data={
        **{k: v for k, v in data.items() if k != "alpha"}, "partition": "file", "partition_file": f"parts{suffix}"})))
    assert len(again.data.parts) == 3
    for a, b, agent in zip(first.data.parts, again.data.parts, again.agents, strict=True):
        assert np.array_equal(a, b) and np.array_equal(agent.rows, a)  # the agents hold exactly those rows
    assert np.array_equal(first.data.X, again.data.X)
    # a hand-written file (overlapping agents allowed) is read as listed
    (tmp_path / "hand.json").write_text(json.dumps([[5, 1, 2], [2, 3], [239]]))
    sc = load_scenario(write_scenario(tmp_path, data={**data, "partition": "file", "partition_file": "hand.json"}
                                      | {"alpha": 0.5}))
    assert [p.tolist() for p in prepare(sc).data.parts] == [[1, 2, 5], [2, 3], [239]]


@pytest.mark.parametrize(("content", "message"), [
    ([[1], [2]], "2 agents' rows listed; the scenario has 3 agents"),
    ([[1], [2], [240]], "agent 2's rows must be in [0, 239]"),
    ([[1, 1], [2], [3]], "agent 0 lists a row twice"),
    ([[1], [], [3]], "agent 1 has no rows"),
    ([[1.5], [2], [3]], "row indices must be integers"),
    ({"a": 1}, "expected a JSON list of lists"),
])
def test_bad_partition_files_are_one_line(tmp_path, content, message):
    (tmp_path / "p.json").write_text(json.dumps(content))
    path = write_scenario(tmp_path, data={"samples": 300, "partition": "file", "partition_file": "p.json"})
    with pytest.raises(InputError) as e:
        prepare(load_scenario(path))
    assert e.value.key == "data.partition_file" and e.value.message.startswith(f"{tmp_path / 'p.json'}: {message}")


def test_a_bad_partition_file_stops_validate_in_one_line(tmp_path):
    np.savez(tmp_path / "p.npz", agent_0=np.arange(3), agent_1=np.arange(2.0), agent_2=np.arange(1))
    path = write_scenario(tmp_path, data={"samples": 300, "partition": "file", "partition_file": "p.npz"})
    r = subprocess.run(netsim_cli("validate", str(path)), capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"data.partition_file: {tmp_path / 'p.npz'}: every agent_<i> must be a 1-D integer array" in r.stderr


def test_a_scenario_run_from_another_working_directory_finds_its_files(tmp_path, monkeypatch):
    folder, elsewhere = tmp_path / "study", tmp_path / "elsewhere"
    (folder / "graphs").mkdir(parents=True)
    elsewhere.mkdir()
    (folder / "graphs" / "edges.txt").write_text("0 1\n1 2\n2 0\n")
    make_csv(folder / "train.csv")
    path = write_scenario(folder, topology={"kind": "edges_file", "path": "graphs/edges.txt"},
                          data={"kind": "table", "path": "train.csv", "label": "label", "columns": ["t", "u"]},
                          run={"seed": 1, "until": 2.0})
    r = subprocess.run(netsim_cli("run", str(path), "--out", "run", "-q"), capture_output=True, text=True,
                       env=cli_env(), cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    stored = load_scenario(elsewhere / "run" / "scenario.toml")  # what was used, wherever it is read from
    assert stored.topology.path == str(folder / "graphs" / "edges.txt")
    assert stored.data.path == str(folder / "train.csv")
    assert to_toml(stored) == (elsewhere / "run" / "scenario.toml").read_text()  # stable when loaded again
    # a --set path follows the working directory it is typed in
    (elsewhere / "ring.txt").write_text("0 1\n1 2\n")
    monkeypatch.chdir(elsewhere)
    assert load_scenario(path, {"topology.path": "ring.txt"}).topology.path == str(elsewhere / "ring.txt")
    assert load_scenario(path, {"data.path": "train.csv"}).data.path == "train.csv"  # not here: the data folder's


def test_shipped_scenarios_name_their_files_beside_them(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # not the repository: the paths follow the files
    sc = load_scenario(ROOT / "scenarios" / "do_adp_cheapest.toml")
    assert Path(sc.topology.path) == ROOT / "scenarios" / "graphs" / "circulant20_3.txt"
    sc = load_scenario(ROOT / "scenarios" / "dpsgd_bursty.toml")
    assert Path(sc.network.trace) == ROOT / "traces" / "links_example.csv"
    assert Path(sc.agents.availability) == ROOT / "traces" / "availability_example.json"
    assert prepare(sc).network is not None


def test_model_and_dataset_registries_follow_the_one_rule(monkeypatch):
    import attrs
    import torch

    from netsim.compute import model_registry

    monkeypatch.setattr(model_registry, "MODELS", dict(model_registry.MODELS))
    monkeypatch.setattr(model_registry, "MODEL_PARAMS", dict(model_registry.MODEL_PARAMS))
    monkeypatch.setattr(cdata, "DATASETS", dict(cdata.DATASETS))
    monkeypatch.setattr(cdata, "DATASET_PARAMS", dict(cdata.DATASET_PARAMS))

    def tiny(args, data):
        return torch.nn.Linear(data.features, data.classes)

    cmodels.register_model("tiny_test", tiny)
    cmodels.register_model("tiny_test", tiny)  # the same object again: a no-op
    with pytest.raises(ValueError, match="model 'tiny_test' is already registered"):
        cmodels.register_model("tiny_test", lambda a, d: None)
    with pytest.raises(ValueError, match="model 'mlp' is already registered"):
        cmodels.register_model("mlp", tiny)

    @attrs.frozen
    class Shadow:
        l2: float = 0.0

    with pytest.raises(ValueError, match=r"reuse \[model\]'s own keys \['l2'\]"):
        cmodels.register_model("shadow_test", tiny, Shadow)
    with pytest.raises(ValueError, match="model 'tiny_test' is already registered with other params"):
        cmodels.register_model("tiny_test", tiny, attrs.make_class("P", {"width": attrs.field(default=1)},
                                                                 frozen=True))
    with pytest.raises(ValueError, match="dataset 'table' is already registered"):
        cdata.register_dataset("table", lambda a, s: None)
    # a factory's result: an nn.Module runs through TorchModel; a model object as it is; anything else refused
    sc = load_scenario_dict(model={"kind": "tiny_test"})
    sim = prepare(sc)
    assert isinstance(sim.model, cmodels.TorchModel) and sim.model.size == 5 * 2 + 2
    cmodels.register_model("convex_test", lambda a, d: cmodels.LogisticRegression(d.features, 0.0, False))
    assert prepare(load_scenario_dict(model={"kind": "convex_test"})).model.size == 5
    cmodels.register_model("broken_test", lambda a, d: 42)
    with pytest.raises(InputError, match="factory of model 'broken_test' returned int, neither a torch.nn.Module"):
        prepare(load_scenario_dict(model={"kind": "broken_test"}))
    with pytest.raises(InputError, match="only logistic, multinomial and mlp models can drop their biases"):
        prepare(load_scenario_dict(model={"kind": "tiny_test", "bias": False}))
    # a dataset loader may return a plain (X, y, groups) tuple
    cdata.register_dataset("blocks_test", lambda a, s: (np.eye(6, dtype=np.float32), np.arange(6) % 2,
                                                        np.array(list("aabbcc"))))
    ds = prepare(load_scenario_dict(data={"kind": "blocks_test", "partition": "groups", "test_fraction": 0.1})).data
    assert len(ds.y) == 5 and sorted(len(p) for p in ds.parts) == [1, 2, 2]


def load_scenario_dict(**extra):
    from netsim.scenario import scenario_from_dict

    return scenario_from_dict(merge(BASE, {"agents": {"count": 3}, **extra}))


def test_built_in_kinds_refuse_keys_of_their_own_when_read():
    from netsim.scenario import scenario_from_dict

    with pytest.raises(InputError, match="model.hiden: unknown key for kind = 'mlp'; allowed keys here: kind, hidden"):
        scenario_from_dict(merge(BASE, {"model": {"kind": "mlp", "hiden": [3]}}))
    with pytest.raises(InputError, match="data.sample: unknown key for kind = 'synthetic'"):
        scenario_from_dict(merge(BASE, {"data": {"sample": 3}}))
    with pytest.raises(InputError, match="model.kind: got 'not a name'; allowed: 'logistic'"):
        scenario_from_dict(merge(BASE, {"model": {"kind": "not a name"}}))
    # shipped scenarios keep their canonical text: no new key shows where it does not apply
    text = to_toml(load_scenario(ROOT / "scenarios" / "quickstart.toml"))
    for key in ("params", "groups_per_agent", "extra_groups", "partition_file", "label =", "columns"):
        assert key not in text


def test_a_sweep_files_paths_follow_the_sweep_file(tmp_path, monkeypatch):
    from netsim.sweep import load_sweep

    (tmp_path / "study" / "graphs").mkdir(parents=True)
    for name in ("a.txt", "b.txt"):
        (tmp_path / "study" / "graphs" / name).write_text("0 1\n1 2\n2 0\n")
    write_scenario(tmp_path / "study", topology={"kind": "edges_file", "path": "graphs/a.txt"})
    (tmp_path / "study" / "sweep.toml").write_text('scenario = "s.toml"\nseeds = [1]\n'
                                                   '[grid]\n"topology.path" = ["graphs/a.txt", "graphs/b.txt"]\n')
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(tmp_path / "study" / "sweep.toml")
    texts = [t.scenario_text for t in sweep.tasks]
    for text, name in zip(texts, ("a.txt", "b.txt"), strict=True):
        assert f'path = "{tmp_path / "study" / "graphs" / name}"' in text


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("ragged.csv", b"a,label\n1,2\n3\n", "cannot read the table: CSV parse error"),
    ("empty.csv", b"", "cannot read the table: Empty CSV file"),
    ("bytes.csv", b"\xff\xfe\x00a,b\n\x80\x81,2\n", "cannot read the table: 'utf-8' codec can't decode"),
    ("nan.csv", b"a,label\nnan,1\n2,0\n", "column 'a' has 1 empty or missing (NA, NaN) cells"),
    ("header.csv", b"a,label\n", "no rows"),
    ("x.txt", b"a,label\n1,2\n", "a table is .csv, .csv.gz, .parquet, .pq, .npz, not '.txt'"),
    ("bad.parquet", b"PAR1garbage", "cannot read the table: "),
    ("bad.npz", b"PK\x03\x04garbage", "not a readable NPZ file (no pickled arrays)"),
])
def test_bad_tables_are_one_line(tmp_path, name, raw, message):
    (tmp_path / name).write_bytes(raw)
    with pytest.raises(InputError) as e:
        prepare(load_scenario(write_scenario(tmp_path, data={"kind": "table", "path": name})))
    assert e.value.key == "data.path" and e.value.message.startswith(f"{tmp_path / name}: {message}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("name", "raw"), [("p.json", b"[" * 5000 + b"]" * 5000), ("p.json", b"\xff\xfe"),
                                           ("p.json", b"[[1], [2"), ("p.npz", b"PK\x03\x04garbage")])
def test_unreadable_partition_files_are_one_line(tmp_path, name, raw):
    (tmp_path / name).write_bytes(raw)
    with pytest.raises(InputError) as e:
        prepare(load_scenario(write_scenario(tmp_path, data={"samples": 300, "partition": "file",
                                                             "partition_file": name})))
    assert e.value.key == "data.partition_file" and e.value.message.startswith(f"{tmp_path / name}: cannot read: ")
    assert "\n" not in str(e.value)
