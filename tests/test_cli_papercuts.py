"""The CLI reads as a new user expects: algorithms in one line each and in full on demand, unknown keys with
the likely intended one, a clean reference, sweep labels that cannot be mistaken for outputs, and the
quick commands answering without torch."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from netsim.cli import app
from netsim.errors import InputError
from tests.conftest import BASE, ROOT, cli_env, merge

runner = CliRunner()


def test_every_builtin_algorithm_has_a_distinct_one_line_summary():
    from netsim.algorithm_reference import SUMMARIES
    from netsim.algorithms import REGISTRY, names

    builtin = {n for n in names() if REGISTRY[n][0].__module__.startswith("netsim.algorithms.")}  # not tests'
    assert set(SUMMARIES) == builtin, "add the new algorithm's line to netsim/algorithm_reference.py"
    assert len(set(SUMMARIES.values())) == len(SUMMARIES)
    assert all("\n" not in s and 20 < len(s) <= 120 for s in SUMMARIES.values())


def test_algorithms_lists_one_line_per_algorithm_not_parameter_walls():
    from netsim.algorithm_reference import SUMMARIES

    res = runner.invoke(app, ["algorithms"])  # not a terminal: one line each
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert len(lines) == len(SUMMARIES) + 1 and lines[-1].startswith("(netsim algorithms NAME")
    for name, line in zip(sorted(SUMMARIES), lines, strict=False):
        assert line.split()[0] == name and line.endswith(SUMMARIES[name]) and "=0." not in line
    adp2 = next(x for x in lines if x.startswith("adp2_sgd"))
    dp2 = next(x for x in lines if x.startswith("dp2_sgd"))
    assert "AD-PSGD" in adp2 and "AD-PSGD" not in dp2  # once indistinguishable parameter lists


def test_algorithms_wraps_summaries_under_themselves_on_a_narrow_terminal():
    from netsim.algorithm_reference import SUMMARIES, listing

    text = listing(SUMMARIES, columns=80)
    assert max(map(len, text.splitlines())) <= 80
    head, cont = (ln for ln in text.splitlines()[:2])
    assert head.startswith("adp2_sgd  ") and cont.startswith(" " * (len("event_triggered") + 2)) and cont.strip()


def test_a_plugin_algorithm_is_listed_with_its_docstring(tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text(textwrap.dedent('''
        import attrs
        from netsim.algorithms.registry import register

        @attrs.frozen
        class P:
            lr: float = 0.1

        @register("mine_papercut", P)
        def mine(agent, params):
            """My own method: average with everyone, then step.

            More text."""
            yield agent.wake()
    '''))
    res = runner.invoke(app, ["algorithms", "--plugin", str(plugin)])
    assert res.exit_code == 0, res.output
    assert any(x.startswith("mine_papercut") and x.endswith("My own method: average with everyone, then step.")
               for x in res.output.splitlines())


@pytest.mark.parametrize("name", ["dp_dpsgd", "privsgp_vr", "ldp_online", "dfedsam", "do_adp"])
def test_describe_prints_the_whole_documentation(name):
    from netsim.algorithms import REGISTRY
    from netsim.algorithms.registry import source_of

    res = runner.invoke(app, ["algorithms", name])
    assert res.exit_code == 0
    fn = source_of(REGISTRY[name][0])  # the kernel class or the coroutine function
    for doc in (fn.__doc__ and inspect.cleandoc(fn.__doc__), inspect.getdoc(inspect.getmodule(fn))):
        if doc:
            assert doc.strip() in res.output  # every paragraph, not the first two
    if name == "dp_dpsgd":  # the sensitivities a DP researcher needs, once cut after "Two clippings"
        assert "L2 sensitivity C / B" in res.output and "sensitivity 2C" in res.output


JARGON = ("kernel", "pattern", "program", "lock", "``", "rounds/", "bank", "returns", "calibrates", "service")


def test_describe_says_what_the_method_is_before_how_it_is_run():
    """``netsim algorithms gossip`` once opened with "as a kernel of the pairwise pattern without the lock":
    for every built-in, the first paragraph under the summary is the method (its paper, its idea), the
    implementer's notes come after."""
    from netsim.algorithm_reference import describe
    from netsim.algorithms import REGISTRY, names
    from netsim.algorithms.registry import source_of

    builtin = [n for n in names() if REGISTRY[n][0].__module__.startswith("netsim.algorithms.")]  # not tests'
    assert len(builtin) > 10
    for name in builtin:
        text = describe(name, source_of(REGISTRY[name][0]), REGISTRY[name][1])
        first = text.split("\n\n")[1]
        assert not [w for w in JARGON if w in first.lower()], (name, first)
    res = runner.invoke(app, ["algorithms", "gossip"])
    lines = res.output.splitlines()
    assert lines[2] == "Asynchronous randomized pairwise gossip averaging with local SGD."
    assert res.output.index("Boyd et al.") < res.output.index("pairwise pattern without the lock")


