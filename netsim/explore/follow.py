"""Following events: a message from its send to its delivery or drop, and why a round timed out.

These read only the trace (and the scenario text it carries), so they answer for any run folder. A
drop's ``tag`` says ``loss``, ``outage`` or ``offline``; which loss model drew a ``loss`` (the
Gilbert-Elliott burst chain replaces Bernoulli loss when ``network.burst`` is set) comes from the
scenario, and the run of consecutive losses on the link is counted from the trace.
"""

from __future__ import annotations

import numpy as np

from netsim.explore.model import RunData, fmt_t


def loss_model(run: RunData) -> str:
    net = run.scenario.get("network", {})
    burst = net.get("burst")
    if isinstance(burst, dict):
        return (f"Gilbert-Elliott burst (p_enter={burst.get('p_enter', '?')}, "
                f"p_exit={burst.get('p_exit', '?')})")
    p = net.get("loss", 0.0)
    return f"Bernoulli loss (p={p}{', per-link series' if net.get('trace') else ''})"


def drop_cause(run: RunData, row: int) -> str:
    """One line: why this message was dropped."""
    src, dst, reason = int(run.agent[row]), int(run.peer[row]), run.tag(row)
    if reason == "loss":
        streak = _loss_streak(run, row)
        more = f"; loss {streak[0]} of {streak[1]} in a row on {src}->{dst}" if streak[1] > 1 else ""
        return f"lost on the link: {loss_model(run)}{more}"
    if reason == "outage":
        return f"link outage on {src}->{dst} (network.outages)"
    if reason == "offline":
        t = float(run.t[row])
        who = [a for a in (src, dst) if offline_at(run, a, t, t + max(0.0, float(run.value[row])))]
        names = " and ".join(f"agent {a}" for a in who) or "an end"
        return f"offline peer: {names} offline (churn) when it was sent or due"
    return f"dropped: {reason}"


def _loss_streak(run: RunData, row: int) -> tuple[int, int]:
    """(position, length) of this drop in its link's run of consecutive lost messages."""
    src, dst = int(run.agent[row]), int(run.peer[row])
    rows = run.agent_rows(src)
    on_link = rows[run.peer[rows] == dst]
    sends = on_link[run.kind[on_link] == run.code["send"]]
    drops = on_link[run.kind[on_link] == run.code["drop"]]
    lost_ids = {int(run.msg[d]) for d in drops if run.tag(d) == "loss"}
    lost = np.array([int(m) in lost_ids for m in run.msg[sends]], dtype=bool)
    i = int(np.searchsorted(run.msg[sends], run.msg[row]))
    if i >= len(lost) or not lost[i]:
        return (1, 1)
    a = i
    while a > 0 and lost[a - 1]:
        a -= 1
    b = i
    while b + 1 < len(lost) and lost[b + 1]:
        b += 1
    return (i - a + 1, b - a + 1)


def offline_at(run: RunData, a: int, t0: float, t1: float | None = None) -> bool:
    """Whether agent a was offline at some moment of [t0, t1]."""
    if "offline" not in run.code:
        return False
    t1 = t0 if t1 is None else t1
    rows = run.agent_rows(a)
    m = rows[run.kind[rows] == run.code["offline"]]
    return bool(((run.t[m] <= t1) & (run.t[m] + run.value[m] >= t0)).any())


def describe(run: RunData, row: int) -> list[str]:
    """The details pane's lines for one event; messages and timeouts are followed."""
    e = run.row(row)
    k = e["kind"]
    out = [f"{k} at t = {fmt_t(e['t'])} s", f"agent {e['agent']}" + (f", peer {e['peer']}" if e["peer"] >= 0 else "")]
    if e["round"] >= 0:
        out.append(f"round {e['round']}")
    if k in ("send", "deliver", "drop", "stale"):
        out += follow_message(run, row)
    elif k == "timeout":
        out += explain_timeout(run, row)
    elif k in ("compute", "offline"):
        out.append(f"for {e['value']:.4g} s, until {fmt_t(e['t'] + e['value'])}")
    elif k == "activate":
        out.append(f"local clock {e['value']:.6g} s")
    elif k == "eval":
        out.append(f"accuracy of the average model {e['value']:.4f}")
    elif k == "release":
        out.append(f"noise scale {e['value']:.4g}; {e['tag']}")
    elif e["tag"]:
        out.append(f"value {e['value']:.4g}; {e['tag']}")
    return out


