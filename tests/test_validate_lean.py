"""``netsim validate`` without torch (netsim/validation.py) says what building the scenario says: the same verdict
and the same one-line error on every shipped scenario and on bad variants of them, the same spectral gap; and the
numpy-only topologies it uses are networkx's graphs and the sparse mixing matrices, bit for bit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tomllib

from netsim import api, validation
from netsim.errors import InputError
from netsim.scenario import load_scenario
from tests.conftest import ROOT, cli_env

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
SHIPPED = sorted(p for p in (ROOT / "scenarios").glob("*.toml")
                 if "scenario" not in tomllib.loads(p.read_text()))  # not the sweeps over them


def _verdict(fn) -> tuple[str, object]:
    try:
        return "ok", fn()
    except InputError as e:
        return "error", str(e)


def _both(sc, source: str, monkeypatch) -> tuple[tuple, tuple, bool]:
    """(validate's verdict, the build's verdict, whether validate built the scenario itself)."""
    built = []
    prepare = api.prepare

    def counted(*args, **kwargs):
        built.append(1)
        return prepare(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(api, "prepare", counted)
        checked = _verdict(lambda: validation.check(sc, source))
    return checked, _verdict(lambda: prepare(sc, source=source).gap), bool(built)


LEAN_SHIPPED = {"quickstart", "compare_sync_async", "compare_sync_async_event", "compare_sync_async_sparq",
                "dpsgd_scale", "privacy_event_triggered"}


@pytest.mark.parametrize("path", [p for p in SHIPPED if not (validation.why_built(load_scenario(p)) or "").startswith(
    "the data are read")], ids=lambda p: p.stem)
def test_every_shipped_scenario_without_data_files_validates_as_it_builds(path, monkeypatch):
    sc = load_scenario(path)
    checked, full, built = _both(sc, str(path), monkeypatch)
    assert checked == full and checked[0] == "ok"
    assert built == (path.stem not in LEAN_SHIPPED)


def test_a_scenario_reading_data_files_is_built():
    files = [p.stem for p in SHIPPED if (validation.why_built(load_scenario(p)) or "").startswith("the data")]
    assert "mnist_mlp" in files and "ldp_online_cheapest" in files and "quickstart" not in files


BAD = [  # quickstart with: (overrides, the key its one line names, whether validate checks it without building)
    ({"algorithm.lr": -0.5}, "algorithm.lr", True),
    ({"algorithm.round_timeout": 0.0}, "algorithm.round_timeout", True),
    ({"algorithm.batch": 2**21}, "algorithm.batch", True),
    ({"algorithm.lrr": 0.1}, "algorithm.lrr", True),
    ({"algorithm.momentum": 0.9}, "algorithm.momentum", True),
    ({"algorithm.name": "sgd-magic"}, "algorithm.name", True),
    ({"algorithm.name": "dpsgd", "algorithm.lr": "fast"}, "algorithm.lr", True),
    ({"model.kind": "cnn"}, "model.kind", True),
    ({"model.kind": "vgg11"}, "model.kind", True),
    ({"model.kind": "no_such_model"}, "model.kind", False),
    ({"topology.kind": "torus", "topology.rows": 5}, "topology.rows", True),
    ({"topology.kind": "grid", "topology.rows": 3}, "topology.rows", True),
    ({"topology.kind": "random_regular", "topology.degree": 3, "agents.count": 7}, "topology.degree", True),
    ({"topology.kind": "edges_file", "topology.path": "/nonexistent/edges.txt"}, "topology.path", True),
    ({"topology.kind": "erdos_renyi", "topology.p": 0.0}, "topology.p", True),
    ({"agents.count": 10**6, "topology.kind": "complete"}, "topology", True),
    ({"privacy.closed_form": "no_such_form"}, "privacy.closed_form", True),
    ({"data.partition": "shards", "data.shards": 1000}, "data.shards", True),
    ({"data.per_agent": 100000}, "data.per_agent", True),
    ({"data.test_fraction": 0.999}, "data.samples", True),
    ({"data.partition": "groups"}, "data.partition", True),
    ({"data.partition": "file", "data.partition_file": "/nonexistent/parts.csv"}, "data.partition_file", False),
    ({"agents.clock_offset": {"kind": "uniform", "low": 0.0, "high": 1e9}, "agents.activation.period": 1e-4},
     "agents.clock_offset", True),
    ({"agents.offline": [{"agent": 99, "start": 1.0, "end": 2.0}]}, "agents.offline[0].agent", True),
    ({"network.outages": [{"start": 1.0, "end": 2.0, "dst": 16}]}, "network.outages[0].dst", True),
    ({"network.links": [{"src": 3, "dst": 16, "loss": 0.5}]}, "network.links[0].dst", True),
    ({"network.outages": [{"start": 1.0, "end": 2.0, "dst": 16}], "agents.clock_offset":
      {"kind": "uniform", "low": 0.0, "high": 1e9}, "agents.activation.period": 1e-4}, "agents.clock_offset", True),
    ({"network.model": "no_such_model"}, "network.model", False),
    ({"agents.offline": [{"agent": 3, "start": 1.0, "end": 2.0}], "algorithm.lr": -1}, "algorithm.lr", True),
    ({"evaluation.metrics": ["suboptimality"], "model.kind": "mlp", "model.hidden": [4]}, "evaluation.metrics", False),
    ({"evaluation.metrics": ["tracking"], "model.kind": "mlp"}, "evaluation.metrics", False),
    ({"algorithm": {"name": "muffliato"}, "topology.directed": True, "topology.mixing": "column_stochastic"},
     "topology.directed", False),
    ({"algorithm": {"name": "do_adp"}, "agents.activation": {"kind": "poisson", "rate": 4.0}},
     "agents.activation.kind", False),
    # two errors: the one building meets first
    ({"algorithm.lr": -0.5, "topology.kind": "torus", "topology.rows": 5}, "algorithm.lr", True),
    ({"topology.kind": "torus", "topology.rows": 5, "model.kind": "cnn"}, "topology.rows", True),
    ({"model.kind": "cnn", "data.partition": "groups"}, "data.partition", True),
]


@pytest.mark.parametrize("overrides,key,unbuilt", BAD, ids=[",".join(o) for o, _, _ in BAD])
def test_a_bad_scenario_fails_validate_with_the_builds_own_line(overrides, key, unbuilt, monkeypatch):
    sc = load_scenario(QUICKSTART, overrides)  # what the file alone allows: the checks here are the build's
    checked, full, built = _both(sc, str(QUICKSTART), monkeypatch)
    assert checked == full and full[0] == "error", (checked, full)
    assert full[1].startswith(f"{QUICKSTART}: {key}") and "\n" not in full[1]
    assert built != unbuilt


def test_a_plugin_means_validate_builds(monkeypatch):
    built = []
    monkeypatch.setattr(api, "prepare", lambda *a, **k: built.append(1) or type("S", (), {"gap": 0.5}))
    assert validation.check(load_scenario(QUICKSTART), "q.toml", plugins=True) == 0.5 and built


def _imported(args: list[str]) -> str:
    code = ("import sys\nfrom netsim.cli import app\n"
            f"try:\n    app(args={args!r})\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "print('HEAVY', [m for m in ('torch', 'scipy', 'networkx', 'pyarrow', 'numpy.f2py', 'sklearn', "
            "'pandas', 'matplotlib', 'ray', 'textual', 'duckdb') if m in sys.modules], file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


@pytest.mark.parametrize("args", [["validate", "scenarios/quickstart.toml"],
                                  ["validate", "scenarios/compare_sync_async.toml"],
                                  ["validate", "scenarios/compare_sync_async_sparq.toml"],
                                  ["validate", "scenarios/privacy_event_triggered.toml"],
                                  ["validate", "--quick", "scenarios/quickstart.toml"]], ids=" ".join)
def test_validate_imports_no_torch_scipy_networkx_or_pyarrow(args):
    out = _imported(args)
    assert "HEAVY []" in out and out.startswith("ok: " if "--quick" not in args else "ok (quick: "), out


def test_validate_quick_says_what_it_did_not_check_and_that_data_files_are_absent(tmp_path, monkeypatch):
    """``--quick`` reads no data and builds no model: its ok says so, and data files that are not where the
    loader looks (found by their paths, not read) get the loader's own line as a warning; the full check
    refuses with that line."""
    from typer.testing import CliRunner

    from netsim.cli import app

    runner = CliRunner()
    mnist = str(ROOT / "scenarios" / "mnist_mlp.toml")
    line = "mnist_mlp: 16 agents, ring (metropolis_hastings, spectral gap 0.0507), algorithm dpsgd\n"
    monkeypatch.setenv("NETSIM_DATA", str(tmp_path))  # an empty data folder: no mnist/ in it
    quick = runner.invoke(app, ["validate", "--quick", mnist])
    full = runner.invoke(app, ["validate", mnist])
    assert full.exit_code == 2 and full.stderr.startswith("error: ")
    assert quick.exit_code == 0 and quick.stdout == ("ok (quick: data not read, model not built, algorithm "
                                                     "parameters not checked; data files absent): " + line)
    assert quick.stderr == (full.stderr.replace("error: ", "warning: ", 1).rstrip("\n")
                            + "; netsim validate without --quick, and netsim run, refuse it\n")
    assert f"data.path: data folder 'mnist' not found or under NETSIM_DATA={tmp_path}" in quick.stderr
    (tmp_path / "mnist").mkdir()  # there (not read: quick does not tell a good file from a bad one)
    quick = runner.invoke(app, ["validate", "--quick", mnist])
    assert quick.exit_code == 0 and quick.stderr == "" and quick.stdout == (
        "ok (quick: data not read, model not built, algorithm parameters not checked): " + line)
    # a file the loader reads, and a partition file: the same
    bad = load_scenario(QUICKSTART, {"data.kind": "libsvm", "data.path": str(tmp_path / "a9a")})
    assert str(validation.data_absent(bad)) == f"data.path: data file {str(tmp_path / 'a9a')!r} not found or under " \
                                               f"NETSIM_DATA={tmp_path}"
    part = load_scenario(QUICKSTART, {"data.partition": "file", "data.partition_file": "parts.csv"})
    assert validation.data_absent(part).key == "data.partition_file"
    assert validation.data_absent(load_scenario(QUICKSTART)) is None  # generated data


def test_validate_says_the_builds_gap():
    out = _imported(["validate", "scenarios/quickstart.toml"])
    assert out.splitlines()[0] == ("ok: quickstart: 16 agents, ring (metropolis_hastings, spectral gap 0.0507), "
                                   "algorithm dpsgd")


def test_builtin_modules_are_the_registrys():
    from netsim.algorithms.registry import BUILTIN_MODULES, REGISTRY, names, source_of

    builtin = [n for n in names() if source_of(REGISTRY[n][0]).__module__.startswith("netsim.algorithms.")]
    assert BUILTIN_MODULES == {n: source_of(REGISTRY[n][0]).__module__.rsplit(".", 1)[1] for n in builtin}


FIXED = [(k, d) for k in ("ring", "exponential", "torus", "grid", "complete", "star") for d in (False, True)]


@pytest.mark.parametrize("kind,directed", FIXED, ids=[f"{k}-{'directed' if d else 'undirected'}" for k, d in FIXED])
def test_fixed_topologies_are_networkx_graphs_and_their_matrices_bit_for_bit(kind, directed):
    from netsim.scenario.schema import TopologySpec
    from netsim.sim.graph_arrays import dense_gap, dense_mixing, fixed_edges
    from netsim.sim.topology import build_graph, mixing_matrix, spectral_gap

    mixings = ("column_stochastic", "uniform") if directed else ("metropolis_hastings", "uniform", "max_degree",
                                                                 "column_stochastic")
    seen = 0
    for n in range(1, 37):
        for rows in (None, 2, 3):
            spec = TopologySpec(kind=kind, directed=directed, rows=rows)
            try:
                g = build_graph(spec, n, 1)
            except InputError as e:  # fixed_edges refuses it alike, or leaves it to build_graph
                assert _verdict(lambda: fixed_edges(spec, n)) in (("error", str(e)), ("ok", None))  # noqa: B023
                continue
            edges = fixed_edges(spec, n)
            if edges is None:
                continue
            seen += 1
            assert set(zip(edges[0].tolist(), edges[1].tolist(), strict=True)) == set(g.edges)
            for mixing in mixings:
                W = mixing_matrix(g, mixing)
                D = dense_mixing(n, *edges, mixing)
                assert np.array_equal(W.toarray(), D) and spectral_gap(W) == dense_gap(D)
    assert seen > 20


def test_mixing_weights_of_irregular_graphs_are_the_sparse_ones_bit_for_bit():
    """Unequal degrees make each row's weights differ: the dense diagonal sums them in the sparse row's order."""
    from netsim.scenario.schema import TopologySpec
    from netsim.sim.graph_arrays import dense_gap, dense_mixing
    from netsim.sim.topology import build_graph, mixing_matrix, spectral_gap

    for seed in range(20):
        spec = TopologySpec(kind="erdos_renyi", p=0.2, directed=seed % 2 == 1)
        g = build_graph(spec, 30, seed)
        e = np.array(list(g.edges), dtype=np.int64)
        for mixing in (("uniform", "column_stochastic") if spec.directed else ("metropolis_hastings", "uniform")):
            W = mixing_matrix(g, mixing)
            D = dense_mixing(30, e[:, 0], e[:, 1], mixing)
            assert np.array_equal(W.toarray(), D) and spectral_gap(W) == dense_gap(D)


@pytest.mark.parametrize("extra", [{}, {"agents.offline": [{"agent": 3, "start": 1.0, "end": 2.0}]}],
                         ids=["checked", "built"])
def test_an_old_closed_form_name_is_noted_once(extra, capsys):
    from netsim.privacy import closed_forms as cf

    old = next(iter(cf.DEPRECATED))
    sc = load_scenario(QUICKSTART, {"privacy.closed_form": old, **extra})
    assert validation.check(sc, "q.toml") is not None
    assert capsys.readouterr().err.count(f"note: q.toml: privacy.closed_form = {old!r} is an old name") == 1


def test_what_checks_the_built_simulation_is_told_apart():
    """validate builds for an algorithm whose checks need the simulation (its own check, code run when a program
    is made), and checks the others without building."""
    from netsim.algorithms.registry import REGISTRY, checks_when_built, names

    names()
    built = {n for n in REGISTRY if checks_when_built(REGISTRY[n][0])}
    assert {"dp_dpsgd", "dfedsam", "muffliato", "pdsl", "ldp_online", "adpsgd", "do_adp"} <= built
    assert {"dpsgd", "choco", "sparq", "event_triggered", "push_gossip", "pushsum"}.isdisjoint(built)
