"""Spike: barrier rounds (one exchange, lean links, no churn) planned round by round instead of event by event.

Round k of every agent depends only on round k - 1 of itself and round k of its in-neighbours (a barrier takes
only messages of its own round): the control's times are a recurrence in k. The rows are then ordered by time.
This script plans a run's control rows and compares them with the trace of the same run.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

import netsim
from netsim.cli import _overrides
from netsim.rounds import barrier_windows
from netsim.sim.network import outcomes


class Planned(BaseException):
    pass


def plan(pattern, sim, kernel):
    t0 = time.process_time()
    agents = sim.loop.agents
    n = len(agents)
    p = sim.params
    state = kernel.state_of(agents[0], p)
    net = sim.world.network
    U = sim.world.scenario.run.until
    T = p.round_timeout
    size = kernel.payload_bytes(p, state, sim.world.bank.W[0])
    assert size is not None
    links = outcomes(net.lean())
    tag = pattern.tag
    count = sim.count_wakes
    nb = [a.neighbors for a in agents]
    inn = [frozenset(a.in_neighbors) for a in agents]
    now0 = float(sim.loop.env.now)
    rows = []  # (t, class, sub, row): class orders simultaneous rows only for the tie check
    A, AT, RND = [0.0] * n, [0.0] * n, [0] * n
    for a in agents:
        at, d = a.plan_wake(now0)
        count((a,))
        A[a.id], AT[a.id], RND[a.id] = now0 + d, at, a.round
    alive = [A[i] < U for i in range(n)]
    left = [[] for _ in range(n)]  # messages of earlier rounds not yet taken or discarded: (R, src, mid, rnd)
    sends = []  # (D, i, [(j, delay, reason)]) in round order; mids assigned after
    k = 0
    msg_ref = []  # message index -> mid (filled after)
    while any(alive):
        D, G = {}, {}
        inbox = {}  # j -> list of (R, src, msg index, rnd k)
        for i in range(n):
            if not alive[i]:
                continue
            a, t = agents[i], A[i]
            rows.append((t, 0, 0, ("activate", i, -1, None, 0, AT[i], RND[i], "")))
            ct = a.compute_time(t)
            rows.append((t, 0, 1, ("compute_start", i, -1, None, 0, ct, -1, "")))
            d = t + ct
            if not d < U:
                alive[i] = False
                continue
            D[i] = d
            rows.append((d, 1, 0, ("compute_end", i, -1, None, 0, 0.0, -1, "")))
            delays, reasons, tx = links(i, nb[i], d, size)
            out = []
            for sub, (j, delay, reason) in enumerate(zip(nb[i], delays, reasons)):
                m = len(msg_ref)
                msg_ref.append((d, i, sub))
                rows.append((d, 1, 1 + 2 * sub, ("send", i, j, m, size, delay, k, tag)))
                if reason:
                    rows.append((d, 1, 2 + 2 * sub, ("drop", i, j, m, size, delay, k, reason)))
                else:
                    r = d + delay
                    inbox.setdefault(j, []).append((r, i, m, k, d))
            G[i] = d + tx if tx > 0 else d
            sends.append(d)
        # deliveries of round k
        for j, ms in inbox.items():
            for r, i, m, kk, d in ms:
                if r < U:
                    rows.append((r, 2, 0, ("deliver", j, i, m, size, r - d, kk, tag)))
        # barriers of round k
        for j in range(n):
            if j not in G:
                continue
            g = G[j]
            if not g < U:
                alive[j] = False
                continue
            gsub = 0 if g > D[j] else 100  # gather inline in the DONE event, after its rows
            gcls = 3 if g > D[j] else 1
            mine = sorted(m[:4] for m in inbox.get(j, ()))
            expect = inn[j]
            L = left[j]
            queue = sorted([m for m in L if m[0] < g] + [m for m in mine if m[0] < g])
            got = set()
            done_at = None
            rest = []
            for idx, m in enumerate(queue):  # the queued messages offered in arrival order
                r, src, mi, kk = m
                if kk == k and src in expect:
                    got.add(src)
                    if len(got) == len(expect):
                        done_at = g
                        rest = [q for q in queue[idx + 1:] if q[3] < k]
                        break
                elif kk < k:
                    rows.append((g, gcls, gsub, ("stale", j, src, mi, 0, 0.0, kk, "")))
                    gsub += 1
            tmo = g + T
            if done_at is None:
                for m in (m for m in mine if m[0] >= g):  # arrivals while open, in time order
                    r, src = m[0], m[1]
                    if r < tmo and r < U:
                        got.add(src)
                        if len(got) == len(expect):
                            done_at = r
                            break
                if done_at is None and tmo < U:
                    rows.append((tmo, 4, 0, ("timeout", j, -1, None, 0, float(len(expect) - len(got)), k, "")))
                    done_at = tmo
            close = U if done_at is None else done_at
            newleft = rest
            for m in L:
                r = m[0]
                if r < g:
                    continue
                if r < close:
                    rows.append((r, 2, 1, ("stale", j, m[1], m[2], 0, 0.0, m[3], "")))
                else:
                    newleft.append(m)
            newleft += [m for m in mine if m[0] >= g and m[1] not in got]
            left[j] = sorted(newleft)
            if done_at is None or not done_at < U:
                alive[j] = False
                continue
            a = agents[j]
            at, d = a.plan_wake(done_at)
            count((a,))
            A[j], AT[j], RND[j] = done_at + d, at, a.round
            if not A[j] < U:
                alive[j] = False
        for i in range(n):
            if alive[i] and i not in G:
                alive[i] = False
        k += 1
    # message ids: DONE order
    order = np.argsort(np.array([d for d, _, _ in msg_ref]), kind="stable")
    mid0 = net.next_id
    mids = np.empty(len(msg_ref), np.int64)
    mids[order] = mid0 + np.arange(len(msg_ref))
    out = []
    for t, cls, sub, row in rows:
        kind, a, b, m, s, v, r, tg = row
        out.append((t, cls, sub, (t, kind, a, b, -1 if m is None else int(mids[m]), s, v, r, tg)))
    out.sort(key=lambda e: (e[0], e[1], e[2]))
    ts = np.array([e[0] for e in out])
    ties = int(np.sum(np.diff(ts) == 0))
    print("plan cpu", time.process_time() - t0, "rows", len(out), "rounds", k, "equal-time neighbours", ties,
          file=sys.stderr)
    raise Planned([e[3] for e in out])


def main():
    scen, *sets = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        netsim.run(scen, overrides=_overrides(sets), out=os.path.join(tmp, "a"), engine="auto", interruptible=False)
        from netsim.trace.io import read_trace
        df = read_trace(os.path.join(tmp, "a")).table.to_pandas()
        keep = {"activate", "compute_start", "compute_end", "send", "drop", "deliver", "timeout", "stale"}
        df = df[df.kind.isin(keep)]
        ref = list(df.itertuples(index=False, name=None))
        barrier_windows.play = plan
        try:
            netsim.run(scen, overrides=_overrides(sets), out=os.path.join(tmp, "b"), engine="auto",
                       interruptible=False)
        except Planned as e:
            got = e.args[0]
        print("trace rows", len(ref), "planned", len(got))
        bad = 0
        for x, y in zip(ref, got):
            if tuple(x) != tuple(y):
                bad += 1
                if bad <= 5:
                    print("ref ", x)
                    print("plan", y)
        print("mismatches", bad)


if __name__ == "__main__":
    main()
