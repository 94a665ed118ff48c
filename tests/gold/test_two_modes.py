"""The two-mode toy of Havasi et al. 2018 (``pyro_dgp.gold.two_mode_model``): NUTS finds both
modes, MeanField sits in one, decided from draws of the first layer at ``x* = 1``.

A draw is in mode A where ``f^1(x*) > 0.5`` and in mode B where ``f^1(x*) < -0.5``
(``gold.mode_masses``; ``|f^1(x*)| ~ 1`` in both modes). "Both modes": at least 10% of the
draws in each. "One mode": none of 2,000 draws in one of them and at least 90% in the other (a
mode of mass ``p`` shows none of 2,000 draws with probability ``(1 - p)^2000``, below 1e-4 for
``p >= 0.5%``)."""

import dataclasses
import math

import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp import gold

X_STAR = torch.tensor([[gold.TWO_MODE_INPUT]], dtype=torch.float64)


def _nuts_masses(**kwargs):
    model, X, y = gold.two_mode_model()
    res = gold.run_nuts(model, X, y, target="elbo_optimum", progress=False, full_mass=True,
                        **kwargs)
    assert sum(res.divergences) == 0
    # the chains' draws pooled with equal weight (the stacking weights of two mirror-image
    # modes are arbitrary: both predict the data equally well)
    pooled = dataclasses.replace(res, chain_groups=None)
    return gold.mode_masses(pooled.layer_values(X_STAR, "layer1")), res


def _fit(make_guide, num_steps, seed=0):
    model, X, y = gold.two_mode_model()
    guide = make_guide(model)
    with gold.fixed_hyperparameters(model):
        dgp.fit(model, guide, X, y, num_steps=num_steps, lr=5e-3, objective="elbo", seed=seed,
                progress=False, final_elbo_particles=0, lr_schedule="constant")  # as measured
    return model, guide, X, y


def _fit_masses(make_guide, num_steps, seed=0):
    model, guide, X, y = _fit(make_guide, num_steps, seed)
    values = gold.guide_layer_values(model, guide, X_STAR, "layer1", num_samples=2000)
    return gold.mode_masses(values)


def _both(masses):
    return min(masses) >= 0.1


def _one(masses):
    return min(masses) == 0.0 and max(masses) >= 0.9


@pytest.mark.slow  # about 3 s of NUTS
def test_nuts_keeps_both_modes_from_starts_in_both():
    # reduced: 2 chains of 40 warm-up and 20 kept draws, 8 quadrature nodes, trees of depth
    # at most 4. Chains start at prior draws; seeds 3 and 4 start in the basins of B and A
    # (of seeds 0..7, seeds 4, 5 and 6 start in A's, the others in B's: the full test)
    masses, res = _nuts_masses(num_samples=20, warmup_steps=40, num_chains=2, seed=3,
                               num_quadrature=8, max_tree_depth=4)
    assert _both(masses), masses
    assert masses[0] == pytest.approx(0.5) and masses[1] == pytest.approx(0.5), masses
    assert res.groups == [[0], [1]]  # one group per mode


def test_meanfield_sits_in_one_mode():
    # from q(u) = N(0, I) (the prior, which covers both modes) 200 Adam steps suffice
    masses = _fit_masses(lambda m: dgp.guides.MeanField(m, inner_variance=1.0), 200)
    assert _one(masses), masses


# ------------------------------------------------------------------ the full protocol
@pytest.mark.slow
def test_full_size_nuts_finds_both_modes():
    # 8 chains from independent prior draws (seeds 0..7), 300 warm-up and 300 kept draws
    masses, res = _nuts_masses(num_samples=300, warmup_steps=300, num_chains=8, seed=0)
    assert _both(masses), masses


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_full_size_meanfield_sits_in_one_mode(seed):
    masses = _fit_masses(lambda m: dgp.guides.MeanField(m, inner_variance=1.0), 3000, seed)
    assert _one(masses), masses


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "measured: at the paper's settings (K = 100, noise and three hidden layers of 100, "
    "3,000 Adam steps at 5e-3, the guide's default start) SSIVI put 99.9% of its draws "
    "in mode A and none in B (BENCHMARKS.md, semi_implicit); starts with the mixture's "
    "means spread out stayed in one mode too (docs/design.md, the gold standard)"))
def test_full_size_ssivi_puts_draws_in_both_modes():
    masses = _fit_masses(lambda m: dgp.guides.SemiImplicit(m, num_mixing=100), 3000)
    assert _both(masses), masses


@pytest.mark.slow
def test_full_size_ssivi_with_correlated_components_fits_a_mode_as_meanfield():
    # measured (seeds 0, 1): ELBO -30.5 with component_scale="tril", against -34.5 with the
    # paper's diagonal components, MeanField -30.2; still one mode (docs/design.md)
    def elbo(make_guide):
        model, guide, X, y = _fit(make_guide, 3000)
        return dgp.evaluate_elbo(model, guide, X, y, num_particles=500, seed=1)

    tril = elbo(lambda m: dgp.guides.SemiImplicit(m, num_mixing=100, component_scale="tril"))
    mf = elbo(lambda m: dgp.guides.MeanField(m, inner_variance=1.0))
    assert tril.value > mf.value - 1.0 - 4 * math.hypot(tril.stderr, mf.stderr), (tril, mf)
