"""``Mixture(init_from=[...])``: components started at trained Gaussian guides of the model."""

import pytest
import torch
from known_answers import split_layers
from torch.distributions import Categorical, MixtureSameFamily, MultivariateNormal

import pyro_dgp as dgp
from pyro_dgp.guides import Coupled, MeanField, Mixture

DT = torch.float64


def _two_layer(N=8):
    X = torch.linspace(-1, 1, N, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    return dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4), X, y


def _fits(model, X, y, seeds):
    guides = []
    for seed in seeds:
        guide = MeanField(model)
        dgp.fit(model, guide, X, y, num_steps=5, lr=0.05, seed=seed, progress=False,
                final_elbo_particles=0, lr_schedule="constant")
        guides.append(guide)
    return guides


def _source_mixture(guides, weights):
    qs = [g.q() for g in guides]
    components = MultivariateNormal(torch.stack([q.loc for q in qs]),
                                    scale_tril=torch.stack([q.scale_tril for q in qs]))
    return MixtureSameFamily(Categorical(probs=weights), components)


def test_a_mixture_started_at_fits_is_the_mixture_of_their_q():
    model, X, y = _two_layer()
    sources = _fits(model, X, y, seeds=[0, 1, 2])
    # the fits from different seeds differ, so the check below tells components apart
    assert not torch.allclose(sources[0].q().loc, sources[1].q().loc)
    mixture = Mixture(model, init_from=sources)
    assert mixture.num_components == 3
    v = torch.cat([g.q().sample((4,)) for g in sources])  # draws near each component
    uniform = _source_mixture(sources, torch.full((3,), 1 / 3, dtype=DT))
    torch.testing.assert_close(mixture.log_q(split_layers(mixture, v)).detach(),
                               uniform.log_prob(v), rtol=1e-9, atol=1e-9)
    weights = torch.tensor([0.5, 0.3, 0.2], dtype=DT)
    mixture.set_weights(weights)
    torch.testing.assert_close(mixture.log_q(split_layers(mixture, v)).detach(),
                               _source_mixture(sources, weights).log_prob(v),
                               rtol=1e-9, atol=1e-9)
    # the sources' parameters are theirs: the mixture's are copies
    names = {n for n, _ in mixture.named_parameters()}
    assert not any(n.startswith("init") or "starts" in n for n in names)


def test_init_from_is_checked_by_name():
    model, X, y = _two_layer()
    other, _, _ = _two_layer()
    with pytest.raises(ValueError, match=r"init_from\[1\].*model"):
        Mixture(model, init_from=[MeanField(model), MeanField(other)])
    with pytest.raises(ValueError, match="init_from must be a non-empty list"):
        Mixture(model, init_from=[])
    with pytest.raises(ValueError, match="init_from must be a non-empty list"):
        Mixture(model, init_from=MeanField(model))
    with pytest.raises(ValueError, match=r"num_components \(3\) differs.*init_from \(2\)"):
        Mixture(model, num_components=3, init_from=[MeanField(model), MeanField(model)])
    coupled = Coupled(model)
    with torch.no_grad():  # correlate the layers, which a mean-field component cannot hold
        q = coupled.q()
        tril = q.scale_tril.clone()
        tril[-1, 0] = 0.5
        coupled.set_q(MultivariateNormal(q.loc, scale_tril=tril))
    mixture = Mixture(model, init_from=[coupled])
    with pytest.raises(ValueError, match=r"init_from\[0\].*family='coupled'"):
        mixture.weights()
    assert Mixture(model, family="coupled", init_from=[coupled]).num_components == 1


@pytest.mark.slow
def test_a_mixture_of_fits_in_both_modes_of_the_two_mode_toy_keeps_both():
    # MeanField fits (1,500 Adam steps at 5e-3, as benchmarks/toys.py) land in either mode by
    # their seed; a mixture of one fit per mode, trained 500 steps by the stratified ELBO,
    # keeps both (the posterior's masses are one half each, by the reflection symmetry)
    from pyro_dgp import gold
    model, X, y = gold.two_mode_model()
    by_mode = {}
    for seed in range(8):
        guide = MeanField(model)
        with gold.fixed_hyperparameters(model):
            dgp.fit(model, guide, X, y, num_steps=1500, lr=5e-3, seed=seed, progress=False,
                    final_elbo_particles=0, lr_schedule="constant")
        values = gold.guide_layer_values(model, guide, X, "layer1", num_samples=500)
        by_mode.setdefault(bool(gold.rising(values).double().mean() > 0.5), guide)
        if len(by_mode) == 2:
            break
    assert len(by_mode) == 2, "no seed of 0..7 landed in the other mode"
    mixture = Mixture(model, init_from=list(by_mode.values()))
    with gold.fixed_hyperparameters(model):
        dgp.fit(model, mixture, X, y, num_steps=500, lr=5e-3, seed=0, progress=False,
                final_elbo_particles=0, lr_schedule="constant")
    values = gold.guide_layer_values(model, mixture, X, "layer1", num_samples=2000)
    share = float(gold.rising(values).double().mean())
    assert 0.35 <= share <= 0.65, (share, mixture.weights())


def _symmetrised_kl(p, q) -> float:
    kl = torch.distributions.kl_divergence
    return float(kl(p, q) + kl(q, p)) / 2


def test_one_per_mode_keeps_the_first_of_each_group_within_min_kl():
    model, X, y = _two_layer()
    fits = _fits(model, X, y, seeds=[0, 1, 2])
    qs = [g.q() for g in fits]
    d01, d02, d12 = (_symmetrised_kl(qs[i], qs[j]) for i, j in ((0, 1), (0, 2), (1, 2)))
    assert min(d01, d02, d12) > 0
    assert dgp.guides.one_per_mode(fits, model, min_kl=1e6) == [fits[0]]
    assert dgp.guides.one_per_mode(fits, model, min_kl=min(d01, d02, d12) / 2) == fits
    # a threshold between the distances keeps exactly the fits the greedy rule says
    below = sorted([d01, d02, d12])
    min_kl = (below[0] + below[1]) / 2
    expected = [0] + [k for k, d in ((1, d01), (2, d02)) if d > min_kl]
    if len(expected) == 3 and d12 <= min_kl:
        expected = expected[:2]
    assert dgp.guides.one_per_mode(fits, model, min_kl=min_kl) == [fits[k] for k in expected]


@pytest.mark.parametrize("min_kl", [0.0, -1.0, float("nan")])
def test_one_per_mode_refuses_a_threshold_that_is_not_positive(min_kl):
    model, X, y = _two_layer()
    with pytest.raises(ValueError, match="min_kl"):
        dgp.guides.one_per_mode(_fits(model, X, y, seeds=[0]), model, min_kl=min_kl)
