"""The scenario file's schema: frozen attrs records, pure data (imports nothing of netsim's core).

Units: simulated time in seconds, sizes in bytes, bandwidth in bytes per second.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs

from netsim.scenario.structure import at_least, field, fraction, nonneg, positive, probability

DistKind = Literal["constant", "uniform", "exponential", "lognormal", "normal"]

MAX_SECONDS = 1e9  # about 32 years: the largest time a distribution of seconds may draw
MAX_LOG_SIGMA = 10.0  # a lognormal with a larger sigma has nearly all its mass at 0 and its mean in the tail
TAIL_SIGMAS = 10.0  # normal/lognormal draws are bounded at mean +- 10 sigma (all but ~1e-23 of them)
TAIL_MEANS = 40.0  # exponential draws are bounded at 40 means (all but ~4e-18 of them)


def _finite(v: float | None) -> str | None:
    return None if v is None or math.isfinite(v) else f"must be a finite number, got {v}"


def _finite_nonneg(v: float | None) -> str | None:
    return _finite(v) or (None if v is None or v >= 0 else f"must be >= 0, got {v}")


@attrs.frozen
class Dist:
    """A scalar distribution. ``constant``: value; ``uniform``: low, high; ``exponential``: mean;
    ``lognormal``: mean (of the variable itself) and sigma (of its log); ``normal``: mean, sigma."""

    kind: DistKind = field("constant", doc="constant (value), uniform (low, high), exponential (mean), "
                                           "lognormal (mean, sigma of the log), normal (mean, sigma)")
    value: float | None = field(None, check=_finite, doc="constant: the value")
    low: float | None = field(None, check=_finite, doc="uniform: lower bound")
    high: float | None = field(None, check=_finite, doc="uniform: upper bound (>= low)")
    mean: float | None = field(None, check=_finite,
                               doc="exponential, lognormal: mean of the variable (>= 0); normal: its mean")
    sigma: float | None = field(None, check=_finite_nonneg,
                                doc=f"normal: standard deviation; lognormal: that of the log (<= {MAX_LOG_SIGMA:g})")

    def problem(self) -> tuple[str, str] | None:
        """(parameter, what is allowed) for the first bad parameter, or None. The schema runs this when a
        file is read and the samplers (sim/dists.py) again, for distributions built in code."""
        need = {
            "constant": ("value",),
            "uniform": ("low", "high"),
            "exponential": ("mean",),
            "lognormal": ("mean", "sigma"),
            "normal": ("mean", "sigma"),
        }.get(self.kind)
        if need is None:
            return "kind", f"got {self.kind!r}; allowed: constant, uniform, exponential, lognormal, normal"
        for key in need:
            if getattr(self, key) is None:
                return key, f"required for kind = {self.kind!r} (needs {', '.join(need)})"
        for key in ("value", "low", "high", "mean", "sigma"):
            v = getattr(self, key)
            if key not in need and v is not None:
                return key, f"not used by kind = {self.kind!r} (it takes {', '.join(need)})"
            if v is not None and (msg := (_finite_nonneg if key == "sigma" else _finite)(v)):
                return key, msg
        if self.kind in ("exponential", "lognormal") and self.mean < 0:  # type: ignore[operator]
            return "mean", f"must be >= 0 for kind = {self.kind!r}, got {self.mean}"
        if self.kind == "uniform":
            if not self.low <= self.high:  # type: ignore[operator]
                return "high", f"must be >= low ({self.low}), got {self.high}"
            if not math.isfinite(self.high - self.low):  # type: ignore[operator]
                return "high", f"high - low must be a finite number, got {self.high} - ({self.low})"
        if self.kind == "lognormal" and self.sigma > MAX_LOG_SIGMA:  # type: ignore[operator]
            return "sigma", f"must be <= {MAX_LOG_SIGMA:g} for kind = 'lognormal', got {self.sigma}"
        return None

    def __check__(self) -> tuple[str, str] | None:
        return self.problem()

    def bounds_nonneg(self) -> bool:
        if self.kind == "constant":
            return self.value >= 0  # type: ignore[operator]
        if self.kind == "uniform":
            return self.low >= 0  # type: ignore[operator]
        return self.kind != "normal"

    def support(self) -> tuple[float, float]:
        """(lo, hi) holding every draw netsim can make in practice: the bounds of constant and uniform;
        exponential up to 40 means; normal mean +- 10 sigma; lognormal exp(mu +- 10 sigma)."""
        if self.kind == "constant":
            return self.value, self.value  # type: ignore[return-value]
        if self.kind == "uniform":
            return self.low, self.high  # type: ignore[return-value]
        if self.kind == "exponential":
            return 0.0, TAIL_MEANS * self.mean  # type: ignore[operator]
        if self.kind == "normal":
            return (self.mean - TAIL_SIGMAS * self.sigma,  # type: ignore[operator]
                    self.mean + TAIL_SIGMAS * self.sigma)  # type: ignore[operator]
        if not self.mean:
            return 0.0, 0.0
        mu = math.log(self.mean) - self.sigma**2 / 2  # type: ignore[operator, arg-type]
        return (math.exp(min(mu - TAIL_SIGMAS * self.sigma, 709.0)),  # type: ignore[operator]
                math.exp(min(mu + TAIL_SIGMAS * self.sigma, 709.0)))  # type: ignore[operator]

    def tail_note(self) -> str:
        return {"exponential": " (exponential: up to 40 means)", "normal": " (normal: mean +- 10 sigma)",
                "lognormal": " (lognormal: exp(mu +- 10 sigma))"}.get(self.kind, "")


MIN_SECONDS = 1e-9  # the shortest period: simulated time must move forward by it (floats near 1e9 s do)


def duration(v: float) -> str | None:
    """A period, interval or mean duration (s): in [MIN_SECONDS, MAX_SECONDS]."""
    return None if MIN_SECONDS <= v <= MAX_SECONDS else f"must be in [{MIN_SECONDS:g}, {MAX_SECONDS:g}] s, got {v}"


def per_second(v: float) -> str | None:
    return None if 1 / MAX_SECONDS <= v <= 1 / MIN_SECONDS else (
        f"must be in [{1 / MAX_SECONDS:g}, {1 / MIN_SECONDS:g}] per second, got {v}")


def nonneg_dist(d: Dist) -> str | None:
    if d.bounds_nonneg():
        return None
    return "must not produce negative values (use constant/uniform >= 0, exponential or lognormal)"


def seconds_dist(d: Dist | None) -> str | None:
    """A distribution of durations or times: never negative, never beyond MAX_SECONDS."""
    if d is None:
        return None
    if msg := nonneg_dist(d):
        return msg
    hi = d.support()[1]
    if hi > MAX_SECONDS:
        return f"draws values up to {hi:.3g} s{d.tail_note()}; must stay <= {MAX_SECONDS:.0e} s (about 32 years)"
    return None


def drift_dist(d: Dist) -> str | None:
    """Clock drift: local = offset + (1 + drift) t needs -1 < drift; beyond 1 a clock runs more than
    twice as fast as real time (real clocks drift by parts per million)."""
    lo, hi = d.support()
    if lo <= -1 or hi > 1:
        return (f"draws values in [{lo:.3g}, {hi:.3g}]{d.tail_note()}; a drift must stay in (-1, 1] "
                "(a clock that stops, runs backwards or at more than twice real time is refused)")
    return None


@attrs.frozen
class RunSpec:
    seed: int = field(0, check=lambda v: nonneg(v) or (None if v < 2**63 else f"must be < 2^63, got {v}"),
                      doc="root of every random stream")
    until: float | None = field(None, check=lambda v: None if v is None or v > 0 else "must be > 0",
                                doc="stop at this simulated time (s)")
    rounds: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                               doc="stop when every agent has been activated this many times")
    out: str = field("runs/{name}", doc="output folder; {name} is the scenario file's stem")
    device: Literal["auto", "cpu", "cuda"] = field("auto", doc="where models and gradients live; auto: cuda "
                                                           "when torch sees a GPU")
    trace: bool = field(True, doc="write trace.arrows (every event); false: metrics and summary only")
    trace_flush_every: int = field(8192, check=at_least(1), doc="events per trace batch flushed to disk")
    checkpoint_every: float | None = field(None, check=lambda v: None if v is None or v > 0 else "must be > 0",
                                           doc="write a checkpoint every this many simulated seconds "
                                               "(netsim resume continues from the last one)")
    checkpoint_every_rounds: int | None = field(
        None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
        doc="write a checkpoint each time the agents' mean activation count passes a multiple of this")
    checkpoint_keep: int = field(2, check=at_least(1), doc="checkpoints kept (the newest; older are deleted)")
    stop_on_divergence: bool = field(
        False, quiet_default=True,
        doc="stop at the evaluation that finds the run diverged (model parameters or metrics not finite; "
            "stop_reason 'diverged'); either way summary.json's 'diverged' says when and in which agent")

    def __check__(self) -> tuple[str, str] | None:
        if self.until is None and self.rounds is None:
            return "until", "give run.until (simulated seconds) and/or run.rounds"
        return None


@attrs.frozen
class ActivationSpec:
    """When an agent wakes, on its own clock: every ``period``; at ``rate`` per second (Poisson);
    or each ``period`` with probability ``p`` (Bernoulli per round)."""

    kind: Literal["periodic", "poisson", "bernoulli"] = field("periodic", doc="how agents wake")
    period: float = field(1.0, check=duration, doc="seconds between ticks (local clock)",
                          when={"kind": ("periodic", "bernoulli")})
    rate: float = field(1.0, check=per_second, doc="activations per second (local clock)", when={"kind": ("poisson",)})
    p: float = field(1.0, check=fraction,
                     doc="probability of waking at each tick", when={"kind": ("bernoulli",)})
    schedule: str | None = field(None, doc="an activation schedule a --plugin registers (register_schedule), "
                                           "made from this table; omit for kind's built-in schedule")


@attrs.frozen
class OfflineSpec:
    """Agent ``agent`` is offline during [start, end) (global time, s)."""

    agent: int = field(check=nonneg, doc="agent id")
    start: float = field(check=nonneg, doc="global time (s) it goes offline")
    end: float = field(check=nonneg, doc="global time (s) it is back (> start)")

    def __check__(self) -> tuple[str, str] | None:
        return None if self.end > self.start else ("end", f"must be > start ({self.start}), got {self.end}")


@attrs.frozen
class ChurnSpec:
    """Random churn: each agent alternates online/offline periods with exponential durations
    (means in s), starting online; drawn from the agent's own ``churn`` stream."""

    mean_online: float = field(check=duration, doc="mean online period (s)")
    mean_offline: float = field(check=duration, doc="mean offline period (s)")