def test_a_plugins_docstring_first_line_prints_once(tmp_path):
    """The summary of a plugin's algorithm is its docstring's first paragraph: printed as the head line, not
    again under it (the tutorial's my_algorithm.py)."""
    plugin = tmp_path / "my_algorithm.py"
    plugin.write_text(textwrap.dedent('''
        """Local SGD with neighbour averaging (a plugin).

        Each activation: x_i <- mix(x_i, received) - lr * grad F_i(x_i)."""
        import attrs
        from netsim.algorithms import register

        @attrs.frozen
        class P:
            lr: float = 0.1

        @register("my_sgd_once", P)
        def my_sgd(agent, p):
            yield agent.wake()
    '''))
    res = runner.invoke(app, ["algorithms", "my_sgd_once", "--plugin", str(plugin)])
    assert res.exit_code == 0, res.output
    assert res.output.count("Local SGD with neighbour averaging") == 1
    assert res.output.startswith("my_sgd_once: Local SGD with neighbour averaging (a plugin).\n\nEach activation")


@pytest.mark.parametrize("key, says", [
    ("network.los", "network.los: unknown key; did you mean 'loss'? allowed keys here: latency"),
    ("netwrk.loss", "netwrk: unknown key; did you mean 'network'?"),
    ("run.loss", "run.loss: unknown key; did you mean network.loss or network.links[].loss?"),
    ("agents.period", "agents.period: unknown key; did you mean agents.activation.period"),
    ("run.zzz", "run.zzz: unknown key; allowed keys here: seed, until"),
])
def test_an_unknown_key_suggests_the_likely_one(key, says):
    from netsim.scenario import load_scenario

    path = ROOT / "scenarios" / "quickstart.toml"
    with pytest.raises(InputError) as e:
        load_scenario(path, {key: 1.0})
    assert says in str(e.value) and str(e.value).startswith(f"{path}: ")
    res = runner.invoke(app, ["validate", str(path), "--set", f"{key}=1.0"])
    assert res.exit_code == 2 and says in res.stderr and res.stderr.count("\n") == 1


def test_an_unknown_algorithm_parameter_suggests_the_likely_one():
    from netsim.algorithms import resolve
    from netsim.scenario import scenario_from_dict

    sc = scenario_from_dict(merge(BASE, {"algorithm": {"name": "dpsgd", "lrr": 0.1}}))
    with pytest.raises(InputError, match=r"algorithm.lrr: unknown key; did you mean 'lr'\?"):
        resolve(sc.algorithm)


def test_the_reference_never_shows_a_probe_value():
    """A range check's message for a probe (``got -1e+300``) is not what a key allows: data.partition once
    listed its values eight times, once per probe."""
    from netsim.scenario.reference import sections

    keys = {r["key"]: r for rows in sections().values() for r in rows}
    assert keys["data.partition"]["allowed"] == ("'iid', 'dirichlet_equal', 'dirichlet_classes', 'shards', "
                                                 "'quantity', 'label', 'label_share', 'classes', 'alternate', "
                                                 "'groups', 'file'")
    assert not [k for k, r in keys.items() if "got" in r["allowed"].split()]
    res = runner.invoke(app, ["keys", "data"])
    assert res.exit_code == 0 and "got -1" not in res.output


def test_sweep_labels_name_a_key_that_reads_as_an_output_in_full():
    from netsim.sweep import short_names

    assert short_names(["algorithm.lr", "network.loss", "evaluation.every"]) == {
        "algorithm.lr": "lr", "network.loss": "network.loss", "evaluation.every": "every"}
    assert short_names(["agents.compute_time.mean", "network.latency.mean"]) == {
        "agents.compute_time.mean": "agents.compute_time.mean", "network.latency.mean": "network.latency.mean"}
    assert short_names(["network.burst.loss_bad"]) == {"network.burst.loss_bad": "loss_bad"}


