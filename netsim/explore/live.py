"""``netsim run SCENARIO --explore``: simulate in a child process and follow its trace in the explorer.

The run is an ordinary ``netsim run`` of its own (same scenario, overrides, plugins and folder), so its outputs
are exactly those of a run without the explorer, and the simulation does not compete with the app for the
interpreter. The explorer opens on the first flushed batch and re-reads the trace as it grows (follow mode).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from netsim.errors import InputError


def child_command(scenario: Path, sets: list[str], out: Path, plugins: list[str], force: bool) -> list[str]:
    """The same run as a plain ``netsim run`` (quiet: the explorer owns the terminal), on the events engine, whose
    trace grows event by event as the explorer follows it (the same bytes as any engine's)."""
    cmd = [sys.executable, "-m", "netsim", "run", str(scenario), "--out", str(out), "--quiet", "--engine", "events"]
    for s in sets:
        cmd += ["--set", s]
    for p in plugins:
        cmd += ["--plugin", p]
    return [*cmd, "--force"] if force else cmd


def start(cmd: list[str]) -> tuple[subprocess.Popen, Path]:
    log = Path(tempfile.mkstemp(prefix="netsim-run-", suffix=".log")[1])
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    return proc, log


def wait_for_trace(proc: subprocess.Popen, trace: Path, poll: float = 0.2):
    """The run's trace once its first batch is readable (None if the run ended first without one)."""
    from netsim.trace.io import read_trace

    while True:
        done = proc.poll() is not None
        if trace.exists():
            try:
                tr = read_trace(trace)
                if tr.table.num_rows or done:
                    return tr
            except InputError:  # the header is being written
                pass
        if done:
            return None
        time.sleep(poll)


def finish(proc: subprocess.Popen, log: Path, say) -> int:
    """Let the run end (Ctrl-C stops it as a plain run would: checkpoint, partial summary); its output."""
    import signal

    if proc.poll() is None:
        say(f"the run goes on (pid {proc.pid}); waiting for it to end, Ctrl-C stops it with a checkpoint")
        try:
            proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
    text = log.read_text()
    log.unlink(missing_ok=True)
    if text.strip():
        say(text.rstrip())
    return proc.returncode