@attrs.frozen
class AgentsSpec:
    count: int = field(check=lambda v: at_least(2)(v) or (None if v <= 10**6 else f"must be <= 1000000, got {v}"),
                       doc="number of agents")
    clock_offset: Dist = field(Dist("constant", value=0.0), check=seconds_dist,
                               doc="each agent's clock reading at t = 0 (s), drawn once per agent")
    clock_drift: Dist = field(Dist("constant", value=0.0), check=drift_dist,
                              doc="relative rate error, in (-1, 1]: local = offset + (1+drift) t")
    clock_jitter: Dist | None = field(None, check=seconds_dist,
                                      doc="random delay (local s) added to each activation")
    compute_time: Dist = field(Dist("constant", value=0.01), check=seconds_dist, doc="seconds per gradient")
    activation: ActivationSpec = field(ActivationSpec(), doc="when agents wake, on their own clocks")
    stragglers: tuple[int, ...] = field((), doc="agents whose compute time is multiplied by straggler_factor")
    straggler_factor: float = field(5.0, check=positive, doc="compute-time multiplier of the stragglers")
    offline: tuple[OfflineSpec, ...] | None = field(None, doc="scheduled offline intervals [[agents.offline]]")
    churn: ChurnSpec | None = field(None, doc="random on/off churn (exponential periods)")
    availability: str | None = field(None, doc="availability trace (FedScale-style JSON, see docs/traces.md)")

    def __check__(self) -> tuple[str, str] | None:
        bad = [a for a in self.stragglers if not 0 <= a < self.count]
        if bad:
            return "stragglers", f"agent ids must be in [0, {self.count - 1}], got {bad}"
        return None

    def wake_together(self) -> bool:
        """Whether the agents wake at shared instants: periodic or Bernoulli ticks (those that wake, together) on
        identical clocks (no offset, drift or jitter). Otherwise each activation, and the gradient it asks for,
        comes alone."""
        same_clocks = all(d.kind == "constant" and d.value == 0.0 for d in (self.clock_offset, self.clock_drift))
        return self.activation.kind != "poisson" and same_clocks and self.clock_jitter is None


