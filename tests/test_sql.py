"""SQL over a run folder (netsim/metrics/sql.py, `netsim query`): every recipe of docs/traces.md runs on a
small run with losses, bursts, an outage, churn, timeouts and DP releases, and its numbers equal a pandas
recomputation from the raw trace and metrics files."""

from __future__ import annotations

import io
import math
import re
import subprocess

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from netsim.errors import InputError
from netsim.metrics.sql import TABLES, connect, query
from netsim.trace.folder import END_FILES
from netsim.trace.io import read_trace
from tests.conftest import BASE, ROOT, cli_env, merge, netsim_cli

DELTA = 1e-5


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from netsim.api import run
    from netsim.scenario import scenario_from_dict

    folder = tmp_path_factory.mktemp("sql") / "run"
    sc = merge(BASE, {
        "run": {"seed": 5, "until": 120.0, "trace_flush_every": 512},
        "agents": {"count": 4, "compute_time": {"kind": "lognormal", "mean": 0.05, "sigma": 0.3},
                   "activation": {"kind": "periodic", "period": 1.0},
                   "churn": {"mean_online": 40.0, "mean_offline": 5.0}},
        "network": {"latency": {"kind": "lognormal", "mean": 0.03, "sigma": 0.5}, "loss": 0.05,
                    "burst": {"p_enter": 0.03, "p_exit": 0.3}, "outages": [{"start": 60.0, "end": 70.0, "src": 0}]},
        "algorithm": {"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "clip": 1.0, "sigma": 1.0, "round_timeout": 0.2},
        "evaluation": {"every": 10.0, "metrics": ["loss", "accuracy", "consensus", "agent_accuracy"]},
    })
    run(scenario_from_dict(sc), out=folder, interruptible=False)
    return folder


def recipes() -> dict[str, str]:
    """The SQL blocks of docs/traces.md's SQL section, by their first-line comment."""
    text = (ROOT / "docs" / "traces.md").read_text()
    section = text.split("## Asking the trace in SQL", 1)[1].split("\n## ", 1)[0]
    out = {}
    for block in re.findall(r"```sql\n(.*?)```", section, re.S):
        name, sql = block.split("\n", 1)
        assert name.startswith("-- "), block
        out[name[3:].strip()] = sql
    return out


# ---- pandas recomputations, from the raw trace and files only ----

def frames(folder):
    tr = read_trace(folder).to_pandas()
    metrics = pd.read_csv(folder / "metrics.csv")
    agents = pd.read_csv(folder / "agent_metrics.csv")
    return tr, metrics, agents


def message_table(tr):
    s = tr[tr.kind == "send"][["msg", "agent", "peer", "round", "size", "t"]].rename(
        columns={"agent": "src", "peer": "dst", "t": "t_send"})
    d = tr[tr.kind == "deliver"][["msg", "t"]].rename(columns={"t": "t_deliver"})
    x = tr[tr.kind == "drop"][["msg", "tag"]].rename(columns={"tag": "reason"})
    m = s.merge(d, on="msg", how="left").merge(x, on="msg", how="left")
    m["stale"] = m.msg.isin(tr[tr.kind == "stale"].msg)
    m["latency"] = m.t_deliver - m.t_send
    return m


def release_table(tr):
    r = tr[tr.kind == "release"].copy()
    r["mechanism"] = r.tag.str.split(" ").str[0]
    r["s"] = r.tag.str.extract(r"s=(\S+)")[0].astype(float)
    r["rho"] = r.s ** 2 / (2 * r.value ** 2)
    return r[r.mechanism == "gaussian"]


def zcdp(rho):
    return rho + 2 * np.sqrt(rho * math.log(1 / DELTA))


def p_events_by_kind(tr, metrics, agents):
    c = tr.kind.value_counts().rename("events").reset_index()
    return c.sort_values(["events", "kind"], ascending=[False, True])


def p_latency_per_link(tr, metrics, agents):
    m = message_table(tr).dropna(subset=["t_deliver"])
    return m.groupby(["src", "dst"]).latency.agg(["count", "mean", "max"]).reset_index()


def p_latency_last_100s(tr, metrics, agents):
    m = message_table(tr).dropna(subset=["t_deliver"])
    m = m[m.t_deliver >= tr.t.max() - 100]
    return m.groupby(["src", "dst"]).latency.mean().reset_index()


def p_drops_by_cause(tr, metrics, agents):
    d = tr[tr.kind == "drop"].groupby("tag").agg(drops=("msg", "count"), bytes=("size", "sum")).reset_index()
    return d.sort_values(["drops", "tag"], ascending=[False, True])


def p_drop_rate(tr, metrics, agents):
    m = message_table(tr)
    m["dropped"] = m.reason.notna().astype(float)
    g = m.groupby(["src", "dst"]).agg(sent=("msg", "count"), drop_rate=("dropped", "mean")).reset_index()
    return g.sort_values(["drop_rate", "src", "dst"], ascending=[False, True, True])


def p_bytes_per_agent(tr, metrics, agents):
    s = tr[tr.kind == "send"].copy()
    s["w"] = np.floor(s.t / 10) * 10
    return s.groupby(["agent", "w"]).agg(bytes=("size", "sum"), messages=("msg", "count")).reset_index()


def p_timeouts_why(tr, metrics, agents):
    m = message_table(tr)
    rows = []
    for o in tr[tr.kind == "timeout"].sort_values(["t", "agent"]).itertuples():
        c = m[(m.dst == o.agent) & (m["round"] == o.round) & ~(m.t_deliver <= o.t)].sort_values("src")
        parts = [f"{r.src}: " + (f"dropped ({r.reason})" if isinstance(r.reason, str) else
                                 "late" if not math.isnan(r.t_deliver) else "in flight") for r in c.itertuples()]
        rows.append((o.t, o.agent, o.round, o.value, ", ".join(parts) if parts else None))
    return pd.DataFrame(rows)


def p_stale_per_link(tr, metrics, agents):
    m = message_table(tr)
    g = m[m.stale].groupby(["src", "dst"]).agg(stale=("msg", "count"), lat=("latency", "mean")).reset_index()
    return g.sort_values(["stale", "src", "dst"], ascending=[False, True, True])


def p_epsilon_per_window(tr, metrics, agents):
    r = release_table(tr)
    r["w"] = np.floor(r.t / 30) * 30
    g = r.groupby(["agent", "w"]).agg(releases=("rho", "size"), rho=("rho", "sum")).reset_index()
    g["eps"] = zcdp(g.rho)
    return g.drop(columns="rho")


def p_epsilon_at_evaluations(tr, metrics, agents):
    r = release_table(tr)
    rows = []
    for time in metrics.time:
        for a, g in r[r.t <= time].groupby("agent"):
            rows.append((time, a, len(g), zcdp(g.rho.sum())))
    return pd.DataFrame(rows)


def p_worst_agent(tr, metrics, agents):
    rows = []
    for time, g in agents.groupby("time"):
        w = g.sort_values(["accuracy", "agent"]).iloc[0]
        rows.append((time, w.agent, g.accuracy.min(), g.accuracy.mean()))
    return pd.DataFrame(rows)


def p_accuracy_messages(tr, metrics, agents):
    sends = np.sort(tr[tr.kind == "send"].t.to_numpy())
    return pd.DataFrame({"time": metrics.time, "accuracy": metrics.accuracy,
                         "messages": np.searchsorted(sends, metrics.time, side="right")})


def p_offline(tr, metrics, agents):
    return tr[tr.kind == "offline"].groupby("agent").value.agg(["count", "sum"]).reset_index()


def p_activation_gaps(tr, metrics, agents):
    a = tr[tr.kind == "activate"].sort_values("t")
    gaps = a.groupby("agent").t.diff()
    return a.assign(gap=gaps).dropna(subset=["gap"]).groupby("agent").gap.agg(["mean", "max"]).reset_index()


PANDAS = {
    "events by kind": p_events_by_kind,
    "latency per link": p_latency_per_link,
    "mean delivery latency per link in the last 100 s": p_latency_last_100s,
    "drops by cause": p_drops_by_cause,
    "drop rate per link": p_drop_rate,
    "bytes sent per agent over time": p_bytes_per_agent,
    "rounds that timed out and why": p_timeouts_why,
    "stale messages per link": p_stale_per_link,
    "epsilon per agent per window": p_epsilon_per_window,
    "epsilon so far per agent at each evaluation": p_epsilon_at_evaluations,
    "worst agent at each evaluation": p_worst_agent,
    "accuracy against messages sent": p_accuracy_messages,
    "offline time per agent": p_offline,
    "time between activations": p_activation_gaps,
}


def same(result: pa.Table, expected: pd.DataFrame) -> None:
    """Row by row, column by column (by position): numbers to 1e-9 relative, the rest exactly."""
    got = result.to_pandas()
    assert got.shape == expected.shape, (got.shape, expected.shape)
    for j in range(got.shape[1]):
        a, b = got.iloc[:, j].tolist(), expected.iloc[:, j].tolist()
        for x, y in zip(a, b, strict=True):
            if missing(x) or missing(y):
                assert missing(x) and missing(y), (got.columns[j], x, y)
            elif isinstance(x, float | int | np.number) and not isinstance(x, bool):
                assert float(x) == pytest.approx(float(y), rel=1e-9, abs=1e-12), (got.columns[j], x, y)
            else:
                assert x == y, (got.columns[j], x, y)


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_the_docs_list_a_dozen_recipes_and_each_has_a_check():
    assert set(recipes()) == set(PANDAS)
    assert len(PANDAS) >= 12


@pytest.mark.parametrize("name", sorted(PANDAS))
def test_recipe_equals_pandas(run_dir, name):
    sql = recipes()[name]
    got = query(run_dir, sql)
    expected = PANDAS[name](*frames(run_dir))
    assert len(expected) > 0, "the run must give every recipe something to count"
    same(got, expected)


def test_the_run_exercises_every_table(run_dir):
    """The fixture has what the recipes are about: three drop causes, stale messages, timeouts, releases."""
    causes = query(run_dir, "SELECT DISTINCT reason FROM messages WHERE reason IS NOT NULL ORDER BY 1")
    assert causes.column("reason").to_pylist() == ["loss", "offline", "outage"]
    counts = query(run_dir, "SELECT (SELECT count(*) FROM messages WHERE stale) AS stale, "
                            "(SELECT count(*) FROM trace WHERE kind = 'timeout') AS timeouts, "
                            "(SELECT count(*) FROM releases) AS releases, (SELECT count(*) FROM metrics) AS m, "
                            "(SELECT count(*) FROM agent_metrics) AS am").to_pylist()[0]
    assert min(counts.values()) > 0, counts


def test_message_table_is_consistent_with_the_trace(run_dir):
    """Every send is one message; delivered latency is the deliver row's recorded delay; drops at the send."""
    bad = query(run_dir, """
        SELECT count(*) AS n FROM messages m JOIN trace d ON d.kind = 'deliver' AND d.msg = m.msg
        WHERE abs(m.latency - d.value) > 1e-12 OR d.agent <> m.dst OR d.peer <> m.src""")
    assert bad.column("n")[0].as_py() == 0
    n = query(run_dir, "SELECT count(*) AS n, count(DISTINCT msg) AS d FROM messages").to_pylist()[0]
    assert n["n"] == n["d"] == read_trace(run_dir).to_pandas().query("kind == 'send'").shape[0]


def test_zcdp_bound_is_never_below_the_accountant(run_dir):
    """The SQL epsilon ignores subsampling, so it bounds the run's RDP epsilon (summary.json) from above."""
    import json

    summary = json.loads((run_dir / "summary.json").read_text())
    worst = query(run_dir, "SELECT max(e) AS e FROM (SELECT zcdp_epsilon(sum(rho), 1e-5) AS e FROM releases "
                           "GROUP BY agent)").column("e")[0].as_py()
    assert summary["privacy_delta"] == DELTA
    assert worst >= summary["privacy_epsilon_max"] > 0


def test_releases_parse_the_tag_exactly(run_dir):
    from netsim.trace.events import Release

    tr = read_trace(run_dir).to_pandas()
    row = tr[tr.kind == "release"].iloc[0]
    rec = Release.from_row(row.t, row.agent, row.peer, row["round"], row["size"], row.value, row.tag)
    got = query(run_dir, "SELECT * FROM releases ORDER BY t, agent LIMIT 1").to_pylist()[0]
    assert (got["mechanism"], got["what"], got["sensitivity"], got["q"], got["p"], got["skipped"]) == \
        (rec.mechanism, rec.what, rec.sensitivity, rec.q, rec.p, rec.skipped)
    assert got["noise_multiplier"] == rec.scale / rec.sensitivity
    assert got["rho"] == rec.sensitivity ** 2 / (2 * rec.scale ** 2)


def test_an_in_memory_trace_replaces_the_file(run_dir):
    """The explorer hands over the table it holds: the same answers as the folder's file, and a cut table
    (a live run so far) answers for what it has."""
    table = read_trace(run_dir).table
    sql = recipes()["drops by cause"]
    assert query(None, sql, trace=table).equals(query(run_dir, sql))
    assert query(run_dir, sql, trace=read_trace(run_dir)).equals(query(run_dir, sql))
    half = table.slice(0, table.num_rows // 2)
    n = query(None, "SELECT count(*) AS n FROM trace", trace=half).column("n")[0].as_py()
    assert n == half.num_rows
    assert query(None, "SELECT count(*) AS n FROM metrics", trace=half).column("n")[0].as_py() == 0
    with pytest.raises(InputError, match="trace: expected a netsim trace table"):
        query(None, "SELECT 1", trace=pa.table({"x": [1]}))


def test_a_connection_serves_many_queries(run_dir):
    from netsim.metrics.sql import run_sql

    con = connect(run_dir)
    try:
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert set(TABLES) <= names
        assert run_sql(con, "SELECT count(*) AS n FROM trace").column("n")[0].as_py() > 0
    finally:
        con.close()


@pytest.mark.parametrize("sql, says", [
    ("SELEC 1", "Parser Error"),
    ("SELECT nope FROM trace", 'Referenced column "nope" not found'),
    ("SELECT * FROM tracee", "tables: trace, messages, metrics, agent_metrics, releases"),
    ("   ", "empty query"),
])
def test_bad_sql_is_one_input_error_line(run_dir, sql, says):
    with pytest.raises(InputError) as e:
        query(run_dir, sql)
    line = str(e.value)
    assert says in line and "\n" not in line and line.startswith(f"{run_dir}: SQL: ")


def test_a_query_touches_no_other_file(run_dir, tmp_path):
    target = tmp_path / "out.csv"
    for sql in (f"COPY trace TO '{target}'", f"SELECT * FROM read_csv('{run_dir / 'metrics.csv'}')",
                "SET enable_external_access = true"):
        with pytest.raises(InputError):
            query(run_dir, sql)
    assert not target.exists()


def test_every_recipe_runs_on_a_trace_only_folder():
    """tests/data/explore_bursty holds only a trace: metrics (time only) and agent_metrics are empty tables,
    so the recipes that read no metrics column answer as on a full run folder."""
    folder = ROOT / "tests" / "data" / "explore_bursty"
    for sql in recipes().values():
        if "FROM metrics" not in sql:
            query(folder, sql)  # no error
    assert query(folder, "SELECT count(*) AS n FROM agent_metrics").column("n")[0].as_py() == 0


def test_cli_table_csv_parquet_and_errors(run_dir, tmp_path):
    sql = recipes()["drops by cause"]
    expected = query(run_dir, sql).to_pandas()
    env = cli_env()
    out = subprocess.run(netsim_cli("query", str(run_dir), sql), capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "reason" in out.stdout and "offline" in out.stdout and "(3 rows)" in out.stdout
    pq_path = tmp_path / "r.parquet"
    out = subprocess.run(netsim_cli("query", str(run_dir), sql, "--csv", "--parquet", str(pq_path)),
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(out.stdout)), expected)
    pd.testing.assert_frame_equal(pq.read_table(pq_path).to_pandas(), expected)
    bad = subprocess.run(netsim_cli("query", str(run_dir), "SELECT nope FROM trace"), capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith(f"error: {run_dir}: SQL: Binder Error")
    assert "Traceback" not in bad.stderr
    missing = subprocess.run(netsim_cli("query", str(tmp_path / "nothing"), "SELECT 1"), capture_output=True,
                             text=True, env=env)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_a_partial_trace_is_queried_up_to_its_last_batch_with_a_warning(run_dir, tmp_path):
    """A live or killed run: the trace without its end marker reads up to its last whole batch."""
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    for name in ("summary.json", *END_FILES):  # a killed run has none of these
        (cut / name).unlink(missing_ok=True)
    data = (cut / "trace.arrows").read_bytes()
    (cut / "trace.arrows").write_bytes(data[: len(data) * 2 // 3])
    n = query(cut, "SELECT count(*) AS n FROM trace").column("n")[0].as_py()
    assert 0 < n == read_trace(cut).table.num_rows < read_trace(run_dir).table.num_rows
    out = subprocess.run(netsim_cli("query", str(cut), "SELECT count(*) AS n FROM trace"), capture_output=True,
                         text=True, env=cli_env())
    assert out.returncode == 0 and out.stderr.startswith("warning: partial run, up to t = ")
    assert f" {n} " in out.stdout


# ---- the same recipes through `netsim query` and the explorer's query bar ----

def test_every_recipe_through_the_cli_equals_pandas(run_dir, tmp_path):
    """``netsim query RUN SQL --parquet FILE`` gives each recipe's rows, types kept, of docs/traces.md and of
    docs/explore.md's query bar (on the explorer's committed trace)."""
    from typer.testing import CliRunner

    from netsim.cli import app
    from tests import test_explore_ui as ui

    runner = CliRunner()

    def cli_rows(folder, sql):
        out = tmp_path / "r.parquet"
        res = runner.invoke(app, ["query", str(folder), sql, "--parquet", str(out)])
        assert res.exit_code == 0, res.output
        return pq.read_table(out)

    for name, sql in recipes().items():
        same(cli_rows(run_dir, sql), PANDAS[name](*frames(run_dir)))
    for name, sql in ui.recipes().items():
        want = ui.expected(name).reset_index(drop=True)
        same(cli_rows(ui.TRACE, sql), want)


def test_every_docs_recipe_through_the_query_bar_equals_pandas(run_dir):
    """The query bar (``:``) answers each recipe of docs/traces.md on the run, typed as one line."""
    import asyncio

    from netsim.explore.app import Explorer
    from netsim.explore.panels import PromptBar, ResultsPanel

    async def main():
        app = Explorer(run_dir)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            for name, sql in recipes().items():
                await pilot.press("colon")
                app.query_one(PromptBar).value = " ".join(line.strip() for line in sql.splitlines())
                await pilot.press("enter")
                await app.workers.wait_for_complete()
                await pilot.pause()
                same(app.query_one(ResultsPanel).result, PANDAS[name](*frames(run_dir)))
                await pilot.press("escape")

    asyncio.run(main())