def follow_message(run: RunData, row: int) -> list[str]:
    rows = run.message(int(run.msg[row]))
    if not rows:
        return []
    send = next((r for r in rows if run.kind_of(r) == "send"), None)
    out = []
    if send is not None:
        src, dst = int(run.agent[send]), int(run.peer[send])
        out.append(f"message {int(run.msg[send])} {src}->{dst}, tag {run.tag(send)!r}, "
                   f"{int(run.size[send]):,} B, sent at {fmt_t(float(run.t[send]))}")
    for r in rows:
        k = run.kind_of(r)
        if k == "deliver":
            out.append(f"-> delivered at {fmt_t(float(run.t[r]))} (latency {float(run.value[r]):.4g} s)")
        elif k == "drop":
            out.append(f"-> DROPPED ({run.tag(r)}): {drop_cause(run, r)}")
        elif k == "stale":
            out.append(f"-> stale at {fmt_t(float(run.t[r]))}: its round {int(run.round[r])} was over at the receiver")
    if send is not None and len(rows) == 1:
        out.append("-> still in flight at the end of the trace")
    return out


def expected_senders(run: RunData, a: int) -> list[int]:
    """Who sends to agent a in this run (its in-neighbours as the trace shows them)."""
    if "send" not in run.code:
        return []
    m = (run.kind == run.code["send"]) & (run.peer == a)
    return sorted(int(x) for x in np.unique(run.agent[m]))


def missing_at_timeout(run: RunData, row: int) -> list[tuple[int, str]]:
    """[(neighbour, why)] for the messages a round timeout waited for in vain."""
    a, rnd, t = int(run.agent[row]), int(run.round[row]), float(run.t[row])
    rows = run.agent_rows(a)
    got = rows[(run.kind[rows] == run.code.get("deliver", -99)) & (run.round[rows] == rnd) & (run.t[rows] <= t)]
    have = {int(p) for p in run.peer[got]}
    out = []
    for j in expected_senders(run, a):
        if j in have:
            continue
        out.append((j, _why_missing(run, j, a, rnd, t)))
    return out


def _why_missing(run: RunData, j: int, a: int, rnd: int, t: float) -> str:
    rows = run.agent_rows(j)
    sends = rows[(run.kind[rows] == run.code["send"]) & (run.peer[rows] == a) & (run.round[rows] == rnd)]
    if not len(sends):
        if offline_at(run, j, t - 1e-12, t):
            return f"never sent round {rnd}: agent {j} was offline (churn)"
        acts = rows[(run.kind[rows] == run.code.get("activate", -99)) & (run.t[rows] <= t)]
        now = int(run.round[acts[-1]]) if len(acts) else 0
        return f"never sent round {rnd} by then: agent {j} was at round {now}"
    s = int(sends[0])
    ts = float(run.t[s])
    for r in run.message(int(run.msg[s])):
        k = run.kind_of(r)
        if k == "drop":
            return f"dropped ({run.tag(r)}, msg {int(run.msg[s])} sent at {fmt_t(ts)}): {drop_cause(run, r)}"
        if k in ("deliver", "stale"):
            if ts > t:
                return f"sent late, at {fmt_t(ts)} after the timeout (agent {j} was behind)"
            return (f"late: sent at {fmt_t(ts)}, arrived at {fmt_t(float(run.t[r]))} "
                    f"(latency {float(run.value[s]):.4g} s)")
    return f"sent at {fmt_t(ts)}, never arrived before the trace ends"


def explain_timeout(run: RunData, row: int) -> list[str]:
    miss = missing_at_timeout(run, row)
    n = int(round(float(run.value[row])))
    out = [f"waited for {n} missing message(s):"]
    for j, why in miss:
        out.append(f"  from {j}: {why}")
    if len(miss) != n:
        out.append(f"  (the trace shows {len(miss)} missing from the agent's senders)")
    return out