TopologyKind = Literal[
    "ring", "torus", "grid", "complete", "star", "erdos_renyi", "random_regular", "exponential", "edges_file",
    "networkx",
]
MixingKind = Literal["metropolis_hastings", "uniform", "max_degree", "column_stochastic"]


@attrs.frozen
class TopologySpec:
    kind: TopologyKind = field("ring", doc="the communication graph")
    directed: bool = field(False, doc="directed edges (push-sum style algorithms, column-stochastic mixing)")
    p: float = field(0.3, check=probability, doc="edge probability (erdos_renyi)", when={"kind": ("erdos_renyi",)})
    degree: int = field(4, check=at_least(1), doc="degree (random_regular)", when={"kind": ("random_regular",)})
    rows: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                             doc="rows of a torus/grid (default: as square as possible; a prime agent count is "
                                 "refused, rows = 1 makes it a line or ring)")
    path: str | None = field(None, doc="edges file: one 'src dst [weight]' per line")
    generator: str | None = field(None, doc="kind = 'networkx': a graph generator of networkx.generators by "
                                            "name, e.g. 'complete_bipartite_graph', 'watts_strogatz_graph'")
    args: tuple[Any, ...] | None = field(None, doc="kind = 'networkx': the generator's positional arguments")
    kwargs: dict[str, Any] | None = field(None, doc="kind = 'networkx': its keyword arguments "
                                                           "(a 'seed' it takes is drawn from the run)")
    mixing: MixingKind | None = field(None, doc="default: metropolis_hastings, column_stochastic if directed")
    dynamic: DynamicTopologySpec | None = field(None, doc="time-varying graph (sim/dynamic.py)")

    def __check__(self) -> tuple[str, str] | None:
        if self.kind == "edges_file" and not self.path:
            return "path", "required for kind = 'edges_file'"
        if (self.kind == "networkx") != (self.generator is not None):
            return "generator", "a networkx generator name is given exactly when kind = 'networkx'"
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

    kind: Literal["one_peer_exponential", "resample", "schedule"] = field(
        "one_peer_exponential", doc="how the graph changes each epoch")
    every: Literal["round", "period"] = field("round", doc="epoch = the agent's round, or the global clock")
    period: float = field(1.0, check=duration, doc="seconds per epoch when every = 'period'",
                          when={"every": ("period",)})
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
    p_exit: float = field(check=fraction,
                          doc="P(bad -> good) per message")
    loss_good: float = field(0.0, check=probability, doc="loss probability in the good state")
    loss_bad: float = field(1.0, check=probability, doc="loss probability in the bad state")


