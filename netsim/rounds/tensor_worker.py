"""A lookahead driver's tensor work and trace writing in a second process, beside its control.

Conservative windows exist so that work can run side by side: nothing in the window [T, T + L) depends on anything
else in it. The drivers use that twice. Within a window, every agent's tensor operations are batched (one call per
kind and lock step). Across windows, the control of the next windows (times, peers, latencies, losses: streams and
Python, never a tensor) does not read the tensor work of the last ones. So, with a second core, a forked worker
process does the tensor work while this process plays the next windows' events: the same driver code, the same
operations in the same order, so the same bits. Trace, metrics and models are those of the run in one process.

What crosses the pipe, each time the driver's tensor work is due: its ``window_work`` (the control's output: each
agent's operations, the new gradient requests, the gradient batches), pickled, and the trace rows made since as
packed records (``PackedRows``: bytes, columns at the other end); the worker writes the trace (turning rows into Arrow
costs more than shipping them). Back, only when this process needs it: the bank's rows (``ParameterBank.W`` and its
named states) before an evaluation and at the end, and at the end (or on a failure on either side) the trace
writer's state (``TraceWriter.handoff``), the gradient service's counts and the worker's tensor seconds. A failure
in the worker fails the run with the worker's traceback.

Used when (``reason_not``): the bank is on the CPU (a CUDA context does not survive a fork), this process may use
two cores and runs torch at one thread (the worker computes at one: OpenMP's threads do not survive a fork, and a
BLAS product or a reduction to one value can round differently at another thread count than the events engine's),
the platform forks, this process is not a worker itself (a parallel sweep's), the run keeps no privacy ledger (a
release is accounted where it is made: in the worker it would not be; one there fails the run) and
``NETSIM_TENSOR_WORKER`` is not ``0`` (``1``: a worker even on one core or at more threads, as the tests use it, or
for a driver that keeps one process unless asked: the broadcast pattern's, whose control bounds its runs). The run
summary's ``windows.tensor_worker`` says whether one was used, ``tensor_worker_why_not`` why not.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
import traceback

from netsim.trace.io import PackedRows, Words

ENV = "NETSIM_TENSOR_WORKER"


def reason_not(sim, unasked: str | None = None) -> str | None:
    """Why this run's windows keep their tensor work in this process (None: a worker takes it). ``unasked``: the
    driver's reason to keep one process unless ``NETSIM_TENSOR_WORKER=1`` asks for a worker."""
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
    if setting not in ("1", "on", "yes", "true"):
        if unasked:
            return unasked
        if len(os.sched_getaffinity(0)) < 2:
            return "one core"
        import torch

        if torch.get_num_threads() != 1:  # the worker computes at one thread: the engine's bits need the same count
            return (f"torch runs {torch.get_num_threads()} threads here and the worker one (OpenMP does not survive "
                    "a fork): a product can round differently at another thread count; OMP_NUM_THREADS=1 gives a "
                    "worker")
    return None


def _serve(driver, conn) -> None:
    """The worker: each window's work as it comes; the bank when asked; everything at the end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run (and this worker)
    import torch

    torch.set_num_threads(1)  # the other core plays the control; OpenMP's threads do not survive a fork
    driver.sim.refuse_ledgers(f"a release in the windows' tensor worker would not be accounted: run with {ENV}=0")
    stats, svc, writer = driver.stats, driver.svc, driver.writer
    rows = PackedRows(Words())  # the control's rows not yet in a whole batch
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "work":
                _take(rows, msg[2])
                rows.write_to(writer)
                first = driver.take_work(msg[1])
                t1 = time.perf_counter()
                driver.tensor_work(first)
                stats.tensor_s += time.perf_counter() - t1
            elif msg[0] == "bank":
                conn.send(("bank", _bank(driver.bank)))
            else:
                _take(rows, msg[1])
                rows.write_to(writer, final=True)
                conn.send(("end", writer.handoff(), _bank(driver.bank), svc.calls, svc.evaluated, stats.tensor_s,
                           stats.gradient_s))
                return
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the run, with its traceback
        with contextlib.suppress(Exception):
            rows.write_to(writer, final=True)  # the rows it got, in the trace it hands back
        conn.send(("error", writer.handoff(), f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _take(rows: PackedRows, shipped: tuple) -> None:
    """``PackedRows.ship``'s rows after ``rows``, all with the control's codes: its words only grow, so earlier rows'
    codes hold (a fresh ``Words``: the writer may add words of its own to one, for the rows it holds)."""
    data, words = shipped
    codes = Words()
    for w in words:
        codes(w)
    rows.put(data)
    rows.words = codes


def _dumps(msg: tuple) -> bytes:
    """Plain pickle (ints, lists, bytes, numpy arrays): multiprocessing's own pickler looks every object's type up in
    a Python mapping, ~3x slower."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


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
        # the messages are pickled here and written by a thread: a full pipe (the worker busy with the last work)
        # never stops the control, and the order of the messages is kept
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.broken: BaseException | None = None
        self.writer = threading.Thread(target=self._write, daemon=True, name="netsim-tensor-worker-pipe")
        self.writer.start()

    def _write(self) -> None:
        while True:
            data = self.outbox.get()
            if data is None:
                return
            try:
                self.conn.send_bytes(data)
            except (OSError, EOFError) as e:  # the worker is gone: said where the run next waits on it
                self.broken = e
                return

    def _put(self, msg: tuple) -> None:
        if self.broken is not None:
            self._died()
        self.outbox.put(_dumps(msg))

    def send(self, work, rows: PackedRows) -> None:
        """The work of the windows played since the last send, and the trace rows made here since (cleared)."""
        if self.conn.poll():  # a failure comes back at once
            self._expect("")
        self._put(("work", work, rows.ship()))

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
        self.outbox.put(None)
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
        self._put(("bank",))
        self._restore(self._expect("bank")[1])

    def finish(self, rows: PackedRows) -> None:
        """After the last window (``rows``: the trace rows made here since the last send): the trace writer's
        state, the bank, the gradient counts and the worker's tensor seconds; the worker ends."""
        self._put(("end", rows.ship()))
        _, trace, bank, calls, evaluated, tensor_s, gradient_s = self._expect("end")
        d = self.driver
        d.writer.adopt(trace)
        self._restore(bank)
        d.svc.calls, d.svc.evaluated = calls, evaluated
        d.stats.tensor_s, d.stats.gradient_s = tensor_s, gradient_s
        self.end()

    def abandon(self, rows: PackedRows) -> None:
        """The run failed here: the trace as the worker wrote it (with ``rows``) if it still answers, then it ends."""
        if self.conn.closed:  # ended already (its failure handed the writer back)
            return
        if self.proc.is_alive() and self.broken is None:
            try:
                self._put(("end", rows.ship()))
                if self.conn.poll(60.0):
                    self.driver.writer.adopt(self.conn.recv()[1])
                    self.end()
                    return
            except (OSError, EOFError):
                pass
        self.driver.writer.buffer = []  # what the worker wrote stands; what it held is lost with it
        self.end()

    def end(self) -> None:
        self.outbox.put(None)
        self.writer.join(1.0)
        if self.proc.is_alive():
            self.proc.join(1.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
