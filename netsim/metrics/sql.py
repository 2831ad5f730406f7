"""SQL over a run folder (DuckDB): the trace, its messages, the metrics, the agents' metrics and the
privacy releases as tables, so any question about a run is one query (``netsim query``, the explorer's
query bar). Recipes: docs/traces.md, "Asking the trace in SQL".

    table          one row per                       columns
    trace          event (the Arrow trace, as is)    t, kind, agent, peer, msg, size, value, round, tag
    messages       message sent                      msg, src, dst, round, tag, size, t_send, t_end,
                                                     outcome ('delivered' | 'dropped' | 'in_flight'),
                                                     reason (drop cause, else NULL), latency (delivered:
                                                     t_end - t_send, else NULL), stale (arrived after its
                                                     round was over)
    metrics        evaluation (metrics.csv/.parquet) time and the run's metric columns, as doubles
    agent_metrics  agent and evaluation              time, agent, loss, accuracy (agent_metrics.csv)
    releases       privatized release                t, agent, recipient (-1: public), round, coordinates,
                                                     mechanism, what, scale, sensitivity, q, p, skipped,
                                                     noise_multiplier (scale / sensitivity), rho (zCDP of a
                                                     Gaussian release alone: s^2 / (2 scale^2), no
                                                     subsampling), pure_epsilon (a Laplace release: s / b)

A table whose file the folder lacks (a trace-only folder, a run without agent_accuracy) is there and
empty, so every recipe runs on every folder. ``zcdp_epsilon(rho, delta)`` is the (epsilon, delta) bound of
rho-zCDP (Bun and Steinke 2016, "Concentrated differential privacy: simplifications, extensions, and lower
bounds", Prop. 1.3: epsilon = rho + 2 sqrt(rho ln(1/delta))); summed ``rho`` composes releases
(Lemma 2.3). It ignores subsampling and hidden activation, so it is an upper bound: ``netsim privacy``
is the tight accountant.

The connection cannot touch files (DuckDB's ``enable_external_access`` is off once the tables are in):
a query reads the run, never writes or reads anything else.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from netsim.errors import InputError

TABLES = ("trace", "messages", "metrics", "agent_metrics", "releases")

_MESSAGES = """
CREATE VIEW messages AS
SELECT s.msg, s.agent AS src, s.peer AS dst, s.round, s.tag, s.size, s.t AS t_send,
       coalesce(d.t, x.t) AS t_end,
       CASE WHEN d.msg IS NOT NULL THEN 'delivered' WHEN x.msg IS NOT NULL THEN 'dropped'
            ELSE 'in_flight' END AS outcome,
       x.tag AS reason,
       d.t - s.t AS latency,
       st.msg IS NOT NULL AS stale
FROM (SELECT * FROM trace WHERE kind = 'send') s
LEFT JOIN (SELECT msg, min(t) AS t FROM trace WHERE kind = 'deliver' GROUP BY msg) d ON d.msg = s.msg
LEFT JOIN (SELECT msg, min(t) AS t, min(tag) AS tag FROM trace WHERE kind = 'drop' GROUP BY msg) x
       ON x.msg = s.msg
LEFT JOIN (SELECT DISTINCT msg FROM trace WHERE kind = 'stale') st ON st.msg = s.msg
"""

# a release's tag: "<mechanism> <what> s=<sensitivity> q=<q> p=<p> k=<skipped>" (trace/events.py, Release)
_RELEASES = """
CREATE VIEW releases AS
WITH r AS (SELECT t, agent, peer, round, size, value, string_split(tag, ' ') AS f
           FROM trace WHERE kind = 'release')
SELECT t, agent, peer AS recipient, round, size AS coordinates, f[1] AS mechanism, f[2] AS what,
       value AS scale, CAST(f[3][3:] AS DOUBLE) AS sensitivity, CAST(f[4][3:] AS DOUBLE) AS q,
       CAST(f[5][3:] AS DOUBLE) AS p, CAST(f[6][3:] AS BIGINT) AS skipped,
       value / CAST(f[3][3:] AS DOUBLE) AS noise_multiplier,
       CASE WHEN f[1] = 'gaussian' THEN CAST(f[3][3:] AS DOUBLE) ^ 2 / (2 * value ^ 2) END AS rho,
       CASE WHEN f[1] = 'laplace' THEN CAST(f[3][3:] AS DOUBLE) / value END AS pure_epsilon
FROM r
"""

_MACROS = "CREATE MACRO zcdp_epsilon(rho, delta) AS rho + 2 * sqrt(rho * ln(1 / delta))"


def _error(e: Exception, source: str) -> InputError:
    """DuckDB's message (several lines, with a caret under the query) as one line."""
    text = str(e).split("\n\nLINE ")[0]
    text = re.sub(r' Did you mean "pg_\w+"\?', "", " ".join(text.split()))
    if "Table with name" in text or "does not exist" in text:
        text += f" (tables: {', '.join(TABLES)})"
    return InputError("SQL", text[:400], source)