@attrs.frozen
class OutageSpec:
    """Messages sent during [start, end) are dropped ('outage'); src/dst omitted = any agent."""

    start: float = field(check=nonneg, doc="global time (s) the outage starts")
    end: float = field(check=nonneg, doc="global time (s) it ends (> start)")
    src: int | None = field(None, check=lambda v: None if v is None or v >= 0 else "must be >= 0",
                            doc="sender it applies to (default: any)")
    dst: int | None = field(None, check=lambda v: None if v is None or v >= 0 else "must be >= 0",
                            doc="receiver it applies to (default: any)")

    def __check__(self) -> tuple[str, str] | None:
        return None if self.end > self.start else ("end", f"must be > start ({self.start}), got {self.end}")


@attrs.frozen
class LinkOverride:
    """Per-link model for src -> dst (directed, so links can be asymmetric); ``both`` = also dst -> src."""

    src: int = field(check=nonneg, doc="sending agent")
    dst: int = field(check=nonneg, doc="receiving agent")
    latency: Dist | None = field(None, check=seconds_dist, doc="one-way delay (s) on this link")
    loss: float | None = field(None, check=_opt_loss, doc="loss probability on this link")
    bandwidth: float | None = field(None, check=_opt_positive, doc="bytes/s on this link")
    both: bool = field(False, doc="also apply to dst -> src")


@attrs.frozen
class NetworkSpec:
    latency: Dist = field(Dist("constant", value=0.01), check=seconds_dist, doc="one-way propagation delay (s)")
    bandwidth: float | None = field(None, check=lambda v: None if v is None or v > 0 else "must be > 0",
                                    doc="bytes/s per link; transfer time = size / bandwidth; omit for infinite")
    loss: float = field(0.0, check=lambda v: None if 0 <= v < 1 else f"must be in [0, 1), got {v}",
                        doc="probability that a message is dropped (Bernoulli, per message)")
    uplink: float | None = field(None, check=_opt_positive,
                                 doc="bytes/s of each node's uplink, shared FIFO by all its sends")
    burst: BurstSpec | None = field(None, doc="Gilbert-Elliott bursty loss (replaces Bernoulli loss)")
    outages: tuple[OutageSpec, ...] | None = field(None, doc="scheduled link outages [[network.outages]]")
    links: tuple[LinkOverride, ...] | None = field(None, doc="per-link overrides [[network.links]]")
    trace: str | None = field(None, doc="per-link measurement CSV: time,src,dst,latency,bandwidth,loss")
    model: str | None = field(None, doc="a link model a --plugin registers (register_link_model): it decides "
                                        "every message; omit for the built-in models")


PARTITIONS = ("iid", "dirichlet_equal", "dirichlet_classes", "shards", "quantity", "label", "label_share",
              "classes", "alternate", "groups", "file")
DATASETS = ("synthetic", "libsvm", "mnist", "cifar10", "table")
"""The built-in data kinds; any other identifier names a registered dataset plugin (checked when prepared)."""
MODELS = ("logistic", "multinomial", "mlp", "cnn", "vgg11", "resnet18")
"""The built-in model kinds; any other identifier names a registered model plugin (checked when prepared)."""


