"""A plugin link model: propagation delay from the distance between agents placed in the plane.

The agents sit evenly on a circle of radius R (agent i at angle 2 pi i / n); a message from i to j takes

    delay = base + d_ij / v,     d_ij = 2 R sin(pi |i - j| / n)     (the chord between them)

plus its transmission on the scenario's per-link bandwidth, FIFO per link (as the built-in path). Nothing is
dropped. It decides every message through the one link-model protocol, ``outcome(src, dst, now, size)``,
registered by name so a scenario selects it with ``network.model = "planar"``:

    netsim run scenarios/quickstart.toml --plugin examples/plugins/planar_links.py \\
        --set network.model=planar --out runs/planar
"""

from __future__ import annotations

import math

from netsim.sim.network import register_link_model

RADIUS = 1.0e6      # metres: a continent-sized ring
SPEED = 2.0e8       # metres per second: light in fibre
BASE = 0.002        # seconds of processing per message


def delay_between(i: int, j: int, n: int) -> float:
    """Propagation delay (s) from agent i to agent j on the circle."""
    return BASE + 2 * RADIUS * math.sin(math.pi * abs(i - j) / n) / SPEED


class PlanarLinks:
    def __init__(self, net):
        self.net = net
        self.n = net.n_agents
        self.busy: dict[tuple[int, int], float] = {}

    def outcome(self, src: int, dst: int, now: float, size: int) -> tuple[float, float, str]:
        bw = self.net.bandwidth
        tx_end = now
        if bw is not None:
            tx_end = max(now, self.busy.get((src, dst), 0.0)) + size / bw
            self.busy[(src, dst)] = tx_end
        return tx_end, tx_end - now + delay_between(src, dst, self.n), ""


register_link_model("planar", PlanarLinks)
