"""A plugin model: a residual MLP, an ``nn.Module`` of netsim's own choosing, trained through the generic
batched path (``TorchModel``: vmap over agents; DP clipping by book-keeping, since every parameter is a
Linear layer's).

    x -> Linear(d, width) -> [h + Linear(ReLU(Linear(h)))] x depth -> ReLU -> Linear(width, classes)

Its own ``[model]`` keys (``width``, ``depth``) are checked like every scenario key; ``model.l2`` and
``model.init`` apply as to the built-in networks. Selected by name:

    netsim run scenarios/quickstart.toml --plugin examples/plugins/residual_mlp.py \\
        --set model.kind=residual_mlp --set model.width=32 --out runs/residual
"""

from __future__ import annotations

import attrs
from torch import nn

from netsim.compute.models import ModelData, register_model
from netsim.scenario.structure import at_least, field


@attrs.frozen
class ResidualParams:
    width: int = field(32, check=at_least(1), doc="units of the stem and of every residual block")
    depth: int = field(2, check=lambda v: None if 0 <= v <= 16 else f"must be in [0, 16], got {v}",
                       doc="residual blocks")


class ResidualMLP(nn.Module):
    def __init__(self, features: int, classes: int, width: int, depth: int):
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
                                    for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h.relu())


def residual_mlp(args: ResidualParams, data: ModelData) -> nn.Module:
    """Residual MLP: a Linear stem, ``depth`` blocks h + Linear(ReLU(Linear(h))), a Linear head."""
    return ResidualMLP(data.features, data.classes, args.width, args.depth)


register_model("residual_mlp", residual_mlp, ResidualParams)
