"""Privacy: mechanisms, the per-agent release ledger, accountants, calibration, and papers'
closed forms (docs/privacy.md). Privacy is accounted from what happened, not assumed.

Modules (imported on use: dp-accounting is a heavy import a run without accounting need not pay):
``mechanisms`` (clipping, noise), ``ledger`` (Agent.privatize's bookkeeping, budget caps),
``accountants`` (RDP/PLD through dp-accounting), ``calibration``, ``closed_forms``, ``report``.
"""
