"""The reflection symmetry of the toys (``gold.symmetry``), the symmetric toy
(``gold.symmetric_model``) and the modes' masses by importance sampling (``gold.modes``)."""

import dataclasses

import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp import gold
from pyro_dgp.gold.chains import ChainGroups
from pyro_dgp.gold.posterior import PosteriorTarget

DT = torch.float64


def _prior_draws(target, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, prior in zip(target.names, target.priors, strict=True):
        shape = (n,) + prior.event_shape
        out[name] = torch.randn(shape, generator=g, dtype=DT)  # both priors are N(0, I)
    return out


@pytest.mark.parametrize("make", [gold.two_mode_model, gold.symmetric_model])
@pytest.mark.parametrize("whiten", [True, False])
def test_the_log_joint_is_invariant_under_the_reflection(make, whiten):
    model, X, y = make()
    model.layers[1].whiten = whiten  # u^2 as function values: reflected by P alone
    gold.check_reflection_symmetric(model)
    target = PosteriorTarget(model, X, y)
    draws = _prior_draws(target, 5)
    mirror = gold.reflect_draws(model, draws)
    assert not torch.allclose(mirror["layer2.u"], draws["layer2.u"])
    torch.testing.assert_close(target.log_density(mirror), target.log_density(draws),
                               rtol=1e-10, atol=1e-8)
    # the first layer's values at the data change sign: a rising draw becomes a falling one
    H = [target.propagate(d, X, 0, keep_last_gaussian=True)[0] for d in (draws, mirror)]
    torch.testing.assert_close(H[1], -H[0], rtol=1e-8, atol=1e-8)
    assert bool((gold.rising(H[0]) != gold.rising(H[1])).all())


def test_models_without_the_symmetry_are_named():
    X = torch.linspace(-1, 1, 6, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, torch.sin(X[:, 0]), num_layers=2, num_inducing=3)
    with pytest.raises(ValueError, match="mean function other than zero"):
        gold.check_reflection_symmetric(model)
    toy, _, _ = gold.symmetric_model()
    with torch.no_grad():
        toy.layers[1].inducing_points.add_(0.1)
    with pytest.raises(ValueError, match="inducing inputs of layer 'layer2' are not symmetric"):
        gold.check_reflection_symmetric(toy)
    with pytest.raises(ValueError, match="two-layer"):
        gold.check_reflection_symmetric(dgp.DeepGP.regression(X, X[:, 0], num_layers=3))


@pytest.mark.parametrize("make", [gold.two_mode_model, gold.symmetric_model])
def test_importance_mode_masses_are_a_half_on_the_symmetric_toys(make):
    model, X, y = make()
    masses = gold.importance_mode_masses(model, X, y, num_draws=50_000, seed=1)
    assert masses.ess > 500
    assert abs(masses.rising - 0.5) < 4 * masses.stderr, masses
    assert masses.rising + masses.falling == pytest.approx(1.0)


def test_importance_mode_masses_see_an_asymmetric_first_layer():
    # a first layer of mean m(x) = 3 x rises in nearly every prior draw and fits y = sin(2x)
    model, X, y = gold.symmetric_model()
    model.layers[0] = dgp.GPLayer(1, 1, inducing_points=X.clone(), train_inducing=False,
                                  mean=torch.tensor([[3.0]], dtype=DT),
                                  kernel=dgp.kernels.RBF(1, lengthscale=torch.tensor(1.0, dtype=DT),
                                                         variance=torch.tensor(1.0, dtype=DT)))
    masses = gold.importance_mode_masses(model, X, y, num_draws=50_000)
    assert masses.rising > 0.9, masses


def test_symmetrised_adds_each_chain_s_mirror_with_half_its_group_s_weight():
    model, X, y = gold.symmetric_model()
    target = PosteriorTarget(model, X, y)
    draws = _prior_draws(target, 8)
    samples = {k: v.reshape(2, 4, *v.shape[1:]) for k, v in draws.items()}  # 2 chains of 4
    groups = ChainGroups([[0], [1]], torch.tensor([1.0, 0.0], dtype=DT), [1.0, 1.0],
                         [4.0, 4.0], [0.1, 0.1], torch.zeros(X.shape[0], 2, dtype=DT))
    base = gold.GoldStandard(model, samples, target="posterior", X=X, y=y,
                             chain_groups=groups)
    sym = gold.symmetrised(base)
    assert sym.num_chains == 4 and sym.groups == [[0], [1], [2], [3]]
    torch.testing.assert_close(sym.weights, torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=DT))
    torch.testing.assert_close(sym.samples["layer1.u"][2:], -samples["layer1.u"])
    # the resampled draws (16 of them): chain 0 and its mirror, each draw twice
    picked = sym.weighted_draws()["layer1.u"]
    chain = samples["layer1.u"][0].repeat_interleave(2, dim=0)
    torch.testing.assert_close(picked, torch.cat([chain, -chain]))
    with pytest.raises(ValueError, match="grouped"):
        gold.symmetrised(dataclasses.replace(base, chain_groups=None))
