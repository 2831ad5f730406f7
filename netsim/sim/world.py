"""The world a scenario builds before anything runs: data and its tensors, model, parameter bank, graph and
mixing matrix, the gradient service, the links, churn and activation moves.

Built once by ``Simulation``; while the run goes on its objects change state (the bank's rows, a link's queue),
but none of its attributes is reassigned. The run loop (sim/loop.py) and the recorder (sim/recorder.py) are the
other parts of a run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import torch

from netsim.compute import resolve_device
from netsim.compute.bank import ParameterBank
from netsim.compute.data import find_data_file, load_dataset
from netsim.compute.gradients import GradientService
from netsim.compute.models import build_model
from netsim.scenario.schema import Scenario
from netsim.sim.activation import moves_for
from netsim.sim.churn import build_churn
from netsim.sim.env import Environment
from netsim.sim.network import Network
from netsim.sim.streams import Streams
from netsim.sim.topology import Topology, spectral_gap


@attrs.frozen
class Splits:
    """The data's rows as tensors on the run's device and dtype: training rows (``X``, ``y``), the evaluated
    test rows, the validation set Q every agent may read (None without ``data.validation``), and the rows of
    the training objective (``train_rows``: those some agent holds)."""

    X: torch.Tensor
    y: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    X_val: torch.Tensor | None
    y_val: torch.Tensor | None
    train_rows: tuple[torch.Tensor, torch.Tensor]


class World:
    """What the scenario builds: read by agents, algorithms and the evaluation; assigned only here."""

    def __init__(self, scenario: Scenario, device: str | None, env: Environment, emit: Callable[[Any], None],
                 emit_row: Callable[[tuple], None], deliver: Callable[[Any], None]):
        self.scenario = sc = scenario
        self.streams = Streams(sc.run.seed)
        n = sc.agents.count
        self.topology = Topology(sc.topology, n, self.streams.seed_for("topology"))  # its graph made when read
        self.gap = spectral_gap(self.W)
        self.device = resolve_device(device or sc.run.device)
        dtype = self.dtype
        # the data have their own stream tree (data.seed), so they can stay fixed while run.seed varies
        data_seed = sc.run.seed if sc.data.seed is None else sc.data.seed
        self.data = data = load_dataset(sc.data, n, Streams(data_seed))
        self.model = build_model(sc.model, data.features, data.classes, data.shape)
        self.bank = ParameterBank(self.model.init(n, dtype, self.device, self.streams.seed_for("init")))
        t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        X, y = t(data.X).to(dtype), t(data.y)
        X_val = y_val = None  # the validation set Q (data.validation) every agent may read
        if data.X_val is not None and len(data.X_val):
            X_val, y_val = t(data.X_val).to(dtype), t(data.y_val)
        # the training objective is over the rows the agents hold (per_agent or equal shards may leave some out)
        held = np.zeros(len(data.y), dtype=bool)  # a mask, not np.unique (5 s for 5 M distinct rows)
        held[np.concatenate(data.parts)] = True
        whole = bool(held.all())
        held = np.flatnonzero(held)  # the held rows, sorted (what np.unique gave)
        train = (X, y) if whole else (X[torch.as_tensor(held, device=self.device)],
                                      y[torch.as_tensor(held, device=self.device)])
        self.splits = Splits(X, y, t(data.X_test).to(dtype), t(data.y_test), X_val, y_val, train)
        self.f_star: float | None = None  # min of the training objective (the suboptimality metric)
        if "suboptimality" in sc.evaluation.metrics:
            from netsim.compute.optimum import optimum

            self.f_star = optimum(self.model, data.X[held], data.y[held])
        self.gradients = GradientService(self.model, X, y)
        self.network = Network(env, sc.network, self.streams, emit, deliver, emit_row)
        self.network.seed_ahead(self.topology.edge_array())
        # offline time (sim/churn.py): the network drops what an offline agent sends or would receive, its
        # activations and computations wait until it is back
        self.churn = build_churn(sc.agents, self.streams, find_data_file)
        self.activation_moves = moves_for(sc.agents, self.streams, self.churn)  # jitter, churn (activation.py)

    @property
    def graph(self):
        """The topology as a networkx DiGraph with ``weight`` edges (built on first use: ``Topology``)."""
        return self.topology.graph

    @property
    def W(self):
        """The mixing matrix (scipy CSR)."""
        return self.topology.W

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' and features' dtype (``model.dtype``)."""
        return torch.float64 if self.scenario.model.dtype == "float64" else torch.float32
