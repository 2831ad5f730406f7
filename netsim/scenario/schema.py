"""The scenario file's schema: frozen attrs records, pure data (imports nothing of netsim's core).

Units: simulated time in seconds, sizes in bytes, bandwidth in bytes per second.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from netsim.scenario.structure import at_least, field, nonneg, positive, probability

DistKind = Literal["constant", "uniform", "exponential", "lognormal", "normal"]


@attrs.frozen
class Dist:
    """A scalar distribution. ``constant``: value; ``uniform``: low, high; ``exponential``: mean;
    ``lognormal``: mean (of the variable itself) and sigma (of its log); ``normal``: mean, sigma."""

    kind: DistKind = "constant"
    value: float | None = None
    low: float | None = None
    high: float | None = None
    mean: float | None = field(None, check=lambda v: None if v is None or v >= 0 else "must be >= 0")
    sigma: float | None = field(None, check=lambda v: None if v is None or v >= 0 else "must be >= 0")

    def __check__(self) -> tuple[str, str] | None:
        need = {
            "constant": ("value",),
            "uniform": ("low", "high"),
            "exponential": ("mean",),
            "lognormal": ("mean", "sigma"),
            "normal": ("mean", "sigma"),
        }[self.kind]
        for key in need:
            if getattr(self, key) is None:
                return key, f"required for kind = {self.kind!r} (needs {', '.join(need)})"
        for key in ("value", "low", "high", "mean", "sigma"):
            if key not in need and getattr(self, key) is not None:
                return key, f"not used by kind = {self.kind!r} (it takes {', '.join(need)})"
        if self.kind == "uniform" and not self.low <= self.high:  # type: ignore[operator]
            return "high", f"must be >= low ({self.low}), got {self.high}"
        return None

    def bounds_nonneg(self) -> bool:
        if self.kind == "constant":
            return self.value >= 0  # type: ignore[operator]
        if self.kind == "uniform":
            return self.low >= 0  # type: ignore[operator]
        return self.kind != "normal"


def nonneg_dist(d: Dist) -> str | None:
    if d.bounds_nonneg():
        return None
    return "must not produce negative values (use constant/uniform >= 0, exponential or lognormal)"


@attrs.frozen
class RunSpec:
    seed: int = field(0, check=lambda v: nonneg(v) or (None if v < 2**63 else f"must be < 2^63, got {v}"),
                      doc="root of every random stream")
    until: float | None = field(None, check=lambda v: None if v is None or v > 0 else "must be > 0",
                                doc="stop at this simulated time (s)")
    rounds: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                               doc="stop when every agent has been activated this many times")
    out: str = field("runs/{name}", doc="output folder; {name} is the scenario file's stem")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trace: bool = True
    trace_flush_every: int = field(8192, check=at_least(1), doc="events per trace batch flushed to disk")
    checkpoint_every: float | None = field(None, check=lambda v: None if v is None or v > 0 else "must be > 0",
                                           doc="write a checkpoint every this many simulated seconds "
                                               "(netsim resume continues from the last one)")
    checkpoint_every_rounds: int | None = field(
        None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
        doc="write a checkpoint each time the agents' mean activation count passes a multiple of this")
    checkpoint_keep: int = field(2, check=at_least(1), doc="checkpoints kept (the newest; older are deleted)")

    def __check__(self) -> tuple[str, str] | None:
        if self.until is None and self.rounds is None:
            return "until", "give run.until (simulated seconds) and/or run.rounds"
        return None


@attrs.frozen
class ActivationSpec:
    """When an agent wakes, on its own clock: every ``period``; at ``rate`` per second (Poisson);
    or each ``period`` with probability ``p`` (Bernoulli per round)."""

    kind: Literal["periodic", "poisson", "bernoulli"] = "periodic"
    period: float = field(1.0, check=positive)
    rate: float = field(1.0, check=positive)
    p: float = field(1.0, check=lambda v: None if 0 < v <= 1 else f"must be in (0, 1], got {v}")


@attrs.frozen
class OfflineSpec:
    """Agent ``agent`` is offline during [start, end) (global time, s)."""

    agent: int = field(check=nonneg)
    start: float = field(check=nonneg)
    end: float = field(check=nonneg)

    def __check__(self) -> tuple[str, str] | None:
        return None if self.end > self.start else ("end", f"must be > start ({self.start}), got {self.end}")


@attrs.frozen
class ChurnSpec:
    """Random churn: each agent alternates online/offline periods with exponential durations
    (means in s), starting online; drawn from the agent's own ``churn`` stream."""

    mean_online: float = field(check=positive, doc="mean online period (s)")
    mean_offline: float = field(check=positive, doc="mean offline period (s)")


