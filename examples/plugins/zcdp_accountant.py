"""A plugin accountant: zero-concentrated DP (zCDP) composition, and the same bound as a closed form.

Bun & Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds" (TCC 2016):
a Gaussian release with noise multiplier z (std = z * sensitivity) is rho-zCDP with rho = 1 / (2 z^2)
(Proposition 1.6); an eps-DP release (Laplace with scale b = z * sensitivity: eps = 1 / z) is (eps^2 / 2)-zCDP
(Proposition 1.4); zCDP composes by adding rho (Lemma 1.7); rho-zCDP implies
(rho + 2 sqrt(rho ln(1/delta)), delta)-DP (Proposition 1.3). zCDP has no tight amplification by
subsampling, so a subsampled release is counted as a full one: a valid upper bound, looser than RDP's.

    netsim run scenarios/privacy_activation.toml --plugin examples/plugins/zcdp_accountant.py \
        --set privacy.closed_form=zcdp --out runs/zcdp
    netsim privacy runs/zcdp --plugin examples/plugins/zcdp_accountant.py --accountant zcdp
"""

from __future__ import annotations

import math

from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant

from netsim.privacy.accountants import register_accountant
from netsim.privacy.closed_forms import ClosedFormError, register_closed_form

PAPER = ('Bun, Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds" '
         "(TCC 2016)")


def rho_of(multiplier: float) -> float:
    """zCDP parameter of one release with noise multiplier z: Gaussian 1/(2 z^2) (Prop. 1.6); Laplace,
    eps = 1/z, eps^2/2 = the same number (Prop. 1.4)."""
    return math.inf if multiplier <= 0 else 1 / (2 * multiplier**2)


def epsilon_of(rho: float, delta: float) -> float:
    """Proposition 1.3: rho-zCDP => (rho + 2 sqrt(rho ln(1/delta)), delta)-DP."""
    return rho + 2 * math.sqrt(rho * math.log(1 / delta)) if rho > 0 else 0.0


class ZCDPAccountant(PrivacyAccountant):
    """dp-accounting's accountant interface over a running sum of rho (add-or-remove-one neighbours)."""

    def __init__(self) -> None:
        super().__init__(NeighboringRelation.ADD_OR_REMOVE_ONE)
        self.rho = 0.0

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool):
        if isinstance(event, dp_event.NoOpDpEvent):
            return None
        if isinstance(event, dp_event.NonPrivateDpEvent):
            if do_compose:
                self.rho = math.inf
            return None
        if isinstance(event, dp_event.PoissonSampledDpEvent):  # no amplification credited: an upper bound
            return self._maybe_compose(event.event, count, do_compose)
        if isinstance(event, dp_event.SelfComposedDpEvent):
            return self._maybe_compose(event.event, event.count * count, do_compose)
        if isinstance(event, dp_event.ComposedDpEvent):
            for e in event.events:
                err = self._maybe_compose(e, count, do_compose)
                if err is not None:
                    return err
            return None
        if isinstance(event, dp_event.GaussianDpEvent | dp_event.LaplaceDpEvent):
            if do_compose:
                self.rho += count * rho_of(event.noise_multiplier)
            return None
        return PrivacyAccountant.CompositionErrorDetails(event, "zCDP: only Gaussian and Laplace releases")

    def get_epsilon(self, target_delta: float) -> float:
        return epsilon_of(self.rho, target_delta)

    def get_delta(self, target_epsilon: float) -> float:
        if self.rho == 0:
            return 0.0
        if target_epsilon <= self.rho:
            return 1.0
        return math.exp(-((target_epsilon - self.rho) ** 2) / (4 * self.rho))  # Prop. 1.3 inverted


register_accountant("zcdp", ZCDPAccountant, f"zero-concentrated DP, {PAPER}")


@register_closed_form("zcdp", PAPER)
def zcdp_closed_form(releases, spec, delta: float) -> dict:
    """One agent's releases by the paper's propositions (sampling not credited, as in the accountant)."""
    if any(r.mechanism not in ("gaussian", "laplace") for r in releases):
        raise ClosedFormError("zcdp", "composes Gaussian and Laplace releases only")
    rho = sum(rho_of(r.scale / r.sensitivity) for r in releases)
    eps = epsilon_of(rho, delta)
    return {"paper": eps, "conservative": eps, "violations": [],
            "note": f"Props. 1.3, 1.6 and Lemma 1.7: rho = sum 1/(2 z^2) = {rho:.6g}, sampling not credited"}