def _plugin_name(builtin: tuple[str, ...]):
    """A built-in kind, or an identifier: a plugin's name, looked up when the run is prepared (plugins
    register theirs after the file is read)."""
    def check(v: str) -> str | None:
        if v in builtin or v.isidentifier():
            return None
        return f"got {v!r}; allowed: {', '.join(repr(k) for k in builtin)}, or a registered plugin's name"
    return check


_dataset_kind = _plugin_name(DATASETS)
_model_kind = _plugin_name(MODELS)


def _keys(cls: type) -> list[str]:
    return [f.name for f in attrs.fields(cls) if f.name != "params"]


def _partition_kind(v: str) -> str | None:
    if v == "dirichlet":
        return ("ambiguous: use 'dirichlet_equal' (Hsu et al. 2019: each agent draws its class mix from "
                "Dir(alpha), equal shards) or 'dirichlet_classes' (each class's rows split over agents by "
                "Dir(alpha) proportions, unequal shards)")
    return None if v in PARTITIONS else f"got {v!r}; allowed: {', '.join(repr(k) for k in PARTITIONS)}"


@attrs.frozen
class DataSpec:
    """The data, everything about it drawn from ``seed`` (default: run.seed), so the data can be held
    fixed while the run's own randomness (batches, noise, activation) varies."""

    kind: str = field("synthetic", check=_dataset_kind,
                      doc="where the rows come from: " + ", ".join(repr(k) for k in DATASETS)
                          + ", or a dataset a --plugin registers (register_dataset)")
    seed: int | None = field(None, check=lambda v: None if v is None or 0 <= v < 2**63 else "must be in [0, 2^63)",
                             doc="root of the data's randomness (generation, test split, partition, "
                                 "subsampling, validation); default: run.seed")
    samples: int = field(2000, check=at_least(2), doc="synthetic: number of samples (test split included)",
                         when={"kind": ("synthetic",)})
    features: int = field(20, check=at_least(1), doc="synthetic: dimension", when={"kind": ("synthetic",)})
    generator: Literal["threshold", "sign_linear"] = field(
        "threshold", doc="synthetic: 'threshold' x ~ N(0, I), y = 1[x.w* + 3 noise N(0,1) > 0], ||w*|| = 3; "
                         "'sign_linear' x* ~ N(0, I), unit-norm rows a, y = sign(3 a.x* + 0.5 N(0,1))",
        when={"kind": ("synthetic",)})
    noise: float = field(0.1, check=nonneg, doc="synthetic 'threshold': label-noise scale",
                         when={"kind": ("synthetic",), "generator": ("threshold",)})
    path: str | None = field(None, doc="libsvm, table: training file; mnist/cifar10: folder (default 'mnist' / "
                                       "'cifar-10-batches-bin'); a plugin dataset: what its loader reads. A "
                                       "relative path is looked up beside the scenario file, then in $NETSIM_DATA")
    test_path: str | None = field(None, doc="libsvm, table: test file (default: split test_fraction off the "
                                            "training file)")
    columns: tuple[str, ...] | None = field(
        None, doc="table: the feature columns, in order (default: every column but label and group); in an "
                  "NPZ file a 2-D array's columns all count", when={"kind": ("table",)})
    label: str = field("label", doc="table: the label column (any values; mapped to 0..C-1 in sorted order)",
                       when={"kind": ("table",)})
    group: str | None = field(None, doc="table: the column naming each row's group (writer, device, hospital), "
                                        "for partition = 'groups'", when={"kind": ("table",)})
    test_fraction: float = field(0.2, check=lambda v: None if 0 < v < 1 else f"must be in (0, 1), got {v}",
                                 doc="share of the rows held out for testing (synthetic; libsvm, table or a "
                                     "plugin dataset without test rows)",
                                 when={"kind": ("synthetic", "libsvm", "table"), "test_path": (None,)})
    unit_rows: bool = field(False, doc="scale every feature row (train and test) to unit L2 norm "
                                       "(row scaling, not standardisation)")
    standardize: Literal["none", "fit", "mnist", "given"] = field(
        "none", doc="per-feature (x - mean) / std: 'fit' on the training split, 'mnist' the canonical "
                    "0.1307 / 0.3081 of [0, 1] pixels, 'given' data.mean / data.std")
    mean: float | None = field(None, doc="standardize = 'given': the mean subtracted from every feature")
    std: float | None = field(None, check=_opt_positive, doc="standardize = 'given': the std every feature "
                                                             "is divided by")
    partition: str = field("iid", check=_partition_kind,
                           doc="how training rows are split over agents: " + ", ".join(PARTITIONS))
    alpha: float = field(0.5, check=positive, doc="Dirichlet concentration (small = non-IID), also 'quantity'",
                         when={"partition": ("dirichlet_equal", "dirichlet_classes", "quantity")})
    shards: int = field(2, check=at_least(1), doc="partition = 'shards': label-sorted shards per agent",
                        when={"partition": ("shards",)})
    share: float = field(0.4, check=lambda v: None if 0 <= v <= 1 else f"must be in [0, 1], got {v}",
                         doc="partition = 'label_share': fraction of class c held by agent c mod m",
                         when={"partition": ("label_share",)})
    classes: tuple[tuple[int, ...], ...] | None = field(
        None, doc="partition = 'classes': one list of class indices (0..C-1, in sorted label order) per agent")
    groups_per_agent: int = field(1, check=at_least(1), doc="partition = 'groups': groups each agent holds "
                                                            "(at least)", when={"partition": ("groups",)})
    extra_groups: Literal["spread", "drop", "error"] = field(
        "spread", doc="partition = 'groups', more groups than agents x groups_per_agent: 'spread' deals every "
                      "group (agents hold groups_per_agent or more, as evenly as possible), 'drop' leaves the "
                      "extra groups' rows out (a seeded choice), 'error' refuses", when={"partition": ("groups",)})
    partition_file: str | None = field(
        None, doc="partition = 'file': a JSON file holding one list of training-row indices per agent, or an "
                  "NPZ file with an integer array 'agent_<i>' per agent (read without pickle). Rows are the "
                  "training set's: the training file's in order, or, when the test rows are split off it, the "
                  "rows left after that seeded split (write_partition writes a run's own)")
    per_agent: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                                  doc="training rows per agent: each agent's part is subsampled to this many "
                                      "(seeded, without replacement); 'dirichlet_equal': the shard size")
    validation: int = field(0, check=at_least(0), doc="size of the validation set Q (seeded, from the held-out "
                                                     "rows) every agent may read; never evaluated on")
    test_samples: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                                     doc="held-out rows evaluated on, disjoint from Q (default: all not in Q)")
    sampling: Literal["with_replacement", "without_replacement"] = field(
        "with_replacement", doc="a mini-batch's rows: i.i.d. uniform, or distinct rows of the agent's part "
                                "(a batch larger than the part is the whole part)")
    params: dict[str, Any] = attrs.field(factory=dict, metadata={
        "doc": "a plugin dataset's own arguments, written as keys of [data] itself (netsim datasets NAME)"})

    def __check__(self) -> tuple[str, str] | None:
        if self.kind in ("libsvm", "table") and not self.path:
            return "path", f"required for kind = {self.kind!r}"
        if self.params and self.kind in DATASETS:
            key = next(iter(self.params))
            return key, f"unknown key for kind = {self.kind!r}; allowed keys here: {', '.join(_keys(DataSpec))}"
        if (self.partition == "file") != (self.partition_file is not None):
            return "partition_file", "a partition file is given exactly when partition = 'file'"
        if self.kind == "synthetic" and self.samples * self.features > 2**30:
            return "samples", (f"samples x features must be <= 2^30 (8 GiB of float64), got "
                               f"{self.samples} x {self.features}")
        if (self.standardize == "given") != (self.mean is not None and self.std is not None):
            return "standardize", "data.mean and data.std are given exactly when standardize = 'given'"
        if (self.partition == "classes") != (self.classes is not None):
            return "classes", "a class list per agent is given exactly when partition = 'classes'"
        if self.classes is not None and any(c < 0 for row in self.classes for c in row):
            return "classes", "class indices must be >= 0"
        return None


