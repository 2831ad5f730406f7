"""DP-D-PSGD's clipping modes and noise settings: whole-batch clipping bounds every released step,
per-example clipping keeps its old behaviour, sigma is used as given, and an epsilon target gives the
multiplier the accountant needs (the run's ledger ends at the target)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from netsim.algorithms.dp_dpsgd import DPDPSGDParams, sensitivity
from netsim.api import prepare, run
from netsim.errors import InputError
from netsim.privacy.accountants import epsilon
from netsim.privacy.calibration import noise_multiplier
from netsim.privacy.ledger import releases_from_table
from netsim.scenario import scenario_from_dict
from netsim.trace.io import read_trace
from tests.conftest import BASE, merge

ROUNDS = 12


def _scenario(**algo) -> dict:
    return merge(BASE, {
        "run": {"seed": 5, "rounds": ROUNDS, "until": None},
        "agents": {"count": 4},
        "data": {"samples": 600, "features": 5},
        "algorithm": {"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2, "clip": 0.1, **algo},
        "evaluation": {"every": 100.0},
    })


def _releases(tmp_path, **algo):
    d = _scenario(**algo)
    d["run"].pop("until")
    run(scenario_from_dict(d), out=tmp_path)
    return releases_from_table(read_trace(tmp_path).table)


def _released_norms(monkeypatch, **algo) -> list[float]:
    """Norms of the vectors each release returns (noise 0: the clipped gradient itself)."""
    from netsim.rounds.kernel import Batch

    d = _scenario(noise_multiplier=0.0, **algo)
    d["run"].pop("until")
    norms: list[float] = []
    orig = Batch.privatize

    def release(self, g, *a, **k):
        out = orig(self, g, *a, **k)
        norms.extend(torch.linalg.vector_norm(r).item() for r in out)
        return out

    monkeypatch.setattr(Batch, "privatize", release)
    prepare(scenario_from_dict(d)).run()
    return norms


def test_batch_clipping_bounds_the_released_update(monkeypatch):
    """x_i <- sum_j w_ij x_j - gamma clip_C(g): the released gradient has norm <= C, and with
    gradients larger than C (clip 0.1 on the synthetic task) it sits on the C-sphere; the mean of
    per-example clipped gradients is shorter (the per-example directions disagree)."""
    batch = _released_norms(monkeypatch, clip_mode="batch")
    assert len(batch) == 4 * ROUNDS
    assert max(batch) <= 0.1 * (1 + 1e-6)
    assert np.mean(np.isclose(batch, 0.1, rtol=1e-5)) > 0.9
    per = _released_norms(monkeypatch, clip_mode="per_example")
    assert max(per) <= 0.1 * (1 + 1e-6)
    assert np.mean(per) < np.mean(batch)


def test_batch_and_per_example_sensitivity_and_sigma(tmp_path):
    rb = _releases(tmp_path / "b", clip_mode="batch", noise_multiplier=2.0)
    rp = _releases(tmp_path / "p", clip_mode="per_example", noise_multiplier=2.0)
    for i in range(4):
        assert {r.sensitivity for r in rb[i]} == {2 * 0.1}            # replace-one on the clipped mean
        assert [r.scale for r in rb[i]] == pytest.approx([2.0 * 0.2] * ROUNDS)  # z x sensitivity
        assert [r.sensitivity for r in rp[i]] == pytest.approx([0.1 / 16] * ROUNDS)
        assert len(rb[i]) == len(rp[i]) == ROUNDS
    rs = _releases(tmp_path / "s", clip_mode="batch", sigma=0.01)
    assert {r.scale for rs_i in rs.values() for r in rs_i} == {0.01}  # sigma per coordinate, as given
    d = DPDPSGDParams(clip=1.0, batch=250, clip_kind="coordinate", clip_mode="batch")
    assert sensitivity(d, 100) == pytest.approx(2.0 * 10.0)


def test_epsilon_target_is_the_accountant_calibration_and_the_ledger_meets_it(tmp_path):
    eps, delta = 2.0, 1e-5
    rel = _releases(tmp_path, clip_mode="batch", epsilon=eps)
    for rs in rel.values():
        assert len(rs) == ROUNDS
        q = rs[0].q
        assert 0 < q < 1 and {r.q for r in rs} == {q}  # B / |D_i|: subsampled
        z = noise_multiplier(eps, delta, [(q, ROUNDS)])
        assert rs[0].scale / rs[0].sensitivity == pytest.approx(z, rel=1e-9)
        got = epsilon(rs, delta, "rdp")
        assert got <= eps + 1e-6 and got > eps - 1e-2   # the calibration is tight
    # a target twice as loose needs less noise
    loose = _releases(tmp_path / "loose", clip_mode="batch", epsilon=2 * eps)
    assert loose[0][0].scale < rel[0][0].scale


def test_noise_settings_are_exclusive_and_epsilon_needs_rounds():
    with pytest.raises(InputError, match="algorithm.sigma.*one of"):
        prepare(scenario_from_dict(_scenario(sigma=0.1, noise_multiplier=1.0)))
    with pytest.raises(InputError, match="algorithm.epsilon.*one of"):
        prepare(scenario_from_dict(_scenario(sigma=0.1, epsilon=1.0)))
    d = _scenario(epsilon=1.0)
    d["run"] = {"seed": 1, "until": 5.0}
    with pytest.raises(InputError, match="algorithm.rounds"):
        prepare(scenario_from_dict(d))


def test_an_epsilon_target_is_calibrated_before_the_run(tmp_path, monkeypatch):
    """The accountant's search (seconds) runs in the run's checks, once per sampling rate, not inside the simulation:
    the run's releases then take the multiplier calibrated there."""
    from netsim.algorithms import dp_dpsgd
    from netsim.sim.kernel import Simulation

    dp_dpsgd._multiplier.cache_clear()
    calls: list[str] = []
    advance = Simulation.advance

    def during_the_run(self, *a, **k):
        calls.append("run")
        return advance(self, *a, **k)

    monkeypatch.setattr(Simulation, "advance", during_the_run)
    sim = prepare(scenario_from_dict(_scenario(clip_mode="batch", epsilon=3.0)))
    assert not calls and dp_dpsgd._multiplier.cache_info().currsize == 1  # the 4 agents' one q
    rel = _releases(tmp_path, clip_mode="batch", epsilon=3.0)
    assert calls and dp_dpsgd._multiplier.cache_info().misses == 1  # the run's releases found it calibrated
    q = min(1.0, 16 / len(sim.agents[0].rows))
    assert {r.scale / r.sensitivity for rs in rel.values() for r in rs} == {noise_multiplier(3.0, 1e-5, [(q, ROUNDS)])}