def _metrics(folder: Path | None):
    import pyarrow as pa

    from netsim.metrics.report import read_metrics

    if folder is None or not ((folder / "metrics.csv").is_file() or (folder / "metrics.parquet").is_file()):
        return pa.table({"time": pa.array([], pa.float64())})
    rows = read_metrics(folder)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return pa.table({c: pa.array([r.get(c) for r in rows], pa.float64()) for c in cols})


def _agent_metrics(folder: Path | None):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    from netsim.metrics.report import AGENT_METRICS

    types = {"time": pa.float64(), "agent": pa.int64(), "loss": pa.float64(), "accuracy": pa.float64()}
    path = None if folder is None else folder / AGENT_METRICS
    if path is None or not path.is_file():
        return pa.table({c: pa.array([], t) for c, t in types.items()})
    try:
        table = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(column_types=types,
                                                                         include_columns=list(types)))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError("", f"not an agent metrics table: {' '.join(str(e).split())[:160]}", str(path)) from None
    return table


def _trace_table(trace: Any, folder: Path | None):
    """The trace as an Arrow table: the one given (a ``pyarrow.Table`` or a ``Trace``), else the folder's."""
    import pyarrow as pa

    from netsim.trace.events import COLUMNS
    from netsim.trace.io import SCHEMA, TRACE_FILE, read_trace

    if trace is None:
        if folder is None or not (folder / TRACE_FILE).is_file():
            return pa.table({f.name: pa.array([], f.type) for f in SCHEMA})
        return read_trace(folder).table
    table = getattr(trace, "table", trace)
    if not isinstance(table, pa.Table) or not set(COLUMNS) <= set(table.column_names):
        raise InputError("trace", f"expected a netsim trace table with columns {', '.join(COLUMNS)}")
    return table


def connect(run: str | Path | None = None, trace: Any = None):
    """A DuckDB connection over a run folder (or its trace.arrows) with ``TABLES`` as views.

    ``trace`` (a ``pyarrow.Table`` with the trace's columns, or a ``Trace``) is used instead of reading
    the folder's trace.arrows: the explorer hands over the table it already holds (a live run's rows so
    far). Without ``run`` only the trace's tables have rows."""
    import duckdb

    folder = None
    if run is not None:
        folder = Path(run)
        if folder.is_file():
            folder = folder.parent
        elif not folder.is_dir():
            raise InputError("", "not found (give a run folder or its trace.arrows)", str(run))
        from netsim.trace.folder import check_run_folder

        check_run_folder(folder)  # its tables all one run's
    source = str(run) if run is not None else "trace"
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                                 "threads": 2})
    try:
        con.register("trace", _trace_table(trace, folder))
        con.register("metrics", _metrics(folder))
        con.register("agent_metrics", _agent_metrics(folder))
        for stmt in (_MESSAGES, _RELEASES, _MACROS):
            con.execute(stmt)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as e:  # pragma: no cover - the views are fixed text over checked tables
        con.close()
        raise _error(e, source) from None
    except BaseException:
        con.close()
        raise
    return con


def run_sql(con, sql: str, source: str = "query"):
    """One query on a ``connect`` connection, as a ``pyarrow.Table``; bad SQL is one InputError line."""
    import duckdb

    if not sql.strip():
        raise InputError("SQL", "empty query (e.g. SELECT kind, count(*) FROM trace GROUP BY kind)", source)
    try:
        rel = con.sql(sql)
        if rel is None:
            raise InputError("SQL", "the statement returns no rows: give a query (SELECT ...)", source)
        table = rel.to_arrow_table()
    except duckdb.Error as e:
        raise _error(e, source) from None
    return _plain_integers(table)


def _plain_integers(table):
    """DuckDB's sums of integers are 128-bit (Arrow decimal128(38, 0)): back to int64 where they fit."""
    import pyarrow as pa

    for i, f in enumerate(table.schema):
        if pa.types.is_decimal(f.type) and f.type.scale == 0:
            try:
                table = table.set_column(i, f.name, table.column(i).cast(pa.int64()))
            except pa.ArrowInvalid:  # beyond int64: kept exact
                pass
    return table


def query(run: str | Path | None, sql: str, trace: Any = None):
    """``sql`` over a run folder's tables (``connect``), as a ``pyarrow.Table``."""
    con = connect(run, trace)
    try:
        return run_sql(con, sql, str(run) if run is not None else "trace")
    finally:
        con.close()