@attrs.frozen
class ModelSpec:
    kind: str = field("logistic", check=_model_kind,
                      doc="the model every agent trains: " + ", ".join(repr(k) for k in MODELS)
                          + " (cnn: MNIST; vgg11, resnet18: CIFAR-10), or a model a --plugin registers "
                            "(register_model; netsim models lists them)")
    hidden: tuple[int, ...] = field((64,), check=lambda v: None if all(1 <= h <= 2**16 for h in v)
                                    else f"widths must be in [1, 65536], got {list(v)}",
                                    doc="mlp: hidden layer widths", when={"kind": ("mlp",)})
    l2: float = field(0.0, check=nonneg, doc="L2 regularisation weight (biases are not penalised)")
    bias: bool = field(True, doc="an intercept per unit (logistic, multinomial, mlp); false: exactly d "
                                 "(logistic) or d x C (multinomial) parameters")
    init: Literal["torch", "zero_bias"] = field(
        "torch", doc="mlp/cnn/vgg11/resnet18 start: 'torch' = PyTorch's Linear/Conv default, weights and "
                     "biases U(+-1/sqrt(fan_in)); 'zero_bias' = those weights, biases 0. Convex models start at 0; "
                     "a plugin's nn.Module starts the same way",
        when={"kind": ("mlp", "cnn", "vgg11", "resnet18")})
    dtype: Literal["float32", "float64"] = field("float32", doc="parameter and data precision")
    batch_invariant: bool | Literal["auto"] = field(
        "auto", doc="gradients whose bits do not depend on which requests share a batched call: both engines give "
                    "the same bits however they batch, so asynchronous windowed runs evaluate each step of a "
                    "window in one call (faster). 'auto': true when the agents do not wake together (Poisson "
                    "activation, or clock offsets, drift or jitter: each gradient is asked for alone), false when "
                    "they do (periodic or Bernoulli ticks on identical clocks: every request of a tick is evaluated "
                    "in one call already); the resolved scenario says which",
        when={"kind": ("logistic",)})
    params: dict[str, Any] = attrs.field(factory=dict, metadata={
        "doc": "a plugin model's own arguments, written as keys of [model] itself (netsim models NAME)"})

    def __check__(self) -> tuple[str, str] | None:
        if self.params and self.kind in MODELS:
            key = next(iter(self.params))
            return key, f"unknown key for kind = {self.kind!r}; allowed keys here: {', '.join(_keys(ModelSpec))}"
        if not self.bias and self.kind in ("cnn", "vgg11", "resnet18"):
            return "bias", f"only logistic, multinomial and mlp models can drop their biases, not {self.kind!r}"
        if self.batch_invariant is True and self.kind != "logistic":
            return "batch_invariant", f"only the logistic model has a batch-invariant gradient, not {self.kind!r}"
        return None


