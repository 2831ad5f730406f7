"""Compressed payloads whose size on the wire follows their encoding, and the memories that make
biased compression converge (error feedback, CHOCO public copies).

A compressor maps a dense vector to an ``Encoded`` payload; ``Encoded.size_bytes`` is the length of
``Encoded.to_bytes()`` (the wire format below), computed without encoding, and the network charges
bandwidth and traces by it (``sim.network.payload_size``). ``decode()`` gives the dense vector back.

Wire formats (v = bytes per value: 4 for float32, 8 for float64):
    topk   k values (v bytes each) + k int32 indices                         -> k (v + 4)
    randk  int64 seed + k values; the receiver redraws the k indices from it  -> 8 + k v
    qsgd   float32 norm + per coordinate 1 sign bit and b level bits, packed  -> 4 + ceil(d (b+1) / 8)
    none   the d values                                                       -> d v
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: an algorithm's module (its Params) loads without it
    import torch

CompressorKind = Literal["none", "topk", "randk", "qsgd"]
KRounding = Literal["ceil", "floor", "round"]


@attrs.frozen(slots=True, eq=False)
class Encoded:
    """A compressed vector of dimension ``dim``."""

    kind: str
    dim: int
    values: torch.Tensor                    # topk/randk: the k kept values; none: all; qsgd: unused
    indices: torch.Tensor | None = None     # topk: int64 positions
    seed: int = 0                           # randk: index seed
    scale: float = 1.0                      # randk: d/k when unbiased
    norm: float = 0.0                       # qsgd: ||v||_2 (as float32)
    levels: np.ndarray | None = None        # qsgd: uint level per coordinate in [0, s]
    signs: np.ndarray | None = None         # qsgd: bool, True = negative
    bits: int = 0                           # qsgd: level bits b

    @property
    def size_bytes(self) -> int:
        v = self.values.element_size()
        if self.kind == "topk":
            return self.values.numel() * (v + 4)
        if self.kind == "randk":
            return 8 + self.values.numel() * v
        if self.kind == "qsgd":
            return 4 + math.ceil(self.dim * (self.bits + 1) / 8)
        return self.values.numel() * v

    def to_bytes(self) -> bytes:
        """The wire encoding (what ``size_bytes`` measures)."""
        vals = self.values.detach().cpu().numpy()
        if self.kind == "topk":
            return vals.tobytes() + self.indices.cpu().numpy().astype(np.int32).tobytes()
        if self.kind == "randk":
            return np.int64(self.seed).tobytes() + vals.tobytes()
        if self.kind == "qsgd":
            b = self.bits
            bitmat = np.empty((self.dim, b + 1), dtype=np.uint8)
            bitmat[:, 0] = self.signs
            bitmat[:, 1:] = (self.levels[:, None] >> np.arange(b - 1, -1, -1)) & 1
            return np.float32(self.norm).tobytes() + np.packbits(bitmat.ravel()).tobytes()
        return vals.tobytes()

    def decode(self) -> torch.Tensor:
        import torch

        v = self.values
        if self.kind == "none":
            return v.clone()
        if self.kind == "qsgd":
            s = (1 << self.bits) - 1
            mag = torch.as_tensor(self.levels, dtype=v.dtype, device=v.device) * (self.norm / s)
            return torch.where(torch.as_tensor(self.signs, device=v.device), -mag, mag)
        out = torch.zeros(self.dim, dtype=v.dtype, device=v.device)
        idx = self.indices if self.kind == "topk" else randk_indices(self.seed, self.dim, v.numel(), v.device)
        out[idx] = v * self.scale
        return out


def randk_indices(seed: int, d: int, k: int, device) -> torch.Tensor:
    import torch

    return torch.as_tensor(np.random.default_rng(seed).choice(d, size=k, replace=False), device=device)


def kept_count(d: int, ratio: float, rounding: KRounding = "ceil") -> int:
    """k = ratio * d coordinates kept by top-k / rand-k, rounded up (``"ceil"``), down (``"floor"``) or to the
    nearest integer, halves up (``"round"``), then held in [1, d]. A product within 1e-9 of an integer counts
    as that integer (0.14 * 50 is 7.000000000000001 in floating point: 7, not 8, under any rounding)."""
    x = ratio * d
    n = math.floor(x + 0.5)
    if abs(x - n) <= 1e-9 * max(1.0, abs(x)):
        k = n
    elif rounding == "ceil":
        k = math.ceil(x)
    elif rounding == "floor":
        k = math.floor(x)
    elif rounding == "round":
        k = n
    else:
        raise ValueError(f"unknown rounding {rounding!r}")
    return max(1, min(d, int(k)))


@attrs.frozen
class Compressor:
    """``kind``: none | topk | randk | qsgd; ``ratio``: fraction of coordinates kept (topk, randk);
    ``unbiased``: rand-k scaled by d/k so E[C(v)] = v (Stich et al. 2018, Definition 2.1: the unscaled
    rand-k is a k/d-contraction); ``bits``: QSGD level bits b, s = 2^b - 1 levels (Alistarh et al.,
    NeurIPS 2017, Section 3.1: Q_s(v_i) = ||v|| sgn(v_i) xi_i(v, s), stochastic rounding, unbiased).
    ``rng`` (a numpy Generator) drives rand-k seeds and QSGD rounding; top-k needs none. ``rounding``: how
    k = ratio * d becomes an integer (``kept_count``: "ceil", the default, "floor" or "round")."""

    kind: CompressorKind = "topk"
    ratio: float = 0.1
    unbiased: bool = False
    bits: int = 4
    rng: np.random.Generator | None = attrs.field(default=None, eq=False, repr=False)
    rounding: KRounding = "ceil"

    def encoded_size(self, d: int, value_bytes: int) -> int:
        """Bytes of the encoding of any d-vector (it depends on d only), without encoding one."""
        if self.kind == "topk":
            return kept_count(d, self.ratio, self.rounding) * (value_bytes + 4)
        if self.kind == "randk":
            return 8 + kept_count(d, self.ratio, self.rounding) * value_bytes
        if self.kind == "qsgd":
            return 4 + math.ceil(d * (self.bits + 1) / 8)
        return d * value_bytes

    def topk_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """``self(row).decode()`` for every row of ``rows`` (top-k only; it draws nothing), in one ``topk`` call.
        A row's kept set is this compressor's when its k-th and (k+1)-th magnitudes differ (the set is then
        unique, whichever way ties inside it are broken); a row with a tie there is compressed alone."""
        import torch

        if self.kind != "topk":
            raise ValueError(f"topk_rows is for top-k, not {self.kind!r}")
        n, d = rows.shape
        k = kept_count(d, self.ratio, self.rounding)
        if k == d:
            return rows.clone()
        mags, idx = torch.topk(rows.abs(), k + 1, dim=1)
        tied = (mags[:, k - 1] == mags[:, k]).nonzero().flatten().tolist()
        idx = idx[:, :k]
        out = torch.zeros_like(rows).scatter_(1, idx, rows.gather(1, idx))  # decode: the kept values (scale 1)
        for r in tied:
            out[r] = self(rows[r]).decode()
        return out

    def __call__(self, v: torch.Tensor) -> Encoded:
        import torch

        d = v.numel()
        if self.kind == "none":
            return Encoded("none", d, v.clone())
        if self.kind == "topk":
            k = kept_count(d, self.ratio, self.rounding)
            idx = torch.topk(v.abs(), k, sorted=False).indices.sort().values
            return Encoded("topk", d, v[idx].clone(), indices=idx)
        if self.kind == "randk":
            k = kept_count(d, self.ratio, self.rounding)
            seed = int(self.rng.integers(2**63 - 1))
            idx = randk_indices(seed, d, k, v.device)
            return Encoded("randk", d, v[idx].clone(), seed=seed, scale=d / k if self.unbiased else 1.0)
        if self.kind == "qsgd":
            s = (1 << self.bits) - 1
            a = v.detach().cpu().double().numpy()
            norm = float(np.float32(np.linalg.norm(a)))
            if norm == 0.0:
                levels = np.zeros(d, dtype=np.int64)
            else:
                r = np.abs(a) / norm * s
                low = np.floor(r)
                levels = (low + (self.rng.random(d) < (r - low))).astype(np.int64).clip(0, s)
            return Encoded("qsgd", d, v[:0].clone(), norm=norm, levels=levels, signs=a < 0, bits=self.bits)
        raise ValueError(f"unknown compressor {self.kind!r}")


class ErrorFeedback:
    """Compression with memory: send C(e + v) and keep what was not sent, e <- e + v - C(e + v).

    Stich, Cordonnier, Jaggi, "Sparsified SGD with memory" (NeurIPS 2018), Algorithm 1 (mem-SGD);
    Karimireddy et al., "Error feedback fixes SignSGD" (ICML 2019), Algorithm 2
    (EF-SGD), its compress-and-remember steps.
    With it a biased compressor (top-k) converges at the uncompressed rate up to a delay term."""

    def __init__(self, compressor: Compressor, like: torch.Tensor):
        import torch

        self.compress = compressor
        self.e = torch.zeros_like(like)

    def __call__(self, v: torch.Tensor) -> Encoded:
        p = self.e + v
        c = self.compress(p)
        self.e = p - c.decode()
        return c


# why a method with public copies needs a fixed topology (``register(..., fixed_topology=PUBLIC_COPIES)``): a copy
# xhat_j is the sum of every q_j since the start, which only an agent that was j's neighbour all along holds
PUBLIC_COPIES = "keeps public copies of its neighbours, sums of their compressed differences since the start (CHOCO)"


class PublicCopies:
    """CHOCO public copies (Koloskova, Stich, Jaggi, ICML 2019, CHOCO-GOSSIP Algorithm 1 and CHOCO-SGD
    Algorithm 2): every agent keeps xhat_j for itself and each neighbour, all starting at 0. It sends
    q_i = C(x_i - xhat_i), every holder adds the q it receives, xhat_j += q_j, and the consensus
    step is x_i += gamma sum_j W_ij (xhat_j - xhat_i). Only compressed differences
    cross the network; the copies of xhat_i held by i and its neighbours stay equal while no q is lost."""

    def __init__(self, compressor: Compressor, own: torch.Tensor, neighbors):
        import torch

        self.compress = compressor
        self.own = torch.zeros_like(own)
        self.copies = {j: torch.zeros_like(own) for j in neighbors}

    def delta(self, x: torch.Tensor) -> Encoded:
        """q_i = C(x_i - xhat_i), already applied to this agent's own copy."""
        q = self.compress(x - self.own)
        self.own = self.own + q.decode()
        return q

    def receive(self, j: int, q: Encoded) -> None:
        self.copies[j] = self.copies[j] + q.decode()

    def consensus(self, x: torch.Tensor, weights: dict[int, float], gamma: float) -> torch.Tensor:
        out = x.clone()
        for j in sorted(self.copies):
            out.add_(self.copies[j] - self.own, alpha=gamma * weights[j])
        return out