def test_a_sweep_over_network_loss_is_labelled_unmistakably(tmp_path):
    from netsim.sweep import load_sweep

    (tmp_path / "s.toml").write_text(f'scenario = "{ROOT / "scenarios" / "quickstart.toml"}"\n'
                                     '[grid]\n"network.loss" = [0.0, 0.2]\n"algorithm.lr" = [0.1]\n')
    sw = load_sweep(tmp_path / "s.toml")
    assert [t.label for t in sw.tasks] == ["c000_network.loss=0.0_lr=0.1", "c001_network.loss=0.2_lr=0.1"]


QUICK = [["--help"], ["keys"], ["keys", "data"], ["algorithms"], ["models"], ["models", "mlp"], ["datasets"],
         ["datasets", "table"], ["algorithms", "gossip"], ["algorithms", "dp_dpsgd"], ["algorithms", "pdsl"]]


@pytest.mark.parametrize("args", QUICK, ids=" ".join)
def test_quick_commands_do_not_import_torch(args):
    """Listing and reference commands answer without torch (~2 s to import): checked in a fresh
    interpreter, where nothing else could have imported it."""
    code = ("import sys\nfrom netsim.cli import app\n"
            f"try:\n    app(args={args!r})\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "heavy = [m for m in ('torch', 'sklearn', 'matplotlib', 'pandas', 'pyarrow', 'ray', 'textual', "
            "'duckdb', 'dp_accounting', 'scipy') if m in sys.modules]\n"
            "print('HEAVY', heavy, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "HEAVY []" in p.stderr, p.stderr


LEAN = ("torch", "sklearn", "matplotlib", "pandas", "ray", "textual", "duckdb", "dp_accounting")


def test_validate_quick_imports_no_torch_and_says_what_validate_says():
    """``validate --quick`` answers in a fresh interpreter without torch, with the full check's own line."""
    code = ("import sys\nfrom netsim.cli import app\n"
            "try:\n    app(args=['validate', '--quick', 'scenarios/quickstart.toml'])\n"
            "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            f"print('HEAVY', [m for m in {LEAN!r} if m in sys.modules], file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "HEAVY []" in p.stderr, p.stderr
    full = runner.invoke(app, ["validate", str(ROOT / "scenarios" / "quickstart.toml")])
    line = "quickstart: 16 agents, ring (metropolis_hastings, spectral gap 0.0507), algorithm dpsgd\n"
    assert full.exit_code == 0 and full.stdout == f"ok: {line}"
    assert p.stdout == ("ok (quick: data not read, model not built, algorithm parameters not checked): " + line)


@pytest.mark.parametrize("extra,key", [
    ({"topology": {"kind": "edges_file", "path": "/nonexistent/edges.txt"}}, "topology.path"),
    ({"topology": {"kind": "random_regular", "degree": 3}, "agents": {"count": 7}}, "topology.degree"),
    ({"topology": {"directed": True, "mixing": "metropolis_hastings"}}, "topology.mixing"),
    ({"algorithm": {"name": "sgd-magic"}}, "algorithm.name"),
    ({"agents": {"count": 10**6}, "topology": {"kind": "complete"}}, "topology"),
    ({"privacy": {"closed_form": "no_such_form"}}, "privacy.closed_form"),
    ({"data": {"kind": "libsvm", "path": "nope.libsvm"}}, None),
    ({"algorithm": {"name": "dpsgd", "momentum": 0.9}}, None),
])
def test_validate_quick_refuses_with_the_full_checks_line_or_leaves_it_to_them(tmp_path, monkeypatch, extra, key):
    """What ``--quick`` checks fails with the very line the full check gives; the data and the algorithm's
    parameters (key None here) are the full check's only. (The machine's free memory, which the footprint line
    quotes, is held fixed: it moves between two calls while other tests run.)"""
    import tomli_w

    from netsim.sim import footprint

    monkeypatch.setattr(footprint, "available", lambda: 16 << 30)

    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(merge(BASE, extra)))
    full = runner.invoke(app, ["validate", str(path)])
    quick = runner.invoke(app, ["validate", "--quick", str(path)])
    assert full.exit_code == 2 and full.stderr.count("\n") == 1, full.output
    if key is None:
        assert quick.exit_code == 0 and quick.stdout.startswith("ok (quick: "), quick.output
    else:
        assert quick.exit_code == 2 and quick.stderr == full.stderr and f"{path}: {key}" in quick.stderr


def test_run_explore_ends_with_the_runs_summary_table(tmp_path, monkeypatch, capsys):
    """The child run is quiet (the explorer owns the terminal); its table comes back when it ends."""
    from netsim import cli

    class NoExplorer:  # what the app is given is tested in test_explore.py; here, what is printed after it
        def __init__(self, *args):
            pass

        def run(self):
            pass

    monkeypatch.setattr("netsim.explore.app.Explorer", NoExplorer)
    folder = tmp_path / "live"
    rc = cli._run_explored(ROOT / "scenarios" / "quickstart.toml", ["run.until=3"], folder, [], False)
    out = capsys.readouterr().out
    assert rc == 0
    assert "quickstart · dpsgd · 16 agents" in out and "messages sent" in out and "stopped by" in out
    assert out.index("wrote ") < out.index("messages sent")


def _header_columns(text: str, sep: str = "┃") -> list[str]:
    """The column headers of a printed table, each header's lines joined (rich folds a header downwards)."""
    lines = text.splitlines()
    head = lines[:next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("━"))]
    parts = [[p.strip() for p in ln.split(sep)] for ln in head]
    return ["".join(p[i] for p in parts) for i in range(len(parts[0]))]


def test_a_piped_query_table_keeps_every_header_whole_at_80_columns(monkeypatch, capsys):
    """Piped (not a terminal: 80 columns), rich once cut agent_accuracy_mean and agent_accuracy_min both to
    ``agent_acc…``: a header folds at its own word breaks instead, and no number is cut."""
    import pyarrow as pa

    from netsim.cli import _print_result

    monkeypatch.setenv("COLUMNS", "80")
    cols = ["time", "round_mean", "loss", "accuracy", "agent_accuracy_mean", "agent_accuracy_min", "consensus"]
    _print_result(pa.table({c: [0.0, 2.0, 0.123456] for c in cols}), 100)
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    assert _header_columns(out) == cols
    assert out.count("0.123456") == len(cols)
    _print_result(pa.table({"kind": ["send"], "n": [3]}), 100)  # a table that fits is left as it is
    assert capsys.readouterr().out.splitlines()[0].split() == ["kind", "┃", "n"]


def test_the_sweep_table_shows_every_swept_key_whole_at_80_columns():
    """Three keys under [algorithm] once read ``algorith…`` three times, hiding which was epsilon."""
    import pyarrow as pa
    from rich.console import Console

    from netsim.cli import _sweep_table
    from netsim.table_fit import print_fitted

    swept = ["algorithm.name", "algorithm.epsilon", "algorithm.calibration"]
    table = pa.table({"algorithm.name": ["dp_dpsgd", "pdsl"], "algorithm.epsilon": [0.1, 3.0],
                      "algorithm.calibration": ["null", "per_message_gaussian"], "seeds": [3, 3],
                      **{f"{k}_{s}": [0.80712, 0.93] for k in ("accuracy", "loss", "messages_dropped")
                         for s in ("mean", "std")}})
    t = _sweep_table("privacy_utility_sweep", swept, "accuracy", table)
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115 - closed by the GC
    print_fitted(t, console)
    out = console.export_text()
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    heads = [str(c.header) for c in t.columns]
    assert [h.replace("\n", "") for h in heads[:3]] == swept  # whole, folded after the dot
    for h in heads[:3]:
        assert all(part in out for part in h.split("\n"))
    assert "per_message_gaussian" in out and "0.1" in out and "3.0" in out and "0.8071" in out


def test_fold_breaks_only_at_word_breaks():
    from netsim.table_fit import fold

    assert fold("agent_accuracy_mean", 8) == "agent_\naccuracy_\nmean"
    assert fold("algorithm.epsilon", 10) == "algorithm.\nepsilon"
    assert fold("final messages dropped", 14) == "final messages\ndropped"
    assert fold("consensus", 3) == "consensus"


def test_datasets_and_models_list_a_summary_each():
    """``netsim datasets`` once listed bare names: each now with its one-line summary and own keys."""
    from netsim.scenario.schema import DATASETS, MODELS

    for what, builtin in (("datasets", DATASETS), ("models", MODELS)):
        res = runner.invoke(app, [what])
        assert res.exit_code == 0
        lines = {ln.split()[0]: ln for ln in res.output.splitlines()[:-1]}
        assert set(builtin) <= set(lines)
        summaries = [lines[n].split(None, 1)[1] for n in builtin]
        assert all(len(s) > 30 for s in summaries) and len(set(summaries)) == len(summaries), summaries
    res = runner.invoke(app, ["datasets"])
    assert "(own keys: columns, label, group, test_fraction)" in res.output


def test_a_builtin_dataset_lists_the_keys_only_it_takes():
    """``netsim datasets table`` once said "no keys of its own": label, group and columns are exactly its own."""
    res = runner.invoke(app, ["datasets", "table"])
    assert res.exit_code == 0 and "no keys of its own" not in res.output
    for key in ("data.columns  (list of string (optional), default none)", "data.label  (string, default 'label')",
                "data.group  (string (optional), default none)"):
        assert key in res.output
    assert "data.samples" not in res.output  # synthetic's
    res = runner.invoke(app, ["models", "mlp"])
    assert "model.hidden  (list of integer, default [64])" in res.output and "model.batch_invariant" not in res.output
    assert "no keys of its own" in runner.invoke(app, ["models", "multinomial"]).output


@pytest.mark.parametrize("args, says", [
    (["validate", "scenarios/quickstart.toml", "--set", 'algorithm.name="dpsdg"'],
     "algorithm.name: unknown algorithm 'dpsdg'; did you mean 'dpsgd'? registered: adp2_sgd, "),
    (["algorithms", "dpsdg"], "algorithms: unknown algorithm 'dpsdg'; did you mean 'dpsgd'? registered: "),
    (["models", "mpl"], "models: unknown model 'mpl'; did you mean 'mlp'? registered: cnn, "),
    (["validate", "scenarios/quickstart.toml", "--set", 'model.kind="residual_mlp"'],
     "model.kind: unknown model 'residual_mlp'; registered: cnn, logistic, mlp, multinomial, resnet18, vgg11; "
     "a plugin's model needs --plugin FILE"),
    (["validate", "scenarios/quickstart.toml", "--set", 'data.kind="stations"'],
     "data.kind: unknown dataset 'stations'; registered: cifar10, libsvm, mnist, synthetic, table; a plugin's "
     "dataset needs --plugin FILE"),
])
def test_an_unknown_name_suggests_the_likely_one_and_the_plugin(monkeypatch, args, says):
    monkeypatch.chdir(ROOT)
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and says in res.stderr, res.output
    assert res.stderr.rstrip().endswith("needs --plugin FILE")


def test_an_unknown_engine_is_refused_before_anything_is_read():
    """``--engine turbo`` once took 2.9 s to refuse (torch, the data, the build): now the first check, in a fresh
    interpreter that imports nothing heavy for it, with the likely intended engine."""
    code = ("import sys\nfrom netsim.cli import app\n"
            "try:\n    app(args=['run', 'scenarios/quickstart.toml', '--engine', 'windowd', '--out', 'nowhere'])\n"
            "except SystemExit as e:\n    print('EXIT', e.code, file=sys.stderr)\n"
            f"print('HEAVY', [m for m in {LEAN!r} if m in sys.modules], file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT)
    assert "EXIT 2" in p.stderr and "HEAVY []" in p.stderr, p.stderr
    assert "error: --engine: unknown engine 'windowd'; did you mean 'windowed'? one of: events, windowed, auto" \
        in p.stderr and not (ROOT / "nowhere").exists()


def test_a_sweep_given_a_scenario_file_says_so(tmp_path):
    res = runner.invoke(app, ["sweep", str(ROOT / "scenarios" / "quickstart.toml"), "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert "quickstart.toml: a scenario file, not a sweep file" in res.stderr and "netsim run " in res.stderr
    assert not (tmp_path / "s").exists()