@attrs.frozen
class AlgorithmSpec:
    """``name`` of a registered algorithm; every other key is that algorithm's parameter."""

    name: str = field(doc="registered algorithm, e.g. 'dpsgd' or 'gossip'")
    params: dict[str, Any] = attrs.field(factory=dict, metadata={
        "doc": "the algorithm's parameters, written as keys of [algorithm] itself (netsim algorithms NAME)"})


@attrs.frozen
class EvaluationSpec:
    every: float = field(1.0, check=duration, doc="simulated seconds between evaluations")
    metrics: tuple[Literal["loss", "accuracy", "consensus", "agent_accuracy", "tracking", "train_loss",
                           "suboptimality"], ...] = field(
        ("loss", "accuracy", "consensus"),
        doc="loss/accuracy: the average model on the test rows; agent_accuracy: every agent's own model "
            "(mean, min); consensus: mean squared distance to the average; train_loss: the training "
            "objective f(x) on the pooled training rows (l2 included); suboptimality: f(x) - f* (convex "
            "models; f* solved once, cached); tracking: online learners (ldp_online)")
    format: Literal["csv", "parquet"] = field("csv", doc="metrics file format")
    target_accuracy: float | None = field(
        None, check=lambda v: None if v is None or 0 < v <= 1 else f"must be in (0, 1], got {v}",
        doc="summary.time_to_target = first evaluation time whose accuracy >= this")
    headline: str | None = field(None, doc="a metrics column reported as summary.json's headline "
                                           "(one of the columns the chosen metrics produce, e.g. "
                                           "'agent_accuracy_mean', 'suboptimality', 'tracking_mse')")

    def __check__(self) -> tuple[str, str] | None:
        if self.headline is None:
            return None
        columns = ["round_mean", *(c for m in self.metrics for c in METRIC_COLUMNS[m])]
        if self.headline in columns:
            return None
        return "headline", f"{self.headline!r} is not a column of the chosen metrics; allowed: {', '.join(columns)}"


METRIC_COLUMNS: dict[str, tuple[str, ...]] = {
    "loss": ("loss",), "accuracy": ("accuracy",), "consensus": ("consensus",),
    "agent_accuracy": ("agent_accuracy_mean", "agent_accuracy_min"), "train_loss": ("train_loss",),
    "suboptimality": ("suboptimality",), "tracking": ("tracking_mse", "tracking_avg", "regret")}
"""The metrics.csv columns each ``evaluation.metrics`` entry writes (metrics.csv also has time and round_mean)."""


def _open_unit(v: float) -> str | None:
    return None if 0 < v < 1 else f"must be in (0, 1), got {v}"