class PublicCopyRows:
    """``PublicCopies`` of every agent of a run at once, for a round kernel (CHOCO-SGD, Koloskova, Stich, Jaggi,
    ICML 2019, Algorithm 2, steps (b), (d), (e)): own copies xhat_i as the rows of one tensor, each agent's copies
    of its in-neighbours in slots (ascending neighbour order, the order of its consensus sum), both kept in the
    parameter bank (``Agent.shared_state``: checkpointed). Every step is ``PublicCopies``' own float operation on
    each row, so a batch of one and a batch of all agents give the same bits."""

    def __init__(self, agents, compressors: list[Compressor], gamma: float, name: str = "choco"):
        self.comps = compressors
        self.nbrs = [sorted(a.weights) for a in agents]
        self.alphas = [[gamma * a.weights[j] for j in nb] for a, nb in zip(agents, self.nbrs, strict=True)]
        self.slot = [{j: s for s, j in enumerate(nb)} for nb in self.nbrs]
        p = agents[0].params.numel()
        self.own = agents[0].shared_state(f"{name}.own", (p,))  # (``name``: a kernel with copies of several variables)
        self.copies = agents[0].shared_state(f"{name}.copies", (max(map(len, self.nbrs), default=0), p))

    def delta(self, agents, x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """q_n = C(x_n - xhat_n) of each agent n of ``agents`` (rows of ``x``), already added to its own copy:
        the decoded q's and their encoded sizes. Top-k draws nothing: every row in one call; rand-k and QSGD
        draw from each agent's stream, one agent at a time."""
        import torch

        from netsim.sim.network import payload_size

        idx = torch.tensor([a.id for a in agents], device=x.device)
        d = x - self.own.index_select(0, idx)
        comp = self.comps[agents[0].id]
        if comp.kind == "topk":
            dense = comp.topk_rows(d)
            sizes = [comp.encoded_size(d.shape[1], d.element_size())] * len(agents)
        else:
            qs = [self.comps[a.id](v) for a, v in zip(agents, d.unbind(0), strict=True)]
            dense, sizes = torch.stack([q.decode() for q in qs]), [payload_size(q) for q in qs]
        self.own.index_copy_(0, idx, self.own.index_select(0, idx) + dense)
        return dense, sizes

    def receive(self, agents, got: list[dict]) -> None:
        """xhat_j += q_j for every decoded q_j that reached agent n of ``agents`` (``got[n]``: {j: q_j})."""
        import torch

        if len(agents) == 1:  # the events engine's batch of one: each slot's row as a view, the same sum
            i, slot, copies = agents[0].id, self.slot[agents[0].id], self.copies
            for j, q in got[0].items():
                row = copies[i, slot[j]]
                row.copy_(row + q)
            return
        pairs = [(a.id, self.slot[a.id][j], q) for a, g in zip(agents, got, strict=True) for j, q in g.items()]
        if pairs:
            dev = self.copies.device
            rows = torch.tensor([r for r, _, _ in pairs], device=dev)
            slots = torch.tensor([s for _, s, _ in pairs], device=dev)
            self.copies[rows, slots] = self.copies[rows, slots] + torch.stack([q for *_, q in pairs])

    def consensus(self, agents, x: torch.Tensor) -> list:
        """x_n + gamma sum_j W_nj (xhat_j - xhat_n) of each agent n, as ``MixUpdate``'s for the bank."""
        import torch

        from netsim.compute.mixing import MixUpdate

        if len(agents) == 1:  # a batch of one: its rows as views, the same differences
            i = agents[0].id
            m = len(self.nbrs[i])
            return [MixUpdate(i, x[0], 1.0, self.alphas[i], list((self.copies[i, :m] - self.own[i]).unbind(0)), 0.0,
                              None)]
        idx = torch.tensor([a.id for a in agents], device=x.device)
        diffs = self.copies.index_select(0, idx) - self.own.index_select(0, idx).unsqueeze(1)
        return [MixUpdate(a.id, x[n], 1.0, self.alphas[a.id], list(diffs[n, :len(self.nbrs[a.id])].unbind(0)), 0.0,
                          None) for n, a in enumerate(agents)]