@attrs.frozen
class AgentsSpec:
    count: int = field(check=lambda v: at_least(2)(v) or (None if v <= 10**6 else f"must be <= 1000000, got {v}"),
                       doc="number of agents")
    clock_offset: Dist = field(Dist("constant", value=0.0), check=nonneg_dist)
    clock_drift: Dist = field(Dist("constant", value=0.0), doc="relative rate error: local = offset + (1+drift) t")
    clock_jitter: Dist | None = field(None, doc="random delay (local s) added to each activation")
    compute_time: Dist = field(Dist("constant", value=0.01), check=nonneg_dist, doc="seconds per gradient")
    activation: ActivationSpec = ActivationSpec()
    stragglers: tuple[int, ...] = field((), doc="agents whose compute time is multiplied by straggler_factor")
    straggler_factor: float = field(5.0, check=positive)
    offline: tuple[OfflineSpec, ...] | None = field(None, doc="scheduled offline intervals [[agents.offline]]")
    churn: ChurnSpec | None = field(None, doc="random on/off churn (exponential periods)")
    availability: str | None = field(None, doc="availability trace (FedScale-style JSON, see docs/traces.md)")

    def __check__(self) -> tuple[str, str] | None:
        bad = [a for a in self.stragglers if not 0 <= a < self.count]
        if bad:
            return "stragglers", f"agent ids must be in [0, {self.count - 1}], got {bad}"
        if self.clock_drift.kind == "constant" and self.clock_drift.value <= -1:  # type: ignore[operator]
            return "clock_drift.value", "must be > -1 (a clock cannot stop or run backwards)"
        return None


TopologyKind = Literal[
    "ring", "torus", "grid", "complete", "star", "erdos_renyi", "random_regular", "exponential", "edges_file"
]
MixingKind = Literal["metropolis_hastings", "uniform", "max_degree", "column_stochastic"]


@attrs.frozen
class TopologySpec:
    kind: TopologyKind = "ring"
    directed: bool = False
    p: float = field(0.3, check=probability, doc="edge probability (erdos_renyi)")
    degree: int = field(4, check=at_least(1), doc="degree (random_regular)")
    rows: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                             doc="rows of a torus/grid (default: as square as possible)")
    path: str | None = field(None, doc="edges file: one 'src dst [weight]' per line")
    mixing: MixingKind | None = field(None, doc="default: metropolis_hastings, column_stochastic if directed")
    dynamic: DynamicTopologySpec | None = field(None, doc="time-varying graph (sim/dynamic.py)")

    def __check__(self) -> tuple[str, str] | None:
        if self.kind == "edges_file" and not self.path:
            return "path", "required for kind = 'edges_file'"
        if self.directed and self.mixing in ("metropolis_hastings", "max_degree"):
            return "mixing", f"{self.mixing!r} needs an undirected graph; use 'column_stochastic' or 'uniform'"
        return None

    @property
    def mixing_kind(self) -> str:
        return self.mixing or ("column_stochastic" if self.directed else "metropolis_hastings")


@attrs.frozen
class DynamicTopologySpec:
    """The graph an agent uses changes each epoch: its activation count ('round') or floor(t / period).
    ``one_peer_exponential``: send to i + 2^(k mod m), weights 1/2-1/2; ``resample``: a fresh draw of
    the topology's random kind; ``schedule``: cycle through ``graphs``."""

    kind: Literal["one_peer_exponential", "resample", "schedule"] = "one_peer_exponential"
    every: Literal["round", "period"] = field("round", doc="epoch = the agent's round, or the global clock")
    period: float = field(1.0, check=positive, doc="seconds per epoch when every = 'period'")
    graphs: tuple[TopologySpec, ...] | None = field(None, doc="schedule: topologies used in turn")

    def __check__(self) -> tuple[str, str] | None:
        if self.kind == "schedule" and not self.graphs:
            return "graphs", "required for kind = 'schedule' (a list of topology tables)"
        if self.kind != "schedule" and self.graphs:
            return "graphs", f"only used by kind = 'schedule', not {self.kind!r}"
        if any(g.dynamic is not None for g in self.graphs or ()):
            return "graphs", "a scheduled topology cannot itself be dynamic"
        return None