def _closed_form_name(v: str) -> str | None:
    """The file can only be checked for the name's form here; that a form of this name is registered is
    checked when the run is prepared (plugins register theirs before)."""
    return None if v.isidentifier() else f"must be the name of a registered closed form, got {v!r}"


@attrs.frozen
class PrivacySpec:
    """How releases are accounted (netsim.privacy, docs/privacy.md). Noise itself is the algorithm's
    parameter; this section says at which delta epsilon is reported, whether random activation is
    credited as amplification, the per-agent budget cap, and which paper's closed form to show."""

    delta: float = field(1e-5, check=_open_unit, doc="report epsilon(delta) at this delta")
    accounting: Literal["observed", "amplified"] = field(
        "observed", doc="'amplified' credits hidden Bernoulli activation as subsampling (Huo et al., Lemma 4)")
    epsilon_cap: float | None = field(
        None, check=lambda v: None if v is None or v > 0 else f"must be > 0, got {v}",
        doc="per-agent budget: an agent stops releasing before exceeding it")
    closed_form: str = field(
        "none", check=_closed_form_name,
        doc="a registered closed form (a paper's own privacy formula) reported beside the accountants: none, "
            "pdsl (Wang et al.), ldp_online (Chen & Wang), do_adp (Huo et al.), privsgp_vr (Zhu et al.), or one "
            "a --plugin registers; the old names seed000, seed001, seed003, seed004 still work, with a note")
    delta0: float = field(1e-5, check=_open_unit, doc="per-release delta of the classical Gaussian bound")
    c2: float = field(0.3724, check=positive, doc="PrivSGP-VR's unspecified constant c_2 (Zhu et al., Theorem 2)",
                      when={"closed_form": ("privsgp_vr", "seed004")})
    record: Literal["mixing", "payloads"] | None = field(
        None, doc="'mixing': write RUN/mixing.csv, the weights each agent applied to which messages, which "
                  "pairwise accounting (netsim privacy RUN --pairwise) needs; 'payloads': also RUN/payloads.npz, "
                  "every delivered payload and every release's value before and after its noise (what the "
                  "attacks of netsim privacy RUN --attack/--audit read); default: nothing recorded")
    audit: AuditSpec | None = field(None, doc="canaries for a privacy audit (netsim privacy RUN --audit)")

    def __check__(self) -> tuple[str, str] | None:
        if self.audit is not None and self.record != "payloads":
            return "record", ("privacy.audit scores the canaries from what the observers received: set "
                              "privacy.record = \"payloads\"")
        return None


def _victims(v: tuple[int, ...]) -> str | None:
    if not v:
        return "name at least one agent"
    if any(a < 0 for a in v) or len(set(v)) != len(v):
        return f"must be distinct agent ids >= 0, got {list(v)}"
    return None


@attrs.frozen
class AuditSpec:
    """Canaries a run inserts for a one-run privacy audit (Steinke, Nasr, Jagielski, "Privacy Auditing with One
    (1) Training Run", NeurIPS 2023): each of a victim's canaries is included with probability 1/2 (the run's
    ``audit`` stream) in every one of the victim's releases, each in its own coordinate (a Dirac canary); netsim
    privacy RUN --audit guesses which were included from each observer's view."""

    victims: tuple[int, ...] = field((0,), check=_victims, doc="agents whose releases carry canaries")
    canaries: int = field(1000, check=at_least(1), doc="canaries per victim (each in its own model coordinate: "
                                                        "victims x canaries <= the model's parameters)")
    kind: Literal["gradient", "input"] = field(
        "gradient", doc="'gradient': white-box Dirac gradients of norm the release's declared sensitivity, added "
                        "to the released value before its noise; 'input': records whose per-example gradient is a "
                        "Dirac of norm ``norm``, in the victim's batch before the algorithm clips (so a clipping "
                        "or sensitivity bug shows)")
    norm: float = field(100.0, check=positive, doc="an input canary's gradient norm (far above any clip bound)",
                        when={"kind": ("input",)})
    confidence: float = field(0.95, check=_open_unit, doc="confidence of the audit's lower bounds")


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

    def __attrs_post_init__(self) -> None:
        """``model.batch_invariant = "auto"`` resolved from the scenario (never from the engine: both engines must
        compute the same bits): the invariant gradient where the agents' requests come one by one (it batches
        freely in the asynchronous windows and costs about as much alone), the default where they wake together
        (both engines evaluate a tick's requests in one call, where the default path is faster for large local
        batches). The resolved scenario's text holds the value, so such a scenario's text is unchanged."""
        if self.model.kind == "logistic" and self.model.batch_invariant == "auto":
            object.__setattr__(self, "model", attrs.evolve(self.model,
                                                           batch_invariant=not self.agents.wake_together()))
