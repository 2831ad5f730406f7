"""Privacy: mechanisms, the per-agent release ledger, accountants, calibration, and the seed papers'
closed forms (docs/privacy.md). Principle 7: privacy is accounted from what happened, not assumed."""

from netsim.privacy.accountants import composed_event, epsilon, epsilon_curve
from netsim.privacy.calibration import gaussian_sigma, max_steps, noise_multiplier
from netsim.privacy.mechanisms import NoiseSource, PrivacyError, clip, clip_coordinate, clip_l2

__all__ = ["NoiseSource", "PrivacyError", "clip", "clip_coordinate", "clip_l2", "composed_event", "epsilon",
           "epsilon_curve", "gaussian_sigma", "max_steps", "noise_multiplier"]
