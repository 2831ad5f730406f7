"""Resume without recomputing: a windowed run's checkpoint put back into a freshly built simulation.

Between two rounds of a windowed driver (netsim/rounds/) the run's whole state is data: the parameter bank,
every stream's position and the blocks drawn ahead from them (a link's latency and loss draws, an agent's
mini-batches), the links made so far and the next message id, the agents' rounds and schedules, the privacy
ledgers (releases, noise generators), the kernel's state (``RoundKernel.save_state``), the gradient and
communication counters, the recorder (trace position, the rows not yet in a batch, event counts, metrics rows)
and the driver's own ``Between``. ``capture`` adds to a checkpoint what sim/checkpoint.py's capture does not hold;
``restore`` puts it all into a simulation built from the same scenario, whose driver then plays on from the next
round. The restored simulation is captured again and compared with the checkpoint before it goes on (api.resume),
so a piece this module missed is refused in one line, never continued wrongly.

A coroutine program's state is its generator frames, which cannot be rebuilt: the events engine's checkpoints are
resumed by re-executing the run up to them (docs/checkpoints.md).
"""

from __future__ import annotations

from array import array
from collections import Counter
from typing import Any

import numpy as np
import torch

from netsim.sim.loop import Between
from netsim.sim.streams import Draws, DrawsAhead, set_state

# the typecodes of a ReleaseLog's columns (sim/checkpoint.py stores them as numpy arrays)
_LOG = {"t": "d", "round": "i", "to": "i", "skipped": "i", "run_start": "q", "run_spec": "i"}


def _pos(draws: Any) -> list[int] | None:
    return draws.position() if isinstance(draws, Draws) else None


def _ahead(ahead: DrawsAhead | None) -> list[int] | None:
    """An agent's mini-batches drawn ahead: [stream state before the block, has_uint32, uinteger, used, batch]."""
    if ahead is None:
        return None
    st = ahead.state
    return [st["state"]["state"], st["has_uint32"], st["uinteger"], ahead.pos, ahead.batch]


def capture(sim, arrays: dict) -> dict[str, Any]:
    """The windowed part of a checkpoint's state (tensors go to ``arrays``)."""
    from netsim.sim.checkpoint import _flat

    world, loop, rec = sim.world, sim.loop, sim.recorder
    b, marks = loop.programs.between, loop.marks
    for n, (_, loss, acc) in enumerate(rec.agent_metrics):
        arrays[f"agent_metrics.{n}.loss"], arrays[f"agent_metrics.{n}.accuracy"] = np.asarray(loss), np.asarray(acc)
    for a in loop.agents:
        led = a.existing_ledger
        if led is not None and led.rdp is not None:
            arrays[f"ledger.{a.id}.rdp"] = np.asarray(led.rdp.rdp)
    kernel = sim.program
    return {
        "round": b.k, "order": b.order, "end": b.end, "held": _flat(b.held, "held", arrays),
        "kernel": kernel.save_state(kernel.state_of(loop.agents[0], sim.params)),
        "marks": [marks.activations, marks.mark, marks.round_mark],
        "links": [[s, d, _pos(lk.latency), _pos(lk.lost)] for (s, d), lk in world.network.links.items()],
        "agents": [[_ahead(a._ahead), _pos(a._compute)] for a in loop.agents],
        "pending": [[v.item() if isinstance(v, np.generic) else v for v in r] for r in rec.writer.buffer],
        "agent_metrics": [t for t, *_ in rec.agent_metrics],
    }


def _unflat(x: Any, arrays: dict, tensor) -> Any:
    """sim/checkpoint.py's ``_flat`` skeleton back as values (its tensors through ``tensor``)."""
    if not isinstance(x, dict):
        return x
    if "@" in x:
        return tensor(arrays[x["@"]])
    if "list" in x:
        return [_unflat(v, arrays, tensor) for v in x["list"]]
    if "dict" in x:
        return {_unflat(k, arrays, tensor): _unflat(v, arrays, tensor) for k, v in x["dict"]}
    raise ValueError(f"a driver's state holds a {x.get('type', 'value')!r}, which cannot be restored")


