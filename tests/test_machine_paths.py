"""The invariance tests again under the code paths other CPUs take, each in a fresh interpreter.

torch picks its kernels for the CPU's instruction set once per process (``ATEN_CPU_CAPABILITY`` forces a lower
one: ``default``, ``avx2``, ``avx512`` on x86-64) and MKL picks its own (``MKL_ENABLE_INSTRUCTIONS``,
``MKL_CBWR``). A row's bits must not depend on its batch on any of them, not only on the one this machine
dispatches to (the contract: docs/architecture.md, "Determinism"). A forced capability this CPU lacks falls back to
a lower one: the path it names is then already covered and the case is skipped.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, cli_env

ATEN = ["default", "avx2", "avx512"]
MKL = [{"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, {"MKL_CBWR": "COMPATIBLE"}]
PATHS = [pytest.param({"ATEN_CPU_CAPABILITY": c}, id=f"aten-{c}") for c in ATEN] + [
    pytest.param(m, id="mkl-" + "-".join(m.values()).lower()) for m in MKL]

# fast: the per-row property tests at a fifth of their examples; slow: every invariance and differential test
FAST = ["tests/test_batch_invariant.py::test_each_requests_bits_are_its_own_in_any_batch",
        "tests/test_batch_invariant.py::test_row_sum_adds_in_its_stated_order_whatever_the_batch",
        "tests/test_batched_mixing.py::test_batched_updates_equal_the_per_agent_ones"]
SLOW = ["tests/test_batch_invariant.py", "tests/test_batched_mixing.py", "tests/test_round_kernels.py",
        "tests/test_windowed.py", "tests/test_broadcast_windows.py", "tests/test_lookahead_churn.py"]


def _capability(env: dict) -> str:
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().lower()


def _run(path: dict, tests: list[str], fraction: str) -> None:
    env = {**cli_env(), **path, "NETSIM_EXAMPLES": fraction}
    env.pop("NETSIM_FUZZ", None)
    if "ATEN_CPU_CAPABILITY" in path and _capability(env) != path["ATEN_CPU_CAPABILITY"]:
        pytest.skip(f"this CPU has no {path['ATEN_CPU_CAPABILITY']} kernels (torch fell back to a lower set)")
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-m", "not slow", *tests], cwd=ROOT, env=env, capture_output=True, text=True)
    assert got.returncode == 0, f"under {path}:\n{got.stdout[-4000:]}\n{got.stderr[-2000:]}"


@pytest.mark.parametrize("path", PATHS)
def test_rows_are_batch_invariant_on_other_cpu_paths(path):
    _run(path, FAST, "0.2")


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_invariance_and_differential_tests_pass_on_other_cpu_paths(path):
    _run(path, SLOW, "0.5")