def _opt_positive(v: float | None) -> str | None:
    return None if v is None or v > 0 else f"must be > 0, got {v}"


def _opt_loss(v: float | None) -> str | None:
    return None if v is None or 0 <= v <= 1 else f"must be in [0, 1], got {v}"


@attrs.frozen
class BurstSpec:
    """Gilbert-Elliott loss: a two-state Markov chain per directed link, stepped once per message.
    Stationary P(bad) = p_enter / (p_enter + p_exit); mean bad run = 1 / p_exit messages."""

    p_enter: float = field(check=probability, doc="P(good -> bad) per message")
    p_exit: float = field(check=lambda v: None if 0 < v <= 1 else f"must be in (0, 1], got {v}",
                          doc="P(bad -> good) per message")
    loss_good: float = field(0.0, check=probability, doc="loss probability in the good state")
    loss_bad: float = field(1.0, check=probability, doc="loss probability in the bad state")


@attrs.frozen
class OutageSpec:
    """Messages sent during [start, end) are dropped ('outage'); src/dst omitted = any agent."""

    start: float = field(check=nonneg)
    end: float = field(check=nonneg)
    src: int | None = field(None, check=lambda v: None if v is None or v >= 0 else "must be >= 0")
    dst: int | None = field(None, check=lambda v: None if v is None or v >= 0 else "must be >= 0")

    def __check__(self) -> tuple[str, str] | None:
        return None if self.end > self.start else ("end", f"must be > start ({self.start}), got {self.end}")


@attrs.frozen
class LinkOverride:
    """Per-link model for src -> dst (directed, so links can be asymmetric); ``both`` = also dst -> src."""

    src: int = field(check=nonneg)
    dst: int = field(check=nonneg)
    latency: Dist | None = field(None, check=lambda d: None if d is None else nonneg_dist(d))
    loss: float | None = field(None, check=_opt_loss)
    bandwidth: float | None = field(None, check=_opt_positive, doc="bytes/s on this link")
    both: bool = False


@attrs.frozen
class NetworkSpec:
    latency: Dist = field(Dist("constant", value=0.01), check=nonneg_dist, doc="one-way propagation delay (s)")
    bandwidth: float | None = field(None, check=lambda v: None if v is None or v > 0 else "must be > 0",
                                    doc="bytes/s per link; transfer time = size / bandwidth; omit for infinite")
    loss: float = field(0.0, check=lambda v: None if 0 <= v < 1 else f"must be in [0, 1), got {v}")
    uplink: float | None = field(None, check=_opt_positive,
                                 doc="bytes/s of each node's uplink, shared FIFO by all its sends")
    burst: BurstSpec | None = field(None, doc="Gilbert-Elliott bursty loss (replaces Bernoulli loss)")
    outages: tuple[OutageSpec, ...] | None = field(None, doc="scheduled link outages [[network.outages]]")
    links: tuple[LinkOverride, ...] | None = field(None, doc="per-link overrides [[network.links]]")
    trace: str | None = field(None, doc="per-link measurement CSV: time,src,dst,latency,bandwidth,loss")