def restore(sim, ckpt) -> None:
    """Put a windowed checkpoint's state into ``sim``: built from the same scenario and started (``Simulation.start``),
    its windowed runner chosen; the trace file itself is reopened by the caller."""
    st, arrays, w = ckpt.meta["state"], ckpt.arrays, ckpt.meta["state"]["windowed"]
    world, loop, rec = sim.world, sim.loop, sim.recorder
    bank = world.bank
    dtype, device = bank.W.dtype, bank.W.device

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a)).to(device=device, dtype=dtype)

    bank.load_state_dict({k[len("bank."):]: tensor(v) for k, v in arrays.items() if k.startswith("bank.")})
    net = world.network
    for s, d, lat, lost in w["links"]:  # made in the order the run made them, standing where its draws stood
        link = net.links.get((s, d)) or net.link(s, d)
        for draws, pos in ((link.latency, lat), (link.lost, lost)):
            if pos is not None:
                draws.resume(pos)
    for k, v in st["network"].items():
        if k != "links":
            setattr(net, k, v)
    for a, plain, (ahead, compute) in zip(loop.agents, st["agents"], w["agents"], strict=True):
        for k, v in plain.items():
            if k != "schedule":
                setattr(a, k, v)
        for k, v in plain["schedule"].items():
            setattr(a.schedule, k, v)
        if ahead is not None:
            set_state(a._batch_rng, ahead[:3])
            a._ahead = DrawsAhead(a._batch_rng, len(a.rows), ahead[4])
            a._ahead.pos = ahead[3]
        if compute is not None:
            a._compute.resume(compute)
    for key, saved in st["ledgers"].items():
        _ledger(loop.agents[int(key)], saved, arrays, key)
    kernel = sim.program
    kernel.load_state(kernel.state_of(loop.agents[0], sim.params), w["kernel"])
    # every stream's position last: the draws above were taken from their streams
    keys = [tuple(int(x) for x in k.split(",")) for k in st["rng"]]
    rows = arrays["streams"].tolist()
    world.streams.restore(keys, [((r[0] << 64) | r[1], (r[2] << 64) | r[3], r[4], r[5]) for r in rows])
    g = world.gradients
    g.calls, g.evaluated = st["gradients"]["calls"], st["gradients"]["evaluated"]
    if st["comm"] is not None:
        from netsim.sim.services import CommStats

        stats = sim.services.get(CommStats)
        stats.counts = Counter(st["comm"]["counts"])
        stats.samples = {k: list(v) for k, v in st["comm"]["samples"].items()}
    # the recorder: metrics rows, each agent's own, the trace's rows not yet in a batch and its counts
    rec.metrics = [dict(r) for r in ckpt.meta["metrics"]]
    rec.agent_metrics = [(t, arrays[f"agent_metrics.{n}.loss"], arrays[f"agent_metrics.{n}.accuracy"])
                         for n, t in enumerate(w["agent_metrics"])]
    rec.writer.buffer = [tuple(r) for r in w["pending"]]
    rec.writer.count = ckpt.meta["trace"]["events"]
    ev = st["events"]
    if rec.counts is not None and ev["kinds"] is not None:
        rec.counts.kinds = Counter(ev["kinds"])
        rec.counts.bytes_sent = ev["bytes_sent"]
    # the loop and the driver
    marks = loop.marks
    marks.activations, marks.mark, marks.round_mark = w["marks"]
    marks.next_boundary = marks.mark
    loop.steps, loop.finished, loop.stop_reason = st["step"], st["finished"], st["stop_reason"]
    loop.env.advance_to(st["time"])
    held = _unflat(w["held"], arrays, tensor)
    loop.programs.between = Between(w["round"], [tuple(o) for o in w["order"]], w["end"], held)


def _ledger(agent, saved: dict, arrays: dict, key: str) -> None:
    """An agent's privacy ledger as it stood: its totals, its release log's columns, its noise generator."""
    led = agent.ledger  # made now, with the scenario's settings, as the run made it
    for k, v in saved.items():
        if k not in ("releases", "to0", "specs"):
            setattr(led, k, v)
    log = led.releases
    for name, code in _LOG.items():
        col = arrays.get(f"ledger.{key}.{name}")
        if col is not None:
            setattr(log, name, array(code, col.tobytes()))
    log.to0 = saved["to0"]
    log.specs = [tuple(s) for s in saved["specs"]]
    log._spec_ids = {s: n for n, s in enumerate(log.specs)}
    noise = arrays.get(f"ledger.{key}.noise")
    if noise is not None:
        led.noise.generator.set_state(torch.from_numpy(np.array(noise)))
    rdp = arrays.get(f"ledger.{key}.rdp")
    if rdp is not None:
        led.load_rdp(np.array(rdp))
