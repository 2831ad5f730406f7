"""A run folder as its readers see it: the files a run writes there, and the check that they are one run's.

A folder holds one run. Each file says whose it is: the trace's header, ``scenario.toml`` (its text) and the
summaries (``scenario_sha256``) carry the sha256 of the run's scenario; the files a run writes when it
completes (``END_FILES``: metrics tables, plots, the mixing record) are listed in ``summary.json``'s ``files``
with their own sha256, and a run that did not complete (no ``summary.json``) has none of them. So a folder that
mixes two runs (an older netsim's ``--force`` into a complete run, then Ctrl-C; files copied in by hand) shows
it, and every reader refuses it in one line (``check_run_folder``): ``read_trace`` and ``TraceTail`` (given a
folder or its ``trace.arrows``), ``read_summary``, ``read_metrics`` and ``netsim query``'s tables all check the
folder before they read it. A folder a live netsim process is writing (its lock) is not checked: it is
between states by design.

The names live here, the lowest layer every reader may import; ``netsim.run_folder`` (the writer) imports them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from netsim.errors import InputError
from netsim.trace.io import TRACE_FILE, has_end_marker

SCENARIO_FILE = "scenario.toml"
SUMMARY_FILE = "summary.json"  # written last, atomically: its presence marks a complete run folder
PARTIAL_SUMMARY = "summary.partial.json"  # an interrupted or crashed run's summary so far
LOCK_FILE = ".netsim.lock"
# written when a run completes, before summary.json (which lists them with their sha256)
END_FILES = ("metrics.csv", "metrics.parquet", "agent_metrics.csv", "plot.png", "agent_accuracy.png", "mixing.csv",
             "payloads.npz")
# written into a run folder later, by `netsim privacy`: derived from the run's files, so a fresh run removes them
REPORT_FILES = ("privacy.json", "privacy.png", "pairwise.csv", "pairwise_hops.png", "pairwise_heatmap.png",
                "attack.csv", "attack.png", "audit.csv", "audit.png")
# everything of a run's: a fresh start (`--force`) removes these (and the checkpoints) before it writes anything
RUN_FILES = (SUMMARY_FILE, PARTIAL_SUMMARY, TRACE_FILE, *END_FILES, *REPORT_FILES)


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            sha.update(chunk)
    return sha.hexdigest()


def end_files(folder: Path) -> dict[str, str]:
    """The ``END_FILES`` a run wrote into ``folder``, with their sha256: ``summary.json``'s ``files``."""
    return {name: file_sha256(folder / name) for name in END_FILES if (folder / name).is_file()}


def live_writer(folder: Path) -> int | None:
    """The PID in the folder's lock if that process is alive and not this one."""
    try:
        other = int((folder / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None
    if other == os.getpid():
        return None
    try:
        os.kill(other, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    except OverflowError:
        return None
    return other


_CHECKED: dict[Path, tuple] = {}  # folder: the stat of its files when it last passed (a reader checks it often)


def check_run_folder(folder: str | Path) -> None:
    """Refuse (InputError, one line naming the folder and the files) a run folder whose files are not all one
    run's: files naming different scenarios (sha256), files a run writes when it completes beside a run that
    did not (no ``summary.json``) or that ``summary.json`` does not list, or a trace without its end beside
    a ``summary.json`` (a complete run's trace always ends with the end-of-stream marker). A file that cannot
    be read is left to its reader, which names what is wrong with it."""
    folder = Path(folder)
    if not folder.is_dir() or live_writer(folder) is not None:
        return
    stat = _stat(folder)
    if _CHECKED.get(folder) == stat:
        return
    where = str(folder)
    named = {name: sha for name, sha in ((SCENARIO_FILE, _scenario_sha(folder)), (TRACE_FILE, _trace_sha(folder)),
                                         (SUMMARY_FILE, _summary_sha(folder / SUMMARY_FILE)),
                                         (PARTIAL_SUMMARY, _summary_sha(folder / PARTIAL_SUMMARY))) if sha}
    if len(set(named.values())) > 1:
        groups: dict[str, list[str]] = {}
        for name, sha in named.items():
            groups.setdefault(sha, []).append(name)
        runs = "; ".join(f"{' and '.join(names)} of scenario sha256 {sha[:12]}" for sha, names in groups.items())
        raise InputError("", f"holds files of different runs ({runs}); run the scenario again into this folder "
                             "with --force, or into another", where)
    ends = [name for name in END_FILES if (folder / name).is_file()]
    summary = _json(folder / SUMMARY_FILE)
    if summary is None and not (folder / SUMMARY_FILE).exists():
        trace = folder / TRACE_FILE
        # a run writes its end files after its trace's end and before summary.json: killed in between, they are its own
        if ends and not (trace.is_file() and has_end_marker(trace)):
            raise InputError("", f"holds files of different runs: {', '.join(ends)} of a run that completed, "
                                 f"beside one that did not (no {SUMMARY_FILE}; a run writes them when it completes); "
                                 "run the scenario again into this folder with --force, or into another", where)
    elif isinstance(summary, dict):
        listed = summary.get("files")
        if isinstance(listed, dict):  # (a summary.json of a netsim before this check lists none)
            other = [name for name in ends if listed.get(name) != file_sha256(folder / name)]
            if other:
                what = "is not the one" if len(other) == 1 else "are not the ones"
                raise InputError("", f"holds files of different runs: {', '.join(other)} {what} {SUMMARY_FILE} lists "
                                     "(sha256 differs); run the scenario again into this folder with --force, or into "
                                     "another", where)
        trace = folder / TRACE_FILE
        if trace.is_file() and not has_end_marker(trace):
            raise InputError("", f"{SUMMARY_FILE} says the run completed, but {TRACE_FILE} does not record its end "
                                 "(cut, damaged, or another run's); run the scenario again", where)
    _CHECKED[folder] = stat


def _stat(folder: Path) -> tuple:
    out = []
    for name in (SCENARIO_FILE, TRACE_FILE, SUMMARY_FILE, PARTIAL_SUMMARY, *END_FILES):
        try:
            st = (folder / name).stat()
            out.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            pass
    return tuple(out)


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _summary_sha(path: Path) -> str | None:
    data = _json(path)
    sha = data.get("scenario_sha256") if isinstance(data, dict) else None
    return sha if isinstance(sha, str) else None


def _scenario_sha(folder: Path) -> str | None:
    from netsim.scenario.load import scenario_hash

    try:
        return scenario_hash((folder / SCENARIO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _trace_sha(folder: Path) -> str | None:
    """The scenario sha256 in the trace's header (None when it cannot be read: the trace's reader says why)."""
    import pyarrow as pa

    try:
        with pa.OSFile(str(folder / TRACE_FILE)) as f:
            schema = pa.ipc.read_schema(pa.ipc.read_message(f))
        sha = (schema.metadata or {}).get(b"netsim.scenario_sha256")
        return sha.decode() if sha else None
    except (pa.ArrowException, OSError, EOFError, ValueError):
        return None

