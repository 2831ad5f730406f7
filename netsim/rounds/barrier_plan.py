"""Barrier rounds planned round by round: the barrier windows' control as a recurrence in the round instead of a loop
over events in time.

A barrier of round k takes only messages of round k (older ones are discarded as stale, newer ones wait in the
queue), so an agent's round k depends only on its own round k - 1 and on round k of its in-neighbours, whatever their
clocks. ``Plan`` computes the run one round at a time for every agent at once: the activations, the gradients'
completions, the sends (each broadcast's links in one call), the gathers, the deliveries, each barrier's completion or
timeout and the next wakes, each by the engine's own rule (``Agent.plan_wake``, ``ComputeTimes``,
``network.outcomes``); every agent's and every link's streams are drawn in their own order, which is all the engine's
order is to them. The events are then put in simpy's order: by time, and at equal times by insertion, which is the
order in which their parents were processed, then their rank among what one parent scheduled: sorted by (time, the
parent's place, rank) until no parent moves (``Plan._order``; a barrier's completion is its cause's child, so it comes
right after it, as ``_Control.close`` processes it, unless another event has its time). The same rule decides each
comparison of equal times a barrier meets (``Plan.before``: a message at its gather or timer, two messages at one
instant, an event at run.until); those barriers, and those with older messages still to discard, are played message
by message (``Plan._barrier``), the others as arrays.

``Replay`` plays the plan window by window as the event-by-event control would, as arrays: each window's rows (made
at once from sim/rows.py's shapes over arrays, in order), its gradient requests and release slots, the wakes counted
and the message ids taken, among the run's own events (the evaluator's, run.until's) in the driver's queue. Its tensor
work reads the plan's arrays too (``RoundWork``: round by round where the gradients are batch-invariant, else in lock
steps that keep the engine's gradient batches). Admitted (``admits``) where a message's fate is the lean links' (no
link model, churn or time-varying topology), payloads of declared size and no local steps, the run ends at run.until
or at a round limit (not both: then the last program's finish stops it, and what was scheduled after that is cut,
``Plan._order``), with no checkpoint, no payloads record and no stop on divergence, and the plan, held whole, fits
(``ROWS_MAX``); elsewhere the event-by-event control plays the run (rounds/barrier_windows.py). A round of K exchanges
(Muffliato's gossip steps) is K rounds of the recurrence, in the message round k * K + s: a later exchange's sends are
made in the completion of the barrier before (``Plan._sender``), and the mixing record is written from the planned
``combine``s (``Batch.take_mix_rows``).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools

import numpy as np
import torch

from netsim.rounds.kernel import AnyRound, Arrivals, Batch, RowViews, as_index
from netsim.rounds.lookahead import ACT, ARR, DONE, EVAL, STOP, UNTIL
from netsim.sim import rows as shapes
from netsim.sim.agent import ComputeTimes, Wakes
from netsim.sim.graph_arrays import spans
from netsim.sim.network import Broadcasts, payload_size
from netsim.sim.rows import CODES
from netsim.trace.events import Stale
from netsim.trace.events import row as event_row
from netsim.trace.io import RECORD, RECORD_DTYPE

TIMER, BARRIER, SENT = 7, 8, 9  # (barrier_windows' event kinds)
ROOT = -1
COMBINE, ASK, LOCAL = 0, 1, 2  # (barrier_windows' operation kinds)
_R = RECORD.size
# the plan's event types (their order in its tables)
E_ACT, E_DONE, E_ARR, E_TIMER, E_SENT, E_BAR = range(6)
_OP = np.array([ASK, LOCAL, -1, -1, -1, COMBINE], np.int64)  # each event type's tensor operation
_PHASE = np.array([0, 1, 3, 3, 3, 2], np.int64)  # ... and its place in a round (point, local, combine)
_KIND = (ACT, DONE, ARR, TIMER, SENT, BARRIER)


ROWS_MAX = 4_000_000  # the trace rows a plan may hold (~150 bytes each with its tables): a longer run, event by event


def admits(d) -> bool:
    """Whether barrier driver ``d``'s run can be planned (the module docstring), and its plan, held whole, fits:
    about ``ROWS_MAX`` rows at most (a round's activation, completion and gather rows, a send and a delivery per
    link, for each tick of the agents' clocks to run.until, or each round to the limit)."""
    from netsim.rounds.sync import _local_steps

    ctx = d.ctx
    sc = ctx.sim.world.scenario
    limit = sc.run.rounds
    if not (ctx.sim.loop.programs.between is None and not ctx.checkpoints and (ctx.until is None) != (limit is None)
            and not sc.run.stop_on_divergence
            and ctx.net.model is None and ctx.churn is None and ctx.dynamic is None
            and d.store.fixed is not None and d.records.views is None and not _local_steps(ctx.kernel)):
        return False
    act = sc.agents.activation
    ticks = limit if ctx.until is None else \
        (ctx.until - float(d.events.now)) * (act.rate if act.kind == "poisson" else 1.0 / act.period)
    links = sum(len(a.neighbors) for a in ctx.agents)
    return (ticks + 1) * d.work.steps * (4 * len(ctx.agents) + 2 * links) <= ROWS_MAX


class _Table:
    """One event type's columns, appended a round at a time (``add``) and joined at the end (``done``)."""

    def __init__(self, *names: str):
        self.names = names
        self.parts: dict[str, list] = {n: [] for n in names}
        self.n = 0

    def add(self, **cols) -> int:
        """Append a round's rows; returns the first one's index."""
        first = self.n
        for name, v in cols.items():
            self.parts[name].append(np.asarray(v))
        self.n += len(next(iter(cols.values())))
        return first

    def done(self) -> None:
        for name, parts in self.parts.items():
            setattr(self, name, np.concatenate(parts) if parts else np.zeros(0))
        del self.parts


class _Events:
    """The plan's events by type (``act``, ``done``, ``arr``, ``timer``, ``sent``, ``bar``), each link's outcome
    (``link``), the senders each barrier took (``took``: its slice), the messages discarded at a gather
    (``discards``) and the arrivals discarded as stale (``stale_at``)."""

    def __init__(self):
        self.act = _Table("t", "agent", "k", "at", "rnd", "ct", "tick")
        self.done = _Table("t", "agent", "k", "l0", "deg", "held", "bar")
        self.link = _Table("dst", "delay", "reason")
        self.arr = _Table("t", "agent", "src", "k", "sub", "sent", "lid")
        self.timer = _Table("t", "agent", "k", "missing")
        self.sent = _Table("t", "agent", "k")
        self.bar = _Table("t", "agent", "k", "ctype", "cidx", "took", "ntook", "fin")
        self.took: list[int] = []
        self.discards: dict[tuple[int, int], list] = {}  # (type, row) of a gather -> messages discarded there
        self.stale_at: set[int] = set()


class _Rounds:
    """Per round k, by agent (what ``Plan.time`` and ``Plan.parent`` read at equal times): ``A`` activations, ``D``
    completions, ``G`` gathers, ``tx`` whether the gather is an event of its own, ``narr`` the arrivals a completion
    scheduled, ``C`` the barriers' (times, cause types, cause rows), ``R`` the arrivals (senders, ranks, times)."""

    def __init__(self):
        self.A, self.D, self.G, self.tx, self.narr, self.C, self.R = [], [], [], [], [], [], []


class Plan:
    """The run's control from its start to run.until (the module docstring): the events of each type (``act``,
    ``done``, ``arr``, ``timer``, ``sent``, ``bar``), each link's outcome (``link``), then ``etype`` and ``eidx``
    (every event in simpy's order: its type and row), ``rows`` (their trace rows, packed, in that order) and
    ``first_row`` (each event's first row); ``times``: every scheduled event's time, sorted (the window loop's)."""

    def __init__(self, d):
        ctx = d.ctx
        agents = ctx.agents
        n = self.n = len(agents)
        U = self.U = np.inf if ctx.until is None else ctx.until  # (to a round limit: cut at its stop, ``_order``)
        limit = self.limit = ctx.sim.world.scenario.run.rounds
        T = self.T = ctx.p.round_timeout
        K = self.K = d.work.steps  # exchanges a round: message round k * K + s is the plan's round (``_Control``'s)
        self.every = ctx.sim.world.scenario.evaluation.every
        self.t0 = now0 = float(d.events.now)
        size = self.size = d.store.fixed
        words = d.rows.words
        compute = ComputeTimes(agents, ahead=32)
        nb = [a.neighbors for a in agents]
        links = Broadcasts(ctx.net, nb)
        loss = words(shapes.TEXT.loss)
        deg = np.array([len(x) for x in nb], np.int64)
        ptr = np.concatenate(([0], np.cumsum(deg)))
        nb_flat = np.array([j for x in nb for j in x], np.int64)
        expect = np.array([len(a.in_neighbors) for a in agents], np.int64)
        self.ev, self.per = _Events(), _Rounds()
        times = []
        rnd = np.frombuffer(ctx.sim.loop.counts.rounds, np.int64).copy()
        A = np.empty(n)
        AT = np.empty(n)
        wakes = Wakes(agents, ahead=32)
        AT[:], delay = wakes(np.arange(n), np.full(n, now0))  # each program's first wake, in agent order
        A[:] = now0 + delay  # (``WindowDriver._windows``)
        rnd += 1
        times.append(A.copy())
        alive = np.ones(n, bool)  # its next activation is processed
        alive &= A <= U  # (at U: processed, its parent being the start)
        left: list[list] = [[] for _ in range(n)]  # messages of earlier rounds neither taken nor discarded
        has_left = np.zeros(n, bool)
        k = 0
        link_base = 0
        # an exchange after a round's first: who sends (at its last barrier's completion), when, and that barrier's row
        nxt, nxt_t, nxt_bar = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        while alive.any() or len(nxt):
            if k % K == 0:  # the activations, their compute times, the completions that send
                act = np.flatnonzero(alive)
                At = A[act]
                ct = compute([agents[i] for i in act.tolist()], act, At)
                self.ev.act.add(t=At, agent=act, k=np.full(len(act), k), at=AT[act], rnd=rnd[act].copy(), ct=ct,
                                tick=[agents[i].schedule.tick for i in act.tolist()])
                Dt = At + ct
                times.append(Dt)
                pd = (Dt < U) | ((Dt == U) & (At < U))
                ids, Dd, by_bar = act[pd], Dt[pd], np.full(int(pd.sum()), -1, np.int64)
            else:  # ``combine`` sends the next exchange's payload in its barrier's completion
                ids, Dd, by_bar = nxt, nxt_t, nxt_bar
            Dk = np.full(n, np.nan)
            Dk[ids] = Dd
            delay, lost, hold = links(ids, Dd, size)  # the broadcasts (``Agent.broadcast``), as arrays
            g = deg[ids]
            m = int(g.sum())
            starts = np.cumsum(g) - g
            dst = nb_flat[spans(ptr[ids], g)]
            reason = np.where(lost, loss, 0)
            self.ev.link.add(dst=dst, delay=delay, reason=reason)
            ok = reason == 0
            src = np.repeat(ids, g)
            Dl = np.repeat(Dd, g)
            cs = np.cumsum(ok) - ok  # each kept message's rank among its sender's kept ones
            sub = cs - np.repeat(cs[starts] if m else starts, g)
            held = np.add.reduceat(ok, starts) if m else np.zeros(len(ids), np.int64)
            held[g == 0] = 0
            self.ev.done.add(t=Dd, agent=ids, k=np.full(len(ids), k), l0=link_base + starts, deg=g, held=held,
                             bar=by_bar)  # (``bar`` >= 0: not an event, its sends are that barrier completion's)
            tx = hold > 0
            Gd = np.where(tx, Dd + hold, Dd)
            times.append(Gd[tx])
            Gk = np.full(n, np.nan)
            Gk[ids] = Gd
            txk = np.zeros(n, bool)
            txk[ids] = tx
            narr = np.zeros(n, np.int64)
            narr[ids] = held
            self.per.A.append(A.copy()), self.per.D.append(Dk), self.per.G.append(Gk), self.per.tx.append(txk)
            self.per.narr.append(narr)
            # the arrivals (kept messages)
            ms, md, mR, msub = src[ok], dst[ok], Dl[ok] + delay[ok], sub[ok]
            mlid = (link_base + np.arange(m))[ok]
            link_base += m
            times.append(mR)
            self.per.R.append((ms, msub, mR))
            proc = (mR < U) | ((mR == U) & (Dl[ok] < U))
            first_arr = self.ev.arr.add(t=mR[proc], agent=md[proc], src=ms[proc], k=np.full(int(proc.sum()), k),
                                     sub=msub[proc], sent=Dl[ok][proc], lid=mlid[proc])
            arr_row = np.full(len(mR), -1)
            arr_row[proc] = first_arr + np.arange(int(proc.sum()))
            # the gathers that are events of their own (the broadcast's transmission ends)
            gp = tx & ((Gd < U) | ((Gd == U) & (Dd < U)))
            first_sent = self.ev.sent.add(t=Gd[gp], agent=ids[gp], k=np.full(int(gp.sum()), k))
            sent_row = np.full(n, -1)
            sent_row[ids[gp]] = first_sent + np.arange(int(gp.sum()))
            done_row = np.full(n, -1)
            done_row[ids] = self.ev.done.n - len(ids) + np.arange(len(ids))
            gathers = ids[~tx | gp]  # (a gather in its completion's processing, or at its transmission's end)
            # each receiver's messages of this round, in arrival order
            o = np.lexsort((mR, md))
            md_o, mR_o = md[o], mR[o]
            cnt = np.bincount(md, minlength=n)
            rstart = np.concatenate(([0], np.cumsum(cnt)))[:-1]
            rmax = np.full(n, -np.inf)
            np.maximum.at(rmax, md, mR)
            dup = np.zeros(n, bool)
            same = (md_o[1:] == md_o[:-1]) & (mR_o[1:] == mR_o[:-1])
            dup[md_o[1:][same]] = True
            at_g = np.zeros(n, bool)
            np.logical_or.at(at_g, md, (mR == Gk[md]) | (mR == Gk[md] + T) | (mR >= U))
            # barriers played as arrays: no two times equal, all before run.until; with older messages left, where none
            # of theirs is equal to another time the barrier meets (``_older``)
            tmo = Gk + T
            fast = np.zeros(n, bool)
            fast[gathers] = True
            fast &= ~dup & ~at_g & (tmo < U)
            for j in np.flatnonzero(fast & has_left).tolist():
                full_j = cnt[j] == expect[j] and rmax[j] < tmo[j]
                fast[j] = self._older(j, float(Gk[j]), float(rmax[j]) if full_j else float(tmo[j]),
                                      set(mR_o[rstart[j]:rstart[j] + cnt[j]].tolist()) | {float(tmo[j])}, left,
                                      has_left, (E_SENT, int(sent_row[j])) if txk[j] else (E_DONE, int(done_row[j])))
            full = fast & (cnt == expect) & (rmax < tmo)
            late = fast & ~full
            fg = np.flatnonzero(full)
            # complete: at the gather (every message queued before it) or at the last arrival
            cg = Gk[fg]
            last = rmax[fg]
            by_gather = last < cg
            C = np.where(by_gather, cg, last)
            # timed out: the timer's row with the missing count; the messages after it wait for a later barrier
            lg = np.flatnonzero(late)
            before_t = np.zeros(n, np.int64)
            inb = mR < tmo[md]
            np.add.at(before_t, md[inb], 1)
            first_timer = self.ev.timer.add(t=tmo[lg], agent=lg, k=np.full(len(lg), k),
                                         missing=(expect[lg] - before_t[lg]).astype(np.float64))
            times.append(tmo[np.flatnonzero(fast & ~(full & (rmax < Gk)))])
            cols = (mR, ms, msub, mlid, arr_row)  # (the round's messages, for ``_msg``)
            if len(lg):
                after = np.flatnonzero(late[md] & ~inb)
                for q in after.tolist():
                    j = int(md[q])
                    left[j].append(_msg(cols, k, q))
                    has_left[j] = True
            # the barriers' completions, their causes and what each took
            cause_type = np.full(n, -1)
            cause_idx = np.full(n, -1)
            cause_t = np.full(n, np.nan)
            cause_type[fg] = np.where(by_gather, np.where(txk[fg], E_SENT, E_DONE), E_ARR)
            cause_t[fg] = C
            # the last arrival of each complete barrier: its row
            last_q = np.full(n, -1)
            if len(o):
                ends = rstart + cnt - 1
                has = cnt > 0
                last_q[has] = o[ends[has]]
            cause_idx[fg] = np.where(by_gather, np.where(txk[fg], sent_row[fg], done_row[fg]), arr_row[last_q[fg]])
            cause_type[lg] = E_TIMER
            cause_idx[lg] = first_timer + np.arange(len(lg))
            cause_t[lg] = tmo[lg]
            # what each fast barrier took: its messages before its timer, in arrival order (``took``: slices)
            msel = np.flatnonzero(fast[md_o] & (mR_o < tmo[md_o]))
            took_n = np.bincount(md_o[msel], minlength=n)
            took_at = len(self.ev.took) + np.cumsum(took_n) - took_n
            self.ev.took += ms[o[msel]].tolist()
            # the other barriers, one by one (older messages left, equal times, run.until)
            slow = [j for j in gathers.tolist() if not fast[j]]
            if slow:
                mine: dict[int, list] = {}
                for q in np.flatnonzero(~fast[md]).tolist():
                    mine.setdefault(int(md[q]), []).append(_msg(cols, k, q))
                timers: list[tuple] = []
                for j in slow:
                    ge_type = E_SENT if txk[j] else E_DONE
                    ge_row = sent_row[j] if txk[j] else done_row[j]
                    cause, got = self._barrier(j, k, float(Gk[j]), int(expect[j]), mine.get(j, []), left, has_left,
                                               ge_type, int(ge_row), times, timers)
                    if cause is not None:
                        cause_t[j], (cause_type[j], cause_idx[j]) = cause
                        took_at[j], took_n[j] = len(self.ev.took), len(got)
                        self.ev.took += got
                if timers:
                    tt, tj, tm = zip(*timers)
                    self.ev.timer.add(t=tt, agent=tj, k=np.full(len(tt), k), missing=tm)
            self.per.C.append((cause_t, cause_type, cause_idx))
            # the completions processed before the stop (one at run.until: if its cause came before), then the wakes
            alive[:] = False
            fin = ~np.isnan(cause_t)
            at_u = np.flatnonzero(fin & (cause_t == U))
            for j in at_u.tolist():
                fin[j] = self.time(self.parent((BARRIER, k, j))[0]) < U
            w = np.flatnonzero(fin & (cause_t <= U))
            nxt = nxt_t = nxt_bar = np.zeros(0, np.int64)
            last = k % K == K - 1  # the round's last exchange: the next wake or the finish
            if len(w):
                ends = rnd[w] >= limit if last and limit is not None else np.zeros(len(w), bool)  # (``Agent.wake``)
                first_bar = self.ev.bar.add(t=cause_t[w], agent=w, k=np.full(len(w), k), ctype=cause_type[w],
                                            cidx=cause_idx[w], took=took_at[w], ntook=took_n[w],
                                            fin=np.where(ends, rnd[w], 0))
                if not last:
                    nxt, nxt_t, nxt_bar = w, cause_t[w], first_bar + np.arange(len(w))
                else:
                    w = w[~ends]
                    c = cause_t[w]
                    ats, delay = wakes(w, c)  # each program's next wake (``Agent.wake``)
                    wt = c + delay
                    A[w], AT[w] = wt, ats
                    rnd[w] += 1
                    times.append(wt)
                    alive[w] = (wt < U) | ((wt == U) & (c < U))
            k += 1
        links.close()
        for t in (self.ev.act, self.ev.done, self.ev.link, self.ev.arr, self.ev.timer, self.ev.sent, self.ev.bar):
            t.done()
        self.rounds = k
        self.times = np.sort(np.concatenate([np.asarray(x, np.float64).ravel() for x in times]))
        self._order()
        if self.stop is not None:
            self.times = self.times[:np.searchsorted(self.times, self.stop, "right")]
        self._pack(words, ctx.net.take_ids(0), ctx.tag_code)

    def _older(self, j: int, g: float, c: float, met: set, left: list, has_left: np.ndarray, gather: tuple) -> bool:
        """The older messages left for agent j's barrier, gathered at ``g`` and complete at ``c`` (its last message's
        arrival, at or before the gather; or its timer), as ``_barrier`` plays them, where none arrives at a time
        in ``met`` (its round's arrivals, its timer), at ``g`` or ``c``, or with another: those queued before it
        completes are discarded at the gather (after its rows, in arrival order), those arriving while it is open at
        their arrival, the rest stay. False (nothing done): it is played message by message."""
        old = sorted(left[j])
        ts = [m[0] for m in old]
        if len(set(ts) | met | {g, c}) != len(ts) + len(met | {g, c}):
            return False
        if c <= g:  # complete at the gather: the queue offered in arrival order up to its last message
            cut = bisect.bisect_left(ts, c)
            gone, still = old[:cut], old[cut:]
        else:
            cut, end = bisect.bisect_left(ts, g), bisect.bisect_left(ts, c)
            gone, still = old[:cut], old[end:]
            self.ev.stale_at.update(m[5] for m in old[cut:end])
        if gone:
            self.ev.discards[gather] = gone
        left[j] = still
        has_left[j] = bool(still)
        return True

    def _barrier(self, j, k, g, expect, mine, left, has_left, ge_type, ge_row, times, timers):
        """Agent j's barrier of round k, gathered at ``g``, played message by message with simpy's order at equal
        times: ((its completion's time, (cause type, row)) or None, the senders it took in arrival order). Adds the
        timer's row (``timers``: added after the round's), the discards at the gather and at arrivals while it is open;
        keeps the rest in ``left``."""
        U, T = self.U, self.T
        ge = (SENT, k, j) if ge_type == E_SENT else self._sender(k, j)
        before = self.before
        old = left[j]

        def arrived_before(m, e, te) -> bool:  # message m processed before event e (at time te)
            return m[0] < te or (m[0] == te and before((ARR, m[1], m[2], m[3]), e))

        queued = [m for m in old + mine if arrived_before(m, ge, g)]
        if len(queued) > 1:
            queued = self._arrival_order(queued)
        inq = set(queued)
        got: dict = {}
        cause = None
        discards, rest = [], []
        for idx, m in enumerate(queued):  # the queue offered in arrival order (``_Gather.offer``)
            if m[1] == k:
                got[m[2]] = m
                if len(got) == expect:
                    cause = (g, (ge_type, ge_row))
                    rest = [q for q in queued[idx + 1:] if q[1] < k]
                    break
            elif m[1] < k:
                discards.append(m)
        if discards:
            self.ev.discards[(ge_type, ge_row)] = discards
        if not expect:
            cause = (g, (ge_type, ge_row))
        cause_h = ge if cause is not None else None
        if cause is None:  # arrivals while it is open, in arrival order, until its timer
            tmo = g + T
            times.append([tmo])
            timer = (TIMER, k, j)
            live = [m for m in mine if m not in inq]
            if len(live) > 1:
                live = self._arrival_order(live)
            timer_processed = tmo < U or (tmo == U and g < U)
            for m in live:  # (taken while processed: before its timer and before the stop)
                r = m[0]
                if not (r < U or (r == U and self.per.D[k][m[2]] < U)) \
                        or not (r < tmo or (r == tmo and before((ARR, m[1], m[2], m[3]), timer))):
                    break
                got[m[2]] = m
                if len(got) == expect:
                    cause = (r, (E_ARR, m[5]))
                    cause_h = (ARR, m[1], m[2], m[3])
                    break
            if cause is None and timer_processed:
                row = self.ev.timer.n + len(timers)
                timers.append((tmo, j, float(expect - len(got))))
                cause = (tmo, (E_TIMER, row))
                cause_h = timer
        still = rest
        tc = None if cause_h is None else cause[0]
        for m in old:  # older messages arriving while it is open: discarded at their arrival (after its row)
            if m in inq:
                continue
            # (open to the stop: every arrival it processes; m[5] < 0: not processed)
            if m[5] >= 0 and (cause_h is None or arrived_before(m, cause_h, tc)):
                self.ev.stale_at.add(m[5])
            else:
                still.append(m)
        taken = set(got.values())
        still += [m for m in mine if m not in inq and m not in taken]
        left[j] = still
        has_left[j] = bool(still)
        return cause, list(got)

    def _arrival_order(self, ms: list) -> list:
        ms = sorted(ms)
        if any(a[0] == b[0] for a, b in zip(ms, ms[1:])):  # messages at one instant: in simpy's order
            ms.sort(key=functools.cmp_to_key(
                lambda a, b: -1 if self.before((ARR,) + a[1:4], (ARR,) + b[1:4]) else 1))
        return ms

    # an event's time and parent (the order of equal times) -----------------------------------------------------
    def time(self, e) -> float:
        kind = e[0]
        if kind == ACT:
            return float(self.per.A[e[1]][e[2]])
        if kind == DONE:
            return float(self.per.D[e[1]][e[2]])
        if kind == ARR:
            r = self.per.R[e[1]]
            if type(r) is tuple:  # (made on first use: equal times are rare)
                r = self.per.R[e[1]] = dict(zip(zip(r[0].tolist(), r[1].tolist()), r[2].tolist()))
            return r[(e[2], e[3])]
        if kind == SENT:
            return float(self.per.G[e[1]][e[2]])
        if kind == TIMER:
            return float(self.per.G[e[1]][e[2]]) + self.T
        if kind == BARRIER:
            return float(self.per.C[e[1]][0][e[2]])
        if kind == UNTIL or kind == STOP:
            return self.U
        if kind == EVAL:
            t = self.t0
            for _ in range(e[1]):
                t = t + self.every
            return t
        return -np.inf  # ROOT

    def parent(self, e) -> tuple:
        """(the event that scheduled ``e``, ``e``'s rank among what that event scheduled)."""
        kind = e[0]
        if kind == ACT:
            k, i = e[1], e[2]
            return ((ROOT,), 1 + i) if k == 0 else ((BARRIER, k - 1, i), 0)
        if kind == DONE:
            return (ACT, e[1], e[2]), 0
        if kind == ARR:
            return self._sender(e[1], e[2]), e[3]
        if kind == SENT:
            return self._sender(e[1], e[2]), int(self.per.narr[e[1]][e[2]])
        if kind == TIMER:
            k, i = e[1], e[2]
            return ((SENT, k, i), 0) if self.per.tx[k][i] else (self._sender(k, i), int(self.per.narr[k][i]))
        if kind == BARRIER:
            k, i = e[1], e[2]
            ct = int(self.per.C[k][1][i])
            cause = self.handle(ct, int(self.per.C[k][2][i]))
            return (cause, int(self.per.narr[k][i])) if ct == E_DONE else (cause, 0)
        if kind == UNTIL:
            return (ROOT,), 0
        if kind == STOP:
            return (UNTIL,), 0
        if kind == EVAL:
            return ((ROOT,), 1 + self.n) if e[1] == 1 else ((EVAL, e[1] - 1), 0)
        raise ValueError(f"barrier plan: no parent for {e}")

    def _sender(self, k: int, i: int) -> tuple:
        """The event in which agent i sends its round-k messages: its completion, or in a round's later exchanges the
        completion of its barrier before."""
        return (DONE, k, i) if k % self.K == 0 else (BARRIER, k - 1, i)

    def handle(self, etype: int, row: int) -> tuple:
        """Event (type, row) as (kind, round, agent[, rank])."""
        if etype == E_DONE:
            return self._sender(int(_col(self.ev.done, "k", row)), int(_col(self.ev.done, "agent", row)))
        if etype == E_BAR:
            return (BARRIER, int(_col(self.ev.bar, "k", row)), int(_col(self.ev.bar, "agent", row)))
        if etype == E_ARR:
            a = self.ev.arr
            return (ARR, int(_col(a, "k", row)), int(_col(a, "src", row)), int(_col(a, "sub", row)))
        tab = (self.ev.act, self.ev.done, None, self.ev.timer, self.ev.sent)[etype]
        return (_KIND[etype], int(_col(tab, "k", row)), int(_col(tab, "agent", row)))

    def before(self, a, b) -> bool:
        """Whether event ``a`` is processed before event ``b`` (simpy's order: time, then insertion)."""
        while True:
            ta, tb = self.time(a), self.time(b)
            if ta != tb:
                return ta < tb
            if a == b:
                return False
            (pa, ia), (pb, ib) = self.parent(a), self.parent(b)
            if pa == pb:
                return ia < ib
            a, b = pa, pb

    # the events in simpy's order, and their rows --------------------------------------------------------------
    def _order(self) -> None:
        """``etype``, ``eidx``: every event in simpy's order, which is the order of (time, its parent's place in this
        order, its rank among what its parent scheduled): each event's parent and rank found as arrays, then sorted by
        those keys again until no parent moves (as many times as events of one instant descend from each other)."""
        ev, n = self.ev, self.n
        tabs = (ev.act, ev.done, ev.arr, ev.timer, ev.sent, ev.bar)
        base = np.cumsum([0] + [tab.n for tab in tabs])
        t = np.concatenate([tab.t for tab in tabs])
        parent = np.full(len(t), -1, np.int64)
        rank = np.zeros(len(t), np.int64)

        def rows(tab):  # (round, agent) -> the table's row
            key = tab.k.astype(np.int64) * n + tab.agent
            o = np.argsort(key, kind="stable")
            return lambda k, i: o[np.searchsorted(key[o], k * n + i)]

        act_of, done_of = rows(ev.act), rows(ev.done)
        sent_of, bar_of = rows(ev.sent), rows(ev.bar)
        held = ev.done.held
        # each send's event: a completion, or (a later exchange's) the completion of the barrier before, which is
        # then the parent of what it schedules; those sends are not events of their own
        by_bar = ev.done.bar >= 0
        sender = base[E_DONE] + np.arange(ev.done.n)
        sender[by_bar] = base[E_BAR] + ev.done.bar[by_bar]
        events = np.ones(len(t), bool)
        events[base[E_DONE] + np.flatnonzero(by_bar)] = False
        # activations: the first by the start (in agent order), the others by the barrier before
        a = ev.act
        first = a.k == 0
        rank[base[E_ACT]:base[E_ACT + 1]] = np.where(first, 1 + a.agent, 0)
        later = np.flatnonzero(~first)
        parent[base[E_ACT] + later] = base[E_BAR] + bar_of(a.k[later] - 1, a.agent[later])
        # completions by their activations; arrivals, then the transmission's end, by their completions
        d = ev.done
        real = np.flatnonzero(~by_bar)
        parent[base[E_DONE] + real] = base[E_ACT] + act_of(d.k[real], d.agent[real])
        r = ev.arr
        parent[base[E_ARR]:base[E_ARR + 1]] = sender[done_of(r.k, r.src)]
        rank[base[E_ARR]:base[E_ARR + 1]] = r.sub
        s_ = ev.sent
        dr = done_of(s_.k, s_.agent)
        parent[base[E_SENT]:base[E_SENT + 1]] = sender[dr]
        rank[base[E_SENT]:base[E_SENT + 1]] = held[dr]
        # timers by their gathers (the transmission's end, else the send's event after its arrivals)
        m = ev.timer
        if m.n:
            dr = done_of(m.k, m.agent)
            par, rk = sender[dr], held[dr].copy()
            w = np.flatnonzero(np.stack(self.per.tx)[m.k, m.agent])
            if len(w):
                par[w], rk[w] = base[E_SENT] + sent_of(m.k[w], m.agent[w]), 0
            parent[base[E_TIMER]:base[E_TIMER + 1]], rank[base[E_TIMER]:base[E_TIMER + 1]] = par, rk
        # barriers' completions by their causes (a completion's: after its arrivals)
        b = ev.bar
        at_done = b.ctype == E_DONE
        parent[base[E_BAR]:base[E_BAR + 1]] = np.where(at_done, sender[np.where(at_done, b.cidx, 0)],
                                                       base[b.ctype] + b.cidx)
        rank[base[E_BAR]:base[E_BAR + 1]][at_done] = held[b.cidx[at_done]]
        # sorted by (time, parent's place, rank) until the places settle: only events that share their time move, each
        # within its instant's places, and only at instants where a parent moved in the pass before
        cand = np.flatnonzero(events)
        o = cand[np.argsort(t[cand], kind="stable")]
        pos = np.full(len(t), -1, np.int64)
        pos[o] = np.arange(len(o))
        ts = t[o]
        eq = ts[1:] == ts[:-1]
        slots = np.flatnonzero(np.concatenate(([False], eq)) | np.concatenate((eq, [False])))  # (in time order)
        group = np.cumsum(np.concatenate(([True], ~eq)))[slots]  # each one's instant
        moved = np.zeros(len(t), bool)
        for n in range(256):
            e = o[slots]
            p = parent[e]
            stir = group if n == 0 else group[(p >= 0) & moved[np.maximum(p, 0)]]  # (at first: every instant)
            moved[:] = False
            if not len(stir):
                break
            at = np.isin(group, stir)
            e = e[at]
            pp = np.where(parent[e] >= 0, pos[np.maximum(parent[e], 0)], -1)
            e2 = e[np.lexsort((rank[e], pp, group[at]))]
            changed = e2 != e
            if not changed.any():
                break
            moved[e2[changed]] = True
            o[slots[at]] = e2
            pos[e2] = slots[at]
        else:
            raise RuntimeError("barrier plan: the order of simultaneous events did not settle")
        ppos = np.where(parent >= 0, pos[np.maximum(parent, 0)], -1)
        self.stop = None
        if self.limit is not None:  # the run stops after its last finish: what it had scheduled by then is processed
            fin = base[E_BAR] + np.flatnonzero(b.fin > 0)
            last = fin[np.argmax(pos[fin])]
            self.stop = float(t[last])
            kept = (t[o] < self.stop) | ((t[o] == self.stop) & (ppos[o] < pos[last]))  # (sorted: a prefix)
            cut = int(kept.sum())
            if not ((o[cut:] >= base[E_ARR]) & (o[cut:] < base[E_ARR + 1])).all():
                raise RuntimeError("barrier plan: an event other than an arrival comes after the run's stop")
            o = o[:cut]
        ty = np.searchsorted(base, o, "right") - 1
        self.etype, self.eidx, self.etime = ty, o - base[ty], t[o]

    def _pack(self, words, mid0: int, tag: int) -> None:
        """Every event's trace rows, packed in order (``rows``), and each event's first row (``first_row``); the
        message ids (each link's, taken from ``mid0`` on in the order of the completions) are in the rows."""
        C = CODES
        et, ei = self.etype, self.eidx
        ev = self.ev
        act, done, link, arr, timer, sent = ev.act, ev.done, ev.link, ev.arr, ev.timer, ev.sent
        nlinks = link.n
        drops = (link.reason != 0).astype(np.int64)
        # the events that send: each completion, and each barrier's completion that sends the next exchange's
        # messages (its row of ``done``: ``srow``)
        srow = np.full(len(et), -1, np.int64)
        m_done = et == E_DONE
        srow[m_done] = ei[m_done]
        by_bar = np.flatnonzero(done.bar >= 0)
        if len(by_bar):
            bar_sends = np.full(ev.bar.n, -1, np.int64)
            bar_sends[done.bar[by_bar]] = by_bar
            mb = np.flatnonzero(et == E_BAR)
            srow[mb] = bar_sends[ei[mb]]
        sp = np.flatnonzero(srow >= 0)
        d_order = srow[sp]
        # message ids: each send event's links, in order
        mid = np.empty(nlinks, np.int64)  # (consecutive along the send events' links, in their order)
        if nlinks:
            lens = done.deg[d_order]
            lid = spans(done.l0[d_order], lens)
            mid[lid] = mid0 + np.arange(len(lid))
        # rows an event makes
        cnt = np.zeros(len(et), np.int64)
        drops_of = np.add.reduceat(drops, done.l0) if done.n and nlinks else np.zeros(done.n, np.int64)
        if done.n and nlinks:
            drops_of[done.deg == 0] = 0
        stale_arr = np.zeros(arr.n, np.int64)
        if self.ev.stale_at:
            stale_arr[np.fromiter(self.ev.stale_at, np.int64)] = 1
        disc = np.zeros(len(et), np.int64)
        pos_of = {}  # (type, row) of a gather with discards -> its place in the order
        if self.ev.discards:
            for ty in (E_DONE, E_SENT):
                rows_ = [r for (t_, r) in self.ev.discards if t_ == ty]
                if rows_:
                    inv = np.full((done if ty == E_DONE else sent).n, -1, np.int64)
                    if ty == E_DONE:
                        inv[d_order] = sp
                    else:
                        mk = np.flatnonzero(et == ty)
                        inv[ei[mk]] = mk
                    pos_of.update(((ty, r), int(inv[r])) for r in rows_)
        m_act, m_arr, m_timer = (et == e for e in (E_ACT, E_ARR, E_TIMER))
        m_fin = np.flatnonzero(et == E_BAR)
        m_fin = m_fin[ev.bar.fin[ei[m_fin]] > 0]  # the barriers after which a program finishes
        cnt[m_act] = 2
        cnt[m_fin] = 1
        cnt[m_done] = 1
        cnt[sp] += done.deg[d_order] + drops_of[d_order]
        cnt[m_arr] = 1 + stale_arr[ei[m_arr]]
        cnt[m_timer] = 1
        for key, ms in self.ev.discards.items():
            disc[pos_of[key]] += len(ms)
        cnt += disc
        first_row = np.concatenate(([0], np.cumsum(cnt)))
        self.first_row = first_row
        out = np.zeros(int(first_row[-1]), RECORD_DTYPE)
        cols = [out[name] for name in out.dtype.names]  # (COLUMNS' order: the shapes' fields)

        def put(at, row: tuple) -> None:  # a shape of sim/rows.py over arrays, its strings as the trace's codes
            shapes.fill(cols, at, tuple(words(v) if isinstance(v, str) else v for v in row))

        def stale(at, t, agent, peer, msg, rnd) -> None:  # a message discarded as stale (``Stale``'s row)
            put(at, event_row(Stale(t, agent, peer, msg, rnd)))

        # activations: ``activate`` and ``compute_start``
        q = first_row[:-1][m_act]
        r = ei[m_act]
        put(q, shapes.activate(act.t[r], act.agent[r], act.at[r], act.rnd[r], C))
        put(q + 1, shapes.compute_start(act.t[r], act.agent[r], act.ct[r], C))
        # completions: ``compute_end``; then at each send event each link's ``send`` (and ``drop``)
        r = ei[m_done]
        put(first_row[:-1][m_done], shapes.compute_end(done.t[r], done.agent[r], C))
        q = first_row[sp] + (et[sp] == E_DONE)
        r = d_order
        if nlinks:
            lens = done.deg[r]
            lid = spans(done.l0[r], lens)
            owner = np.repeat(np.arange(len(r)), lens)
            dr = drops[lid]
            # a link's row: after the completion's row and the links before it in the broadcast (a dropped one: two)
            w = 1 + dr
            cum = np.cumsum(w) - w
            first_l = np.cumsum(lens) - lens
            within = cum - np.repeat(cum[np.minimum(first_l, len(cum) - 1)], lens)
            at = q[owner] + within
            src, t, k = done.agent[r][owner], done.t[r][owner], done.k[r][owner]
            dst, m_, dl = link.dst[lid], mid[lid], link.delay[lid]
            put(at, shapes.send(t, src, dst, m_, self.size, dl, k, tag, C))
            dq = np.flatnonzero(dr)
            put(at[dq] + 1, shapes.drop(t[dq], src[dq], dst[dq], m_[dq], self.size, dl[dq], k[dq],
                                        link.reason[lid][dq], C))
        # deliveries (and a discard at arrival)
        q = first_row[:-1][m_arr]
        r = ei[m_arr]
        put(q, shapes.deliver(arr.t[r], arr.agent[r], arr.src[r], mid[arr.lid[r]], self.size, arr.sent[r], arr.k[r],
                              tag, C))
        sq = np.flatnonzero(stale_arr[r])
        rs = r[sq]
        stale(q[sq] + 1, arr.t[rs], arr.agent[rs], arr.src[rs], mid[arr.lid[rs]], arr.k[rs])
        # timeouts
        q = first_row[:-1][m_timer]
        r = ei[m_timer]
        put(q, shapes.timeout(timer.t[r], timer.agent[r], timer.k[r], timer.missing[r], C))
        # finishes
        r = ei[m_fin]
        put(first_row[m_fin], shapes.finish(ev.bar.t[r], ev.bar.agent[r], ev.bar.fin[r], C))
        # discards at a gather, after the gather's other rows
        if self.ev.discards:
            at, tg, j, src, lid, rnd = [], [], [], [], [], []
            for (etype, row), ms in self.ev.discards.items():
                tab = done if etype == E_DONE else sent
                end = int(first_row[pos_of[(etype, row)] + 1])
                at += range(end - len(ms), end)
                tg += [tab.t[row]] * len(ms)
                j += [tab.agent[row]] * len(ms)
                src += [m[2] for m in ms]
                lid += [m[4] for m in ms]
                rnd += [m[1] for m in ms]
            stale(np.array(at), np.array(tg), np.array(j), np.array(src), mid[np.array(lid)], np.array(rnd))
        self.rows = out.view(np.uint8).reshape(-1)  # (the packed records: RECORD's layout)


def _msg(cols: tuple, k: int, q: int) -> tuple:
    """Message ``q`` of round k's (times, senders, ranks, links, rows) as ``_barrier`` reads it: (time, round, sender,
    rank, link, row)."""
    t, src, sub, lid, row = cols
    return float(t[q]), k, int(src[q]), int(sub[q]), int(lid[q]), int(row[q])


def _col(tab, name, row):
    if hasattr(tab, "parts"):  # (during planning: the rounds' parts so far)
        return np.concatenate(tab.parts[name])[row]
    return getattr(tab, name)[row]


class Replay:
    """The plan played window by window into barrier driver ``d`` as its control (``until``): the rows, gradient
    requests, release slots, wake counts and message ids of the events due, among the run's own events in the driver's
    queue; their tensor work is ``rounds``' (``RoundWork``). It holds what the driver's ``decide`` reads of a control
    (``slots``, ``patches``)."""

    def __init__(self, d):
        self.d = d
        self.plan = plan = Plan(d)
        ctx = d.ctx
        self.slots: list[tuple[int, int]] = []  # (row of the window, round record): its releases go there
        self.patches: list[tuple[int, int]] = []  # (none: the payloads' bytes are declared)
        self.at = 0  # the next planned event
        self.evals = 0  # the evaluator's events processed
        self.done_t = -np.inf  # every event before this time was played
        et, ei = plan.etype, plan.eidx
        n = len(ctx.agents)
        act, done, bar = plan.ev.act, plan.ev.done, plan.ev.bar
        rid = np.empty(act.n, np.int64)  # each round record's number: its activation's place among them
        rid[ei[et == E_ACT]] = np.arange(act.n)
        rid_of = np.full((-(-plan.rounds // plan.K), n), -1, np.int64)  # (by round index and agent)
        rid_of[act.k // plan.K, act.agent] = rid
        self.rounds = RoundWork(d, plan, rid, rid_of)
        # what the control does at each event: the message ids its sends take, the agent it wakes
        self.ids, self.woken = np.zeros(len(et), np.int64), np.full(len(et), -1, np.int64)
        m = et == E_DONE
        self.ids[m] = done.deg[ei[m]]
        by_bar = np.flatnonzero(done.bar >= 0)  # (a barrier's completion that sends the next exchange's messages)
        if len(by_bar):
            sends = np.zeros(bar.n, np.int64)
            sends[done.bar[by_bar]] = done.deg[by_bar]
            m = et == E_BAR
            self.ids[m] = sends[ei[m]]
        m = np.flatnonzero(et == E_BAR)
        m = m[bar.k[ei[m]] % plan.K == plan.K - 1]  # (a round's last exchange)
        fin = bar.fin[ei[m]] > 0
        self.woken[m[~fin]] = bar.agent[ei[m[~fin]]]
        self.ends = np.full(len(et), -1, np.int64)  # the agent whose program finishes there (``WindowDriver.finish``)
        self.ends[m[fin]] = bar.agent[ei[m[fin]]]
        ctx.sim.count_wakes(ctx.agents, np.arange(n, dtype=np.int64))  # each program's first wake

    def first_due(self) -> float | None:
        """The time of the first event not played yet (None: none)."""
        times = self.plan.times
        k = int(np.searchsorted(times, self.done_t))
        return None if k >= len(times) else float(times[k])

    def _hk(self, h) -> tuple:
        """A queued event of the run's own as a plan handle."""
        kind = h[2]
        if kind == EVAL:
            return (EVAL, self.evals + 1)
        return (kind,) if kind in (UNTIL, STOP) else (ROOT,)

    def until(self, end: float) -> None:
        d, plan = self.d, self.plan
        q = d.events
        cur, soon = q.cur, q.soon
        ts = plan.etime
        n_ev = len(ts)
        t = q.now
        try:
            while True:
                h = None  # the run's own next event due before ``end``
                if soon and (not cur or soon[0] < cur[-1]):
                    h = soon[0]
                elif cur:
                    h = cur[-1]
                if h is not None and not h[0] < end:
                    h = None
                bound = end if h is None else h[0]
                j = int(np.searchsorted(ts, bound, "left"))
                if h is not None:  # the planned events of its instant that come before it
                    while j < n_ev and ts[j] == bound and plan.before(
                            plan.handle(int(plan.etype[j]), int(plan.eidx[j])), self._hk(h)):
                        j += 1
                if j > self.at:
                    stop = self._play(self.at, j)
                    t = float(ts[j - 1])
                    self.at = j
                    if stop:  # the last finish's stop event: due before the run's own events it found
                        continue
                if h is None:
                    self.done_t = end
                    break
                if soon and h is soon[0]:
                    heapq.heappop(soon)
                else:
                    cur.pop()
                t = h[0]
                self.done_t = t
                if h[2] == EVAL:
                    self.evals += 1
                if d.housekeeping(t, h[2], h[3], h[4]):
                    return
        finally:
            q.now = t

    def _play(self, lo: int, hi: int) -> bool:
        """Planned events ``lo:hi``: their rows, and what the control does at them, as arrays: the gradient requests
        (one ticket an activation), the releases' slots (after each completion's ``compute_end``), the message ids its
        sends take, the wakes counted, the programs finished (the tensor work reads the plan's arrays: ``RoundWork``);
        whether the last finish pushed the run's stop."""
        d, plan, work = self.d, self.plan, self.rounds
        rows = d.rows
        base = len(rows.buf) // _R - int(plan.first_row[lo])
        rows.put(memoryview(plan.rows)[plan.first_row[lo] * _R:plan.first_row[hi] * _R])  # (no copy but the rows')
        et = plan.etype[lo:hi]
        d.grad.ticket_of.extend(itertools.repeat(None, int(np.count_nonzero(et == E_ACT))))
        m = np.flatnonzero(et == E_DONE) + lo
        self.slots.extend(zip((base + plan.first_row[m] + 1).tolist(), work.erid[m].tolist()))
        ids = int(self.ids[lo:hi].sum())
        if ids:
            d.ctx.net.take_ids(ids)
        w = self.woken[lo:hi]
        w = w[w >= 0]
        if len(w):
            d.ctx.sim.count_wakes([d.ctx.agents[i] for i in w.tolist()], w)
        ends = np.flatnonzero(self.ends[lo:hi] >= 0) + lo
        for i, e in zip(self.ends[ends].tolist(), plan.etime[ends].tolist()):  # (their rows are the plan's)
            d.finish(d.ctx.agents[i], e, row=False)
        return len(ends) > 0 and not d.unfinished


class RoundWork:
    """A planned run's tensor work, read from the plan's arrays: each round record's agent and clocks, each barrier's
    senders in arrival order; a payload kept as a row of the batch that sent it while a barrier will take it.

    Where the gradients are batch-invariant (``Gradients.free``) it goes round by round: a window's operations of round
    index k are its activations' points and gradients (``asks``), then its completions' ``local`` (``locals``), then
    its barriers' ``combine`` (``combines``), each one kernel call over all their agents, k in increasing order. This
    is exact because an agent's operations keep their order (round k's before round k + 1's; in a round the point,
    ``local``, ``combine``), a ``combine`` of round k reads payloads of round k only (a barrier takes its own round's
    messages), made by ``local``s of round k before it, the hooks are row-wise (``netsim check``) and the gradients
    have the same bits in any batch. Other gradients keep the engine's batches: the operations go in lock steps
    (``_steps``)."""

    def __init__(self, d, plan: Plan, rid: np.ndarray, rid_of: np.ndarray):
        self.d, self.plan = d, plan
        act, done, bar = plan.ev.act, plan.ev.done, plan.ev.bar
        et, ei, n = plan.etype, plan.eidx, len(d.ctx.agents)
        self.t0 = len(d.grad.ticket_of)  # round record r's gradient request: ticket t0 + r (one an activation)
        self.rec = np.empty((3, act.n), np.int64)  # each round record's agent, activations and tick
        self.rec[:, rid] = act.agent, act.rnd, act.tick
        K = plan.K
        self.t_done = np.full(act.n, np.nan)  # ... and its completion's time
        real = done.bar < 0
        self.t_done[rid_of[done.k[real] // K, done.agent[real]]] = done.t[real]
        # each event's round record and message round (-1: none): round index ``ek // K``, exchange ``ek % K``
        self.erid, self.ek = np.full(len(et), -1, np.int64), np.full(len(et), -1, np.int64)
        for ty, tab in ((E_ACT, act), (E_DONE, done), (E_BAR, bar)):
            m = np.flatnonzero(et == ty)
            r = ei[m]
            self.ek[m] = tab.k[r]
            self.erid[m] = rid[r] if ty == E_ACT else rid_of[tab.k[r] // K, tab.agent[r]]
        m = np.flatnonzero(et == E_BAR)
        # what each barrier's event took: where its senders' payloads start in ``took``, and how many; a payload is
        # its round record's exchange: ``rid * K + s``
        self.took = np.zeros((2, len(et)), np.int64)
        self.took[:, m] = bar.took[ei[m]], bar.ntook[ei[m]]
        senders = np.asarray(plan.ev.took, np.int64)
        at = spans(bar.took, bar.ntook)
        self.took_rid = np.full(len(senders), -1, np.int64)
        mk = np.repeat(bar.k, bar.ntook)
        self.took_rid[at] = rid_of[mk // K, senders[at]] * K + mk % K
        self.uses = np.bincount(self.took_rid[self.took_rid >= 0], minlength=act.n * K)  # barriers that take each
        # each agent's weight of each in-neighbour, sorted by (agent, sender): looked up as arrays
        pairs = sorted((a.id * n + src, w) for a in d.ctx.agents for src, w in a.weights.items())
        self.weights = (np.array([q for q, _ in pairs], np.int64), np.array([w for _, w in pairs], np.float64))
        self.parts: dict[int, tuple] = {}  # round record -> (batch, row, ``cuts``) for its ``combine``
        # each round record's point and payload (while a barrier will take it) as rows of the tensors kept here:
        # (tensor, row) of each, -1 where none; each tensor's rows still read
        self.at = np.full((4, act.n * K), -1, np.int64)
        self.tensors: dict[int, torch.Tensor] = {}
        self.live: dict[int, int] = {}
        self.lo = 0  # the events whose operations are done
        self.asked = np.cumsum(et == E_ACT) - (et == E_ACT)  # requests made before each event (``_steps``' batches)
        self.op_of = np.full(max(act.n * K, n), -1, np.int64)  # (``_steps``' scratch, by payload or agent)

    def run(self, hi: int) -> None:
        """The operations of events ``lo:hi`` (played since the last work): round by round where the gradients are
        batch-invariant, else in lock steps that keep the engine's gradient batches (``_steps``)."""
        lo, self.lo = self.lo, hi
        ev = lo + np.flatnonzero(self.erid[lo:hi] >= 0)  # the operations' events, in order
        if not len(ev):
            return
        if not self.d.grad.free:
            self._steps(ev)
            return
        K = self.plan.K
        m = self.ek[ev]
        # by round index, then points, locals, each exchange's combines; in order within
        key = (m // K) * (K + 2) + _PHASE[self.plan.etype[ev]] + m % K
        o = np.argsort(key, kind="stable")
        ev, key = ev[o], key[o]
        cut = [0, *(np.flatnonzero(np.diff(key)) + 1).tolist(), len(ev)]
        steps = (self.asks, self.locals, self.combines)
        for a, b in zip(cut[:-1], cut[1:]):
            kk, ph = divmod(int(key[a]), K + 2)
            steps[min(ph, 2)](kk, self.erid[ev[a:b]], ev[a:b])

    def _steps(self, ev: np.ndarray) -> None:
        """The operations of events ``ev`` in the earliest lock steps that keep each agent's order and come after what
        they wait for (``lock_steps``): a ``combine`` after the ``local``s of this work that made its payloads, an
        engine gradient batch (``flushes``: made at this work's completions, as the engine makes them) at the end of
        its last request's step, a ``local`` a step after its batch. Each step's operations of a kind in one call per
        round index (all in one, ``AnyRound``, where the kernel reads none), its batches evaluated at its end in the
        engine's order."""
        from netsim.rounds.lookahead import lock_steps

        d, grad, t0 = self.d, self.d.grad, self.t0
        et = self.plan.etype[ev]
        # the engine's gradient batches: a completion whose request is pending evaluates every request made so far
        pending = grad.pending_lo
        for e, tk in zip(*(ev[et == E_DONE], t0 + self.erid[ev[et == E_DONE]])):
            if tk >= pending:
                made = t0 + int(self.asked[e])
                grad.flushes.append(range(pending, made))
                pending = made
        grad.pending_lo = pending
        who = self.rec[0, self.erid[ev]]
        agents, at = np.unique(who, return_index=True)  # each agent's operations together, in order, the agents in
        self.op_of[agents] = at  # the order of their first (the gradient batches' order: their rows taken unmoved)
        o = np.argsort(self.op_of[who], kind="stable")
        self.op_of[agents] = -1
        ev, et = ev[o], et[o]
        rids, who = self.erid[ev], self.rec[0, self.erid[ev]]
        kind = _OP[et]
        m, nb = len(ev), len(grad.flushes)
        first = np.ones(m + nb, bool)
        first[1:m] = who[1:] != who[:-1]
        waiter, waited, gap = [], [], []

        def wait(a: np.ndarray, b: np.ndarray, g: int) -> None:  # ``a[n]`` waits for ``b[n]``, ``g`` steps after it
            waiter.append(a), waited.append(b), gap.append(np.full(len(a), g, np.int64))

        K = self.plan.K
        loc, cmb = np.flatnonzero(kind == LOCAL), np.flatnonzero(kind == COMBINE)
        sends = cmb[self.ek[ev[cmb]] % K < K - 1]  # (combines that send the next exchange's payloads)
        made = np.concatenate((rids[loc] * K, rids[sends] * K + self.ek[ev[sends]] % K + 1))
        self.op_of[made] = np.concatenate((loc, sends))
        at, cnt = self.took[:, ev[cmb]]
        by = self.op_of[self.took_rid[spans(at, cnt)]]
        self.op_of[made] = -1
        wait(np.repeat(cmb, cnt)[by >= 0], by[by >= 0], 1)  # a combine after the operations that made what it reads
        if nb:
            ends = np.array([r.stop for r in grad.flushes], np.int64)
            lows = np.array([r.start for r in grad.flushes], np.int64)
            for ops, g in ((np.flatnonzero(kind == ASK), 0), (loc, 1)):
                tk = t0 + rids[ops]
                f = np.searchsorted(ends, tk, "right")
                ok = f < nb
                ok[ok] &= tk[ok] >= lows[f[ok]]
                if g == 0:  # a batch after its requests of this work
                    wait(m + f[ok], ops[ok], 0)
                else:  # a local after its batch
                    wait(ops[ok], m + f[ok], 1)
        step = lock_steps(np.concatenate((kind, np.zeros(nb, np.int64))), first,
                          np.concatenate(waiter).astype(np.int64), np.concatenate(waited).astype(np.int64),
                          np.concatenate(gap))
        due: dict[int, list[int]] = {}
        for f, s in enumerate(step[m:].tolist()):
            due.setdefault(s, []).append(f)
        step = step[:m]
        joined, mixed = d.work.any_round, d.work.mixed
        handlers = {COMBINE: self.combines, ASK: self.asks, LOCAL: self.locals}
        for s in sorted({*step.tolist(), *due}):
            here = np.flatnonzero(step == s)
            for kd in (COMBINE, ASK, LOCAL):
                q = here[kind[here] == kd]
                mk = self.ek[ev[q]]
                for x in np.unique(mk % K).tolist():  # (one call per exchange)
                    qx = q[mk % K == x]
                    ks = mk[mk % K == x] // K
                    if joined:
                        groups = [(int(ks[0]) if (ks == ks[0]).all() else mixed, qx)]
                    else:
                        groups = [(kk, qx[ks == kk]) for kk in np.unique(ks).tolist()]
                    for kk, g in groups:
                        handlers[kd](kk, rids[g], ev[g])
            for f in due.pop(s, ()):
                grad.evaluate_batch(f)

    def asks(self, k: int, rids: np.ndarray, ev: np.ndarray) -> None:
        """The points (each agent's parameters at its activation), their mini-batches (``RowsAhead``: each agent's own
        stream, in its own order) and their gradients, in one call."""
        d = self.d
        who = self.rec[0, rids]
        x = d.work.gather(who.tolist())
        rows = d.work.sampler.take([d.ctx.agents[i] for i in who.tolist()], who, d.grad.first.batch)
        tickets = (self.t0 + rids).tolist()
        if d.grad.free:
            d.grad.evaluate_step(who.tolist(), tickets, x, rows)
        else:  # (evaluated with their engine batch: ``GradientService.evaluate_batch``)
            ticket_of = d.grad.ticket_of
            for tk, e in zip(tickets, zip(who.tolist(), rows)):
                ticket_of[tk] = e
            d.grad.at_of.update(zip(tickets, zip(itertools.repeat(x), range(len(rids)))))
        self._keep(0, rids, x)

    def locals(self, k: int, rids: np.ndarray, ev: np.ndarray) -> None:
        """``local`` of round k's completions: the payloads kept while a barrier will take them, each agent's part for
        its ``combine``, the releases for their rows (``_Driver.decide``)."""
        d, rl, ctx = self.d, rids.tolist(), self.d.ctx
        x = self._take(0, rids, share=True)
        g = d.grad.evaluated.take((self.t0 + rids).tolist())
        made: list[list] = [[] for _ in rl]
        t_done, (who, rnd, tick) = self.t_done[rids].tolist(), self.rec[:, rids].tolist()
        b = Batch([ctx.agents[i] for i in who], k, x, g, ctx.state, lambda n: (t_done[n], made[n], rnd[n], tick[n]))
        if ctx.kernel.local(b, ctx.p) is not None:
            raise RuntimeError("barrier windows: local returned a generator (local steps are refused)")
        if (b.k is not k and (isinstance(k, AnyRound) or b.k != k)) or b.more:
            raise RuntimeError("barrier windows: local changed the round index b.k or sent several messages")
        d.store.released.update(zip(rl, made))
        self._sent(b, rids, 0)

    def _sent(self, b: Batch, rids: np.ndarray, s: int) -> None:
        """The payloads batch ``b`` sent for exchange ``s`` (``local``'s, or ``combine``'s for the next exchange): kept
        while a barrier will take them, and each agent's part of ``b`` for its next ``combine``."""
        d = self.d
        fixed = d.store.fixed
        for size in b.sizes if b.sizes is not None else map(payload_size, b.out):
            if size != fixed:  # (its sends were timed with the declared bytes)
                raise RuntimeError(f"barrier windows: {type(d.ctx.kernel).__name__}.payload_bytes says {fixed} "
                                   f"bytes, and a payload of {size} was sent")
        self.parts.update(zip(rids.tolist(), zip(itertools.repeat(b), range(len(rids)),
                                                 itertools.repeat(d.work.cuts(b)))))
        keys = rids * self.plan.K + s
        kept = np.flatnonzero(self.uses[keys])
        if len(kept):
            self._keep(2, keys, b.sent if b.sent is not None else torch.stack(list(b.out)), kept)

    def combines(self, k: int, rids: np.ndarray, ev: np.ndarray) -> None:
        """``combine`` of round k's barriers of one exchange with what each took, in arrival order (``Arrivals``: no
        dict per agent); before the round's last exchange it sends the next payloads. With the mixing record, each
        agent's mixing steps (``_Records``: written in the engine's order, at the barrier's time, with the releases
        made by then)."""
        ctx, rl, K, rec = self.d.ctx, rids.tolist(), self.plan.K, self.d.records
        b = self.d.work.rows_of(list(map(self.parts.pop, rl)))
        s = int(self.ek[ev[0]] % K)
        b.s, b.k = s, k
        if rec.mixing:
            b.held = []
        first, cnt = self.took[:, ev]
        taken = self.took_rid[spans(first, cnt)]
        recv = np.repeat(np.arange(len(rl)), cnt)  # (each delivery's payload and receiver, in arrival order)
        if len(taken):
            made, send = np.unique(taken, return_inverse=True)
            send = send.reshape(-1)
            src = self.rec[0, made // K]
            keys, vals = self.weights
            q = self.rec[0, rids][recv] * len(ctx.agents) + src[send]
            at = np.minimum(np.searchsorted(keys, q), max(len(keys) - 1, 0))
            w = np.where(keys[at] == q, vals[at], np.nan) if len(keys) else np.full(len(q), np.nan)  # (NaN: the
            # receiver has no weight for that sender)
            if self.d.work.small:  # the payloads as one tensor's rows
                sent = self._rows(2, made)
                got = Arrivals(src.tolist(), RowViews(sent), sent, recv, send, w, receivers=len(rl))
            else:  # a large model's: each a view of its row (no copy), as dicts
                tensors = self.tensors
                got = Arrivals(src.tolist(), [tensors[t][n] for t, n in self.at[2:, made].T.tolist()], None, recv,
                               send, w, receivers=len(rl))
            self.uses[made] -= np.bincount(send, minlength=len(made))
            self._drop(2, made[self.uses[made] == 0])
        else:
            got = Arrivals([], [], None, recv, taken, np.zeros(0), receivers=len(rl))
        if ctx.kernel.combine(b, ctx.p, got) is not None:
            raise RuntimeError("barrier windows: combine returned a generator (gradients after the exchange are "
                               "refused)")
        if rec.mixing:
            if b.held:
                raise RuntimeError("barrier windows: combine made releases (the patterns release in local)")
            rec.mixes += b.take_mix_rows(got, ev, self.plan.etime[ev])
        if s + 1 < K:
            self._sent(b, rids, s + 1)

    # the points and payloads, kept as rows of their batches' tensors -----------------------------------------------
    def _keep(self, c: int, rids: np.ndarray, t: torch.Tensor, rows: np.ndarray | None = None) -> None:
        """Rows ``rows`` (default: all) of tensor ``t`` as the points (``c`` 0) or payloads (``c`` 2) of ``rids``."""
        rows = np.arange(len(rids)) if rows is None else rows
        key = len(self.tensors) and max(self.tensors) + 1
        self.tensors[key], self.live[key] = t, len(rows)
        self.at[c, rids[rows]], self.at[c + 1, rids[rows]] = key, rows

    def _rows(self, c: int, rids: np.ndarray, share: bool = False) -> torch.Tensor:
        """The rows of ``rids`` as one tensor, a copy (``join_rows``'), or with ``share`` the tensor itself where they
        are all its rows in order."""
        src, row = self.at[c, rids], self.at[c + 1, rids]
        keys = np.unique(src)
        if len(keys) == 1:
            t = self.tensors[int(keys[0])]
            if share and len(row) == len(t) and (row == np.arange(len(t))).all():
                return t
            return t.index_select(0, as_index(row, t.device))
        ats = [np.flatnonzero(src == k) for k in keys.tolist()]
        out = torch.cat([self.tensors[k].index_select(0, as_index(row[m], self.tensors[k].device))
                         for k, m in zip(keys.tolist(), ats)])
        back = np.empty(len(rids), np.int64)
        back[np.concatenate(ats)] = np.arange(len(rids))
        return out.index_select(0, as_index(back, out.device))

    def _take(self, c: int, rids: np.ndarray, share: bool = False) -> torch.Tensor:
        """``_rows``, which are then forgotten."""
        out = self._rows(c, rids, share)
        self._drop(c, rids)
        return out

    def _drop(self, c: int, rids: np.ndarray) -> None:
        if not len(rids):
            return
        keys, n = np.unique(self.at[c, rids], return_counts=True)
        self.at[c, rids] = -1
        for k, m in zip(keys.tolist(), n.tolist()):
            self.live[k] -= m
            if not self.live[k]:
                del self.live[k], self.tensors[k]
