"""What the observers received, and the canaries of an audit: ``RUN/payloads.npz``, written when a scenario asks
(``privacy.record = "payloads"``; nothing is recorded, drawn or written otherwise, and the trace is the same).

The attacks of ``netsim privacy RUN --attack reconstruct`` and ``--audit`` (netsim/privacy/attack.py,
netsim/privacy/audit.py) work on an observer's view: the model messages delivered to it, as values. The mixing
record (netsim/privacy/views.py) says how each message is a linear function of the releases; this record holds
the values themselves:

- every delivered payload that is a model row (``deliver``: receiver, sender, tag, round, time, value);
- every release (``Agent.privatize``): its value before the noise and the value released;
- the common initial model (every agent starts from the same row);
- with ``privacy.audit``: each victim's canary coordinates and which canaries were included.

Canaries (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023, Algorithm 1:
m canaries, each included independently with probability 1/2): each victim has ``canaries`` coordinates of the
model, disjoint between victims, drawn with the inclusion bits from the run's ``audit`` stream. A *gradient*
canary (white-box Dirac canary) adds the release's declared sensitivity in its coordinate to every release of the
victim, before the noise; an *input* canary is a record of the victim whose per-example gradient is a Dirac of norm
``norm`` in its coordinate: it joins each of the victim's gradients before the algorithm clips (as the gradient
service clips per example when the algorithm asks it to; otherwise as one more record of the batch mean, which
the algorithm then clips, or not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np

from netsim.errors import InputError
from netsim.sim.streams import register_purpose

PAYLOADS_FILE = "payloads.npz"
AUDIT_STREAM = "audit"
register_purpose(AUDIT_STREAM, 100)


class ViewLog:
    """The run's delivered model payloads, release values and canaries (``privacy.record = "payloads"``)."""

    def __init__(self, sim) -> None:
        bank = sim.world.bank
        rows = [bank.get(i) for i in range(sim.world.scenario.agents.count)]
        self.P = int(rows[0].numel())
        self.x0 = rows[0].detach().cpu().double().numpy().copy()
        self.common_init = all(bool((r == rows[0]).all()) for r in rows)
        self.d_dst, self.d_src, self.d_round, self.d_t, self.d_tag, self.d_value = [], [], [], [], [], []
        self.r_agent, self.r_round, self.r_clean, self.r_value = [], [], [], []
        self.canaries: Canaries | None = None
        spec = sim.world.scenario.privacy.audit
        if spec is not None:
            self.canaries = Canaries.draw(spec, sim.world.scenario.agents.count, self.P,
                                          sim.world.streams.rng(AUDIT_STREAM))
            if spec.kind == "input":
                self._join_gradients(sim.world.gradients)

    def _join_gradients(self, service) -> None:
        """Input canaries join each of a victim's gradients as the gradient service computes it: its ``flush``
        (this run's service only) hands the victims' results through ``gradient``: a ``Ticket``'s (the events
        engine's requests), or a victim's row of a ``Block`` (a windowed driver's requests of several agents)."""
        import torch

        from netsim.compute.gradients import Block

        flush, victims = service.flush, set(self.canaries.victims)

        def flush_with_canaries() -> None:
            pending = [t for t in service.pending
                       if (type(t) is Block and victims.intersection(t.agents)) or getattr(t, "agent", None) in victims]
            flush()
            for t in pending:
                if type(t) is not Block:
                    t.result = self.gradient(t.agent, t.result, len(t.rows), t.clip, t.clip_kind)
                    continue
                rows = list(t.result.unbind(0))
                for n, a in enumerate(t.agents):
                    if a in victims:
                        rows[n] = self.gradient(a, rows[n], len(t.rows[n]), t.clip, t.clip_kind)
                t.result = torch.stack(rows)

        service.flush = flush_with_canaries

    # hooks -----------------------------------------------------------------------------------------------------
    def deliver(self, msg, t: float) -> None:
        """A message reached its receiver (the events engine's delivery): kept when it carries a model row."""
        v = msg.payload
        numel = getattr(v, "numel", None)
        if numel is None or numel() != self.P:
            return
        self.d_dst.append(msg.dst)
        self.d_src.append(msg.src)
        self.d_round.append(msg.round)
        self.d_t.append(t)
        self.d_tag.append(msg.tag)
        self.d_value.append(self._row(v))

    def deliver_rows(self, dst, src, rnd: int, t, tag: str, payloads) -> None:
        """Messages that reached their receivers, in delivery order, as a windowed driver plays them: receivers
        ``dst``, senders ``src``, arrival times ``t`` (arrays), one round and tag, ``payloads`` (rows of one tensor, or
        a sequence): what ``deliver`` keeps of each, the same rows."""
        import torch

        if isinstance(payloads, torch.Tensor):  # rows of one tensor: one conversion, the same values as row by row
            n = payloads.shape[0]
            if n == 0 or payloads[0].numel() != self.P:
                return
            self.d_dst += np.asarray(dst).tolist()
            self.d_src += np.asarray(src).tolist()
            self.d_round += [rnd] * n
            self.d_t += np.asarray(t).tolist()
            self.d_tag += [tag] * n
            self.d_value += list(payloads.detach().reshape(n, -1).cpu().double().numpy())
            return
        keep = [n for n, v in enumerate(payloads) if getattr(v, "numel", None) is not None and v.numel() == self.P]
        if not keep:
            return
        dst, src, t = np.asarray(dst)[keep].tolist(), np.asarray(src)[keep].tolist(), np.asarray(t)[keep].tolist()
        self.d_dst += dst
        self.d_src += src
        self.d_round += [rnd] * len(keep)
        self.d_t += t
        self.d_tag += [tag] * len(keep)
        self.d_value += [self._row(payloads[n]) for n in keep]

    def gradient(self, agent: int, g, rows: int, clip: float | None, clip_kind: str):
        """The gradient an agent asked for, with its input canaries in (a victim's); ``g`` itself otherwise."""
        c = self.canaries
        if c is None or c.kind != "input" or agent not in c.row:
            return g
        import torch

        from netsim.privacy import mechanisms

        value = c.norm
        if clip is not None:  # the gradient service clips every example: a canary's Dirac as well
            one = torch.zeros(2, dtype=g.dtype)
            one[0] = c.norm
            value = float(mechanisms.clip(one, clip, clip_kind)[0])
        add = torch.zeros(self.P, dtype=g.dtype, device=g.device)
        add[torch.as_tensor(c.included(agent), device=g.device)] = value / max(1, rows)
        return g + add.reshape(g.shape)

    def before_noise(self, agent: int, x, sensitivity: float):
        """A release's value before its noise, with the victim's gradient canaries in."""
        c = self.canaries
        if c is None or c.kind != "gradient" or agent not in c.row or x.numel() != self.P:
            return x
        import torch

        add = torch.zeros(self.P, dtype=x.dtype, device=x.device)
        add[torch.as_tensor(c.included(agent), device=x.device)] = float(sensitivity)
        return x + add.reshape(x.shape)

    def released(self, agent: int, rnd: int, clean, value) -> None:
        self.r_agent.append(agent)
        self.r_round.append(rnd)
        self.r_clean.append(self._row(clean))
        self.r_value.append(self._row(value))

    def _row(self, x) -> np.ndarray:
        """A model-sized tensor as a float64 row; NaN for a release of another size (not a model row)."""
        if x.numel() != self.P:
            return np.full(self.P, np.nan)
        return x.detach().reshape(-1).cpu().double().numpy().copy()

    # checkpoints ------------------------------------------------------------------------------------------------
    PLAIN = ("d_dst", "d_src", "d_round", "d_t", "d_tag", "r_agent", "r_round")
    ROWS = ("d_value", "r_clean", "r_value")

    def held(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The deliveries and releases so far as a windowed checkpoint keeps them: their plain columns, and their
        model rows as (n, P) arrays (the initial rows and the canaries are the fresh run's own)."""
        return {k: list(getattr(self, k)) for k in self.PLAIN}, \
            {k: np.array(getattr(self, k), dtype=np.float64).reshape(-1, self.P) for k in self.ROWS}

    def take(self, plain: dict, rows: dict[str, np.ndarray]) -> None:
        """``held``'s record back into a fresh run's log; ValueError where it is not one."""
        if not (isinstance(plain, dict) and set(plain) == set(self.PLAIN) and set(rows) == set(self.ROWS)
                and all(isinstance(v, list) for v in plain.values())):
            raise ValueError("payloads: not a payloads record")
        nd, nr = len(plain["d_dst"]), len(plain["r_agent"])
        ints = lambda v: all(type(x) is int for x in v)  # noqa: E731
        ok = all(len(plain[k]) == nd for k in ("d_src", "d_round", "d_t", "d_tag")) and len(plain["r_round"]) == nr \
            and ints(plain["d_dst"]) and ints(plain["d_src"]) and ints(plain["d_round"]) and ints(plain["r_agent"]) \
            and ints(plain["r_round"]) and all(type(x) is float for x in plain["d_t"]) \
            and all(type(x) is str for x in plain["d_tag"]) \
            and all(np.asarray(rows[k]).shape == (n, self.P) and np.asarray(rows[k]).dtype == np.float64
                    for k, n in (("d_value", nd), ("r_clean", nr), ("r_value", nr)))
        if not ok:
            raise ValueError("payloads: not a payloads record of this run's model size")
        for k in self.PLAIN:
            setattr(self, k, list(plain[k]))
        for k in self.ROWS:
            setattr(self, k, [r.copy() for r in np.asarray(rows[k])])

    # file ------------------------------------------------------------------------------------------------------
    def write(self, path: Path) -> Path:
        """Write the record as one .npz (numeric arrays only: read back without pickle), atomically."""
        def stack(rows):
            return np.array(rows, dtype=np.float64).reshape(len(rows), self.P)

        arrays: dict[str, Any] = {
            "x0": self.x0, "common_init": np.array(self.common_init),
            "deliver_dst": np.array(self.d_dst, dtype=np.int64), "deliver_src": np.array(self.d_src, dtype=np.int64),
            "deliver_round": np.array(self.d_round, dtype=np.int64), "deliver_t": np.array(self.d_t, dtype=np.float64),
            "deliver_tag": np.array(self.d_tag, dtype=np.str_), "deliver_value": stack(self.d_value),
            "release_agent": np.array(self.r_agent, dtype=np.int64),
            "release_round": np.array(self.r_round, dtype=np.int64),
            "release_clean": stack(self.r_clean), "release_value": stack(self.r_value)}
        if self.canaries is not None:
            arrays.update(self.canaries.arrays())
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            np.savez(f, **arrays)
        tmp.replace(path)
        return path


@attrs.frozen
class Canaries:
    """Each victim's canary coordinates (``coords[row[victim]]``) and inclusion bits, drawn once per run."""

    kind: str
    norm: float
    victims: tuple[int, ...]
    coords: np.ndarray  # (victims, m) int64, disjoint
    bits: np.ndarray  # (victims, m) bool: included
    confidence: float

    @property
    def row(self) -> dict[int, int]:
        return {v: k for k, v in enumerate(self.victims)}

    def included(self, victim: int) -> np.ndarray:
        k = self.row[victim]
        return self.coords[k][self.bits[k]]

    @staticmethod
    def draw(spec, n: int, P: int, rng: np.random.Generator) -> Canaries:
        bad = [v for v in spec.victims if v >= n]
        if bad:
            raise InputError("privacy.audit.victims", f"agent ids must be in 0..{n - 1}, got {list(spec.victims)}")
        V, m = len(spec.victims), spec.canaries
        if V * m > P:
            raise InputError("privacy.audit.canaries", f"{V} victim(s) x {m} canaries need {V * m} model "
                                                       f"coordinates, one each; the model has {P}: fewer canaries "
                                                       "or a larger model")
        coords = rng.permutation(P)[: V * m].reshape(V, m).astype(np.int64)
        bits = rng.random((V, m)) < 0.5
        return Canaries(spec.kind, float(spec.norm), tuple(spec.victims), coords, bits, float(spec.confidence))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"canary_kind": np.array(self.kind), "canary_norm": np.array(self.norm),
                "canary_victims": np.array(self.victims, dtype=np.int64), "canary_coords": self.coords,
                "canary_bits": self.bits, "canary_confidence": np.array(self.confidence)}


@attrs.frozen
class Payloads:
    """``payloads.npz`` read back."""

    x0: np.ndarray
    common_init: bool
    deliver_dst: np.ndarray
    deliver_src: np.ndarray
    deliver_round: np.ndarray
    deliver_tag: np.ndarray
    deliver_value: np.ndarray
    release_agent: np.ndarray
    release_round: np.ndarray
    release_clean: np.ndarray
    release_value: np.ndarray
    canaries: Canaries | None

    def received(self, tag: str) -> dict[tuple[int, int, int], int]:
        """(receiver, sender, round) -> row of ``deliver_value`` of the delivered messages with ``tag``."""
        out = {}
        for i, (d, s, r, g) in enumerate(zip(self.deliver_dst.tolist(), self.deliver_src.tolist(),
                                             self.deliver_round.tolist(), self.deliver_tag.tolist(), strict=True)):
            if g == tag:
                out.setdefault((d, s, r), i)
        return out

    def releases_of(self, agent: int) -> np.ndarray:
        """Row indices of the agent's releases, in release order."""
        return np.flatnonzero(self.release_agent == agent)


def read_payloads(path: Path) -> Payloads:
    """Read ``payloads.npz`` (no pickle); a file that does not parse or misses an array is one InputError."""
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
        can = None
        if "canary_coords" in a:
            can = Canaries(str(a["canary_kind"]), float(a["canary_norm"]), tuple(a["canary_victims"].tolist()),
                           a["canary_coords"].astype(np.int64), a["canary_bits"].astype(bool),
                           float(a["canary_confidence"]))
        P = a["x0"].shape[0]
        for k in ("deliver_value", "release_clean", "release_value"):
            if a[k].ndim != 2 or a[k].shape[1] != P:
                raise ValueError(f"{k} has shape {a[k].shape}, expected (rows, {P})")
        return Payloads(a["x0"], bool(a["common_init"]), a["deliver_dst"], a["deliver_src"], a["deliver_round"],
                        a["deliver_tag"], a["deliver_value"], a["release_agent"], a["release_round"],
                        a["release_clean"], a["release_value"], can)
    except (OSError, ValueError, KeyError, EOFError) as e:
        raise InputError(PAYLOADS_FILE, f"cannot read the payload record: {e}", str(path)) from None


def view_log_for(sim) -> ViewLog | None:
    """The run's payload record when its scenario asks for one (``privacy.record = "payloads"``), else None."""
    spec = getattr(sim.world.scenario, "privacy", None)
    if spec is None or spec.record != "payloads":
        return None
    return ViewLog(sim)
