"""Hypothesis settings of the property and differential tests: a fixed sample by default, a search on request.

By default every run tries the same examples (``derandomize=True``), so CI time is bounded and a failure
reproduces. ``NETSIM_FUZZ=N`` (N >= 1) searches instead: examples drawn afresh each run, ten times N the
budget, the shrunk failure printed with its ``@example`` line to pin. docs/testing.md says when to run it.
``NETSIM_EXAMPLES=F`` scales every budget by F (tests/test_machine_paths.py runs the invariance tests again under
other CPU paths with a fraction of their examples).
"""

from __future__ import annotations

import os

from hypothesis import settings

FUZZ = int(os.environ.get("NETSIM_FUZZ", "0") or 0)
SCALE = float(os.environ.get("NETSIM_EXAMPLES", "1") or 1)


def search(max_examples: int, **kw) -> settings:
    """``settings`` for a property test of ``max_examples`` examples (``deadline`` off: runs vary in time)."""
    max_examples = max(1, round(max_examples * SCALE))
    if FUZZ > 0:
        return settings(max_examples=max_examples * 10 * FUZZ, deadline=None, derandomize=False, database=None,
                        print_blob=True, **kw)
    return settings(max_examples=max_examples, deadline=None, derandomize=True, **kw)