@attrs.frozen
class DataSpec:
    kind: Literal["synthetic", "libsvm", "mnist", "cifar10"] = "synthetic"
    samples: int = field(2000, check=at_least(2), doc="synthetic: number of samples")
    features: int = field(20, check=at_least(1), doc="synthetic: dimension")
    noise: float = field(0.1, check=nonneg, doc="synthetic: label-flip probability scale")
    path: str | None = field(None, doc="libsvm: training file; mnist/cifar10: folder (default 'mnist' / "
                                       "'cifar-10-batches-bin'); relative paths are searched in $NETSIM_DATA")
    test_path: str | None = field(None, doc="libsvm: test file (default: split test_fraction off the training file)")
    test_fraction: float = field(0.2, check=lambda v: None if 0 < v < 1 else f"must be in (0, 1), got {v}")
    normalize: bool = field(False, doc="scale every feature row (train and test) to unit L2 norm")
    partition: Literal["iid", "dirichlet", "shards", "quantity", "label", "label_share"] = "iid"
    alpha: float = field(0.5, check=positive, doc="Dirichlet concentration (small = non-IID), also 'quantity'")
    shards: int = field(2, check=at_least(1), doc="partition = 'shards': label-sorted shards per agent")
    validation: int = field(0, check=at_least(0), doc="test rows held out (seeded) as a validation set every "
                                                     "agent may read (sim.X_val); evaluation uses the rest")
    share: float = field(0.4, check=lambda v: None if 0 <= v <= 1 else f"must be in [0, 1], got {v}",
                         doc="partition = 'label_share': fraction of class c held by agent c mod m")

    def __check__(self) -> tuple[str, str] | None:
        if self.kind == "libsvm" and not self.path:
            return "path", "required for kind = 'libsvm'"
        if self.kind == "synthetic" and self.samples * self.features > 2**30:
            return "samples", (f"samples x features must be <= 2^30 (8 GiB of float64), got "
                               f"{self.samples} x {self.features}")
        return None


@attrs.frozen
class ModelSpec:
    kind: Literal["logistic", "multinomial", "mlp", "cnn", "vgg11", "resnet18"] = "logistic"
    hidden: tuple[int, ...] = field((64,), check=lambda v: None if all(1 <= h <= 2**16 for h in v)
                                    else f"widths must be in [1, 65536], got {list(v)}",
                                    doc="mlp: hidden layer widths")
    l2: float = field(0.0, check=nonneg, doc="L2 regularisation weight")
    dtype: Literal["float32", "float64"] = "float32"


@attrs.frozen
class AlgorithmSpec:
    """``name`` of a registered algorithm; every other key is that algorithm's parameter."""

    name: str = field(doc="registered algorithm, e.g. 'dpsgd' or 'gossip'")
    params: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class EvaluationSpec:
    every: float = field(1.0, check=positive, doc="simulated seconds between evaluations")
    metrics: tuple[Literal["loss", "accuracy", "consensus", "agent_accuracy", "tracking"], ...] = (
        "loss", "accuracy", "consensus")
    format: Literal["csv", "parquet"] = "csv"
    target_accuracy: float | None = field(
        None, check=lambda v: None if v is None or 0 < v <= 1 else f"must be in (0, 1], got {v}",
        doc="summary.time_to_target = first evaluation time whose accuracy >= this")


def _open_unit(v: float) -> str | None:
    return None if 0 < v < 1 else f"must be in (0, 1), got {v}"


@attrs.frozen
class PrivacySpec:
    """How releases are accounted (netsim.privacy, docs/privacy.md). Noise itself is the algorithm's
    parameter; this section says at which delta epsilon is reported, whether random activation is
    credited as amplification, the per-agent budget cap, and which seed paper's closed form to show."""

    delta: float = field(1e-5, check=_open_unit, doc="report epsilon(delta) at this delta")
    accounting: Literal["observed", "amplified"] = field(
        "observed", doc="'amplified' credits hidden Bernoulli activation as subsampling (seed 003)")
    epsilon_cap: float | None = field(
        None, check=lambda v: None if v is None or v > 0 else f"must be > 0, got {v}",
        doc="per-agent budget: an agent stops releasing before exceeding it")
    closed_form: Literal["none", "seed000", "seed001", "seed003", "seed004"] = field(
        "none", doc="seed paper whose own privacy formula is reported beside the accountants")
    delta0: float = field(1e-5, check=_open_unit, doc="per-release delta of the classical Gaussian bound")
    c2: float = field(0.3724, check=positive, doc="seed 004's unspecified constant c_2 (Theorem 2)")


@attrs.frozen
class Scenario:
    run: RunSpec
    agents: AgentsSpec
    algorithm: AlgorithmSpec
    topology: TopologySpec = TopologySpec()
    network: NetworkSpec = NetworkSpec()
    data: DataSpec = DataSpec()
    model: ModelSpec = ModelSpec()
    evaluation: EvaluationSpec = EvaluationSpec()
    privacy: PrivacySpec | None = None
    name: str = "scenario"
