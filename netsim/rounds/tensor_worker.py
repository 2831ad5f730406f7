"""A lookahead driver's tensor work in a second process, one window behind its control.

Conservative windows exist so that work can run side by side: nothing in the window [T, T + L) depends on anything
else in it. The drivers use that twice. Within a window, every agent's tensor operations are batched (one call per
kind and lock step). Across windows, the control of window k + 1 (times, peers, latencies, losses: streams and
Python, never a tensor) does not read the tensor work of window k. So, with a second core, a forked worker process
does the tensor work of each window while this process plays the next window's events: the same driver code, the
same operations in the same order, so the same bits. Trace, metrics and models are those of the run in one process.

What crosses the pipe, per window: the driver's ``window_work`` (its control's output: each agent's operations, the
new gradient requests, the gradient batches), pickled. Back, only when this process needs it: the bank's rows
(``ParameterBank.W`` and its named states) before an evaluation and at the end, with the gradient service's counts
and the worker's tensor seconds. A failure in the worker fails the run with the worker's traceback.

Used when (``reason_not``): the bank is on the CPU (a CUDA context does not survive a fork), this process may use
two cores, the platform forks, this process is not a worker itself (a parallel sweep's), the run keeps no privacy
ledger (a release is accounted where it is made: in the worker it would not be; one there fails the run) and
``NETSIM_TENSOR_WORKER`` is not ``0`` (``1``: a worker even on one core, as the tests use it). The run summary's
``windows.tensor_worker`` says whether one was used, ``tensor_worker_why_not`` why not.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback

ENV = "NETSIM_TENSOR_WORKER"


def reason_not(sim) -> str | None:
    """Why this run's windows keep their tensor work in this process (None: a worker takes it)."""
    setting = os.environ.get(ENV, "auto").strip().lower()
    if setting in ("0", "off", "no", "false"):
        return f"{ENV}={setting}"
    if sim.world.bank.W.device.type != "cpu":
        return "the bank is not on the CPU"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this platform does not fork"
    if multiprocessing.parent_process() is not None:
        return "a worker process already (a parallel sweep's: its cores run other runs)"
    if sim.world.scenario.privacy is not None or any(a.existing_ledger is not None for a in sim.loop.agents):
        return "privacy: a release is accounted where it is made"
    if setting not in ("1", "on", "yes", "true") and len(os.sched_getaffinity(0)) < 2:
        return "one core"
    return None


def _serve(driver, conn) -> None:
    """The worker: each window's work as it comes; the bank when asked; everything at the end."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run (and this worker)
    torch.set_num_threads(1)  # the other core plays the control
    driver.sim.refuse_ledgers(f"a release in the windows' tensor worker would not be accounted: run with {ENV}=0")
    stats, svc, writer = driver.stats, driver.svc, driver.writer
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "work":
                writer.emit_rows(msg[2])
                first = driver.take_work(msg[1])
                t1 = time.perf_counter()
                driver.tensor_work(first)
                stats.tensor_s += time.perf_counter() - t1
            elif msg[0] == "bank":
                conn.send(("bank", _bank(driver.bank)))
            else:
                writer.emit_rows(msg[1])
                conn.send(("end", writer.handoff(), _bank(driver.bank), svc.calls, svc.evaluated, stats.tensor_s,
                           stats.gradient_s))
                return
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the run, with its traceback
        conn.send(("error", writer.handoff(), f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _bank(bank) -> tuple:
    """The bank's rows and named states as numpy arrays (pickled by value, not as shared torch storage)."""
    return bank.W.numpy().copy(), {k: v.numpy().copy() for k, v in bank.states.items()}


class TensorWorker:
    """This process's end of the worker (``start``): ``send`` a window's work, ``sync_bank`` before an evaluation,
    ``finish`` at the end; ``abandon`` when the run fails here."""

    def __init__(self, driver):
        ctx = multiprocessing.get_context("fork")
        self.driver = driver
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(driver, child), daemon=True, name="netsim-tensor-worker")
        self.proc.start()
        child.close()

    def send(self, work, rows: list) -> None:
        """The work of the windows played since the last send, and the trace rows made here since (cleared)."""
        if self.conn.poll():  # a failure comes back at once
            self._expect("")
        try:
            self.conn.send(("work", work, rows))
        except (BrokenPipeError, EOFError, ConnectionResetError):
            self._died()
        rows.clear()

    def _expect(self, what: str):
        try:
            msg = self.conn.recv()
        except (EOFError, ConnectionResetError):
            self._died()
        if msg[0] == "error":
            self.driver.writer.adopt(msg[1])  # the trace as far as the worker wrote it
            self.end()
            raise RuntimeError(f"the windows' tensor worker failed: {msg[2]}")
        if msg[0] != what:
            raise RuntimeError(f"the windows' tensor worker answered {msg[0]!r}, not {what!r}")
        return msg

    def _died(self):
        self.proc.join(1.0)
        self.driver.writer.buffer = []  # written by the worker, or lost with it: the trace ends where it stopped
        raise RuntimeError(f"the windows' tensor worker died (exit code {self.proc.exitcode})")

    def _restore(self, got: tuple) -> None:
        import torch

        W, states = got
        bank = self.driver.bank
        bank.W.copy_(torch.from_numpy(W))
        for k, v in states.items():
            bank.state(k, tuple(v.shape)).copy_(torch.from_numpy(v))

    def sync_bank(self) -> None:
        """The bank as it stands after the windows sent so far (for an evaluation)."""
        self.conn.send(("bank",))
        self._restore(self._expect("bank")[1])

    def finish(self, rows: list) -> None:
        """After the last window (``rows``: the trace rows made here since the last send): the trace writer's
        state, the bank, the gradient counts and the worker's tensor seconds; the worker ends."""
        self.conn.send(("end", rows))
        rows.clear()
        _, trace, bank, calls, evaluated, tensor_s, gradient_s = self._expect("end")
        d = self.driver
        d.writer.adopt(trace)
        self._restore(bank)
        d.svc.calls, d.svc.evaluated = calls, evaluated
        d.stats.tensor_s, d.stats.gradient_s = tensor_s, gradient_s
        self.end()

    def abandon(self, rows: list) -> None:
        """The run failed here: the trace as the worker wrote it (with ``rows``) if it still answers, then it ends."""
        if self.proc.is_alive():
            try:
                self.conn.send(("end", rows))
                if self.conn.poll(60.0):
                    msg = self.conn.recv()
                    self.driver.writer.adopt(msg[1])
            except (OSError, EOFError):
                self.driver.writer.buffer = []
        self.end()

    def end(self) -> None:
        if self.proc.is_alive():
            self.proc.join(1.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
