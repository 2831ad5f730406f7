"""Privacy mechanisms: clipping, and the drawn noise's scale and distribution (variance + KS)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from netsim.privacy.mechanisms import (
    NoiseSource,
    PrivacyError,
    check_release_args,
    clip,
    clip_coordinate,
    clip_l2,
)


def test_l2_clip_scales_only_long_vectors():
    x = torch.tensor([3.0, 4.0])  # norm 5
    torch.testing.assert_close(clip_l2(x, 1.0), torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(clip_l2(x, 10.0), x)  # short enough: unchanged
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    c = clip_l2(g, 2.0)
    assert math.isclose(torch.linalg.vector_norm(c).item(), 2.0, rel_tol=1e-12)
    torch.testing.assert_close(c / c.norm(), g / g.norm())  # direction kept
    assert clip_l2(torch.zeros(4), 1.0).abs().sum() == 0  # no division by zero


def test_coordinate_clip_clamps_each_coordinate():
    x = torch.tensor([-3.0, -0.5, 0.0, 0.2, 7.0])
    torch.testing.assert_close(clip_coordinate(x, 1.0), torch.tensor([-1.0, -0.5, 0.0, 0.2, 1.0]))
    torch.testing.assert_close(clip(x, 1.0, "coordinate"), clip_coordinate(x, 1.0))
    with pytest.raises(PrivacyError, match="clip kind"):
        clip(x, 1.0, "l1")
    with pytest.raises(PrivacyError, match="clip bound"):
        clip_l2(x, 0.0)


N = 200_000


@pytest.mark.parametrize("sigma", [0.3, 2.5])
def test_gaussian_noise_variance_and_ks(sigma):
    z = NoiseSource(seed=11).gaussian((N,), sigma, torch.float64).numpy()
    # sample variance: relative standard error sqrt(2/N) = 0.32 %; allow 5 standard errors
    assert abs(z.var() / sigma**2 - 1) < 5 * math.sqrt(2 / N)
    assert abs(z.mean()) < 5 * sigma / math.sqrt(N)
    assert stats.kstest(z, stats.norm(0, sigma).cdf).pvalue > 1e-3
    # the test has power: a 3 % wrong scale is rejected
    assert stats.kstest(z, stats.norm(0, sigma * 1.03).cdf).pvalue < 1e-6


@pytest.mark.parametrize("b", [0.5, 4.0])
def test_laplace_noise_variance_and_ks(b):
    z = NoiseSource(seed=12).laplace((N,), b, torch.float64).numpy()
    # Var Lap(b) = 2 b^2; kurtosis 6 => relative s.e. of the variance sqrt(5/N)
    assert abs(z.var() / (2 * b**2) - 1) < 5 * math.sqrt(5 / N)
    assert stats.kstest(z, stats.laplace(0, b).cdf).pvalue > 1e-3
    assert stats.kstest(z, stats.norm(0, b * math.sqrt(2)).cdf).pvalue < 1e-6  # not Gaussian


def test_noise_is_seeded_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    np_state = np.random.get_state()[1].copy()
    a = NoiseSource(seed=5).gaussian((100,), 1.0)
    b = NoiseSource(seed=5).gaussian((100,), 1.0)
    c = NoiseSource(seed=6).gaussian((100,), 1.0)
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert (np.random.get_state()[1] == np_state).all()


def test_add_keeps_dtype_shape_and_input():
    src = NoiseSource(seed=1)
    x = torch.ones(3, 4, dtype=torch.float64)
    y = src.add("gaussian", x, 0.1)
    assert y.shape == x.shape and y.dtype == torch.float64
    assert torch.equal(x, torch.ones(3, 4, dtype=torch.float64))


@pytest.mark.parametrize("args, match", [
    (("gaussian", -1.0, 1.0, 1.0), "sigma"),
    (("gaussian", float("nan"), 1.0, 1.0), "sigma"),
    (("gaussian", 1.0, 0.0, 1.0), "sensitivity"),
    (("gaussian", 1.0, 1.0, 0.0), "q must be"),
    (("gaussian", 1.0, 1.0, 1.5), "q must be"),
    (("exponential", 1.0, 1.0, 1.0), "mechanism"),
])
def test_bad_release_arguments_fail_loudly(args, match):
    with pytest.raises(PrivacyError, match=match):
        check_release_args(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (113,), (3, 5)])
def test_batched_gaussian_rows_are_each_agents_own_draws_bit_for_bit(dtype, shape):
    """A batch of releases noised at once draws, row by row, what each agent's generator gives one release at a
    time (sigmas not representable in float32 included), and leaves each generator where one draw would."""
    from netsim.compute.noise import gaussian_noise, gaussian_noise_rows, noise_generator

    sigmas = [0.1, 1 / 3, 2.7e-3, 5.0]
    batched = [noise_generator(s) for s in (11, 12, 13, 14)]
    single = [noise_generator(s) for s in (11, 12, 13, 14)]
    for _ in range(3):  # consecutive rounds: the generators advance alike
        z = gaussian_noise_rows(shape, sigmas, batched, dtype)
        want = torch.stack([gaussian_noise(shape, s, g, dtype) for s, g in zip(sigmas, single, strict=True)])
        assert z.dtype == dtype and torch.equal(z, want)
    assert not torch.equal(z[0], z[1])  # the rows are independent draws
