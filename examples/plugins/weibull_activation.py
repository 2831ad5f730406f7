"""A plugin activation schedule: a Weibull renewal process on each agent's local clock.

Poisson activation has exponential gaps (coefficient of variation 1). Real devices wake more regularly
than that and less than a clock: gaps Weibull(k) with shape k = 2 have CV = sqrt(Gamma(1 + 2/k) /
Gamma(1 + 1/k)^2 - 1) = 0.523, scaled to the table's mean rate (scale = 1 / (rate Gamma(1 + 1/k))). Gaps
come from the agent's own ``activation`` stream; an activation that falls while the agent is busy (or
offline) is missed, as with Poisson activation. Selected by name:

    netsim run scenarios/quickstart.toml --plugin examples/plugins/weibull_activation.py \\
        --set 'agents.activation={kind="poisson", rate=4.0, schedule="weibull2"}' --out runs/weibull
"""

from __future__ import annotations

import math

from netsim.sim.activation import Schedule, register_schedule

SHAPE = 2.0


class WeibullRenewal(Schedule):
    kind = "weibull2"

    def __init__(self, rate: float, rng, start_local: float):
        self.scale = 1.0 / (rate * math.gamma(1.0 + 1.0 / SHAPE))   # mean gap 1 / rate
        self.rng = rng
        self.upcoming = start_local + self.gap()

    def gap(self) -> float:
        return self.scale * float(self.rng.weibull(SHAPE))

    def next(self, now_local: float) -> float:
        at = self.upcoming
        while at < now_local:          # arrivals while busy are missed
            at += self.gap()
        self.upcoming = at + self.gap()
        return at

    def defer(self, at: float, back_local: float) -> float:
        while at < back_local:         # arrivals while offline are missed
            at += self.gap()
        self.upcoming = at + self.gap()
        return at


register_schedule("weibull2", lambda spec, rng, offset: WeibullRenewal(spec.rate, rng, offset))
