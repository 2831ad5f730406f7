"""Sweeps on Ray: one run per Ray task (``netsim sweep SWEEP.toml --ray [ADDRESS]``).

A task runs its scenario (sent as resolved TOML text) into a temporary folder on whichever node Ray
picks, and returns the folder's files; the driver writes them into the run folder, ``summary.json``
last and atomically, exactly as a local run does. So no shared filesystem is needed, only the data
files a scenario names (``$NETSIM_DATA`` on every node). Address: 'local' starts a private Ray
instance on this machine; 'auto' joins the cluster this machine belongs to (``ray start``);
``ray://HEAD:10001`` connects a remote client.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from netsim.errors import InputError
from netsim.sweep import RunTask, execute

SUMMARY = "summary.json"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InputError("--ray", "Ray is not installed; install netsim[ray] "
                                  "(pip install 'netsim[ray]')") from None
    return ray


def run_task(task: RunTask, cwd: str | None = None) -> dict[str, bytes]:
    """Run one task in a scratch folder and return its files (the body of the Ray task)."""
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)  # same machine as the driver: relative data paths resolve as they do locally
    with tempfile.TemporaryDirectory(prefix="netsim-ray-") as tmp:
        execute(task, tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}


def write_run(folder: str | Path, files: dict[str, bytes]) -> None:
    """Write a gathered run folder; ``summary.json`` last, through a rename (completeness marker)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SUMMARY).unlink(missing_ok=True)
    for name, data in files.items():
        if name != SUMMARY:
            (folder / name).write_bytes(data)
    tmp = folder / (SUMMARY + ".tmp")
    tmp.write_bytes(files[SUMMARY])
    os.replace(tmp, folder / SUMMARY)


def _check_reachable(address: str) -> None:
    """Fail fast on a ``HOST:PORT`` nobody answers (ray.init would retry for minutes)."""
    import socket

    if address in ("local", "auto") or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError("--ray", f"expected local, auto, HOST:PORT or ray://HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise InputError("--ray", f"no Ray cluster answers at {address!r}: {e}") from None


def run_ray(tasks: list[RunTask], address: str, gpus_per_run: float = 0.0,
            on_done: Callable[[RunTask], None] | None = None, num_cpus: int | None = None) -> None:
    """Run ``tasks`` as Ray tasks (1 CPU and ``gpus_per_run`` GPUs each) and gather their folders."""
    ray = _import_ray()
    if gpus_per_run < 0:
        raise InputError("--gpus-per-run", f"must be >= 0, got {gpus_per_run}")
    started = not ray.is_initialized()
    if started:
        _check_reachable(address)
        kw = {"num_cpus": num_cpus} if address == "local" else {"address": address}
        try:
            ray.init(include_dashboard=False, log_to_driver=False, **kw)
        except (ValueError, ConnectionError, RuntimeError) as e:
            raise InputError("--ray", f"cannot start or reach Ray at {address!r}: {e}") from None
    try:
        remote = ray.remote(num_cpus=1, num_gpus=gpus_per_run, max_retries=1)(run_task)
        cwd = os.getcwd()
        pending = {remote.remote(t, cwd): t for t in tasks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                write_run(task.folder, ray.get(ref))
                if on_done is not None:
                    on_done(task)
    finally:
        if started:
            ray.shutdown()
