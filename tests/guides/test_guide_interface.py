"""The guide interface every family shares: read and set q(u) in the layers' u-space, right
after construction, and the ELBO of a chosen q against the closed-form SVGP ELBO."""

import math

import pytest
import torch
from known_answers import dense_svgp_elbo, single_layer
from torch.distributions import LowRankMultivariateNormal, MultivariateNormal

import pyro_dgp as dgp
from pyro_dgp.guides.registry import (
    GUIDES,
    LOCAL_INDUCING_GUIDES,
    SEMI_IMPLICIT_GUIDES,
    make_guide,
)

DT = torch.float64
#: families whose estimator of a one-layer ELBO is exact: u of the last layer is integrated
#: out (collapsed) and the KL is in closed form. Low-rank Coupled integrates only the diagonal
#: part of its covariance (the low-rank part is drawn), so it is unbiased, not exact.
EXACT = {"meanfield", "coupled", "coupled-per-point", "chain", "chain-per-point"}
#: families with no Gaussian q(u^l) of a layer to read or set, and the error that says so: a
#: normalising flow; the semi-implicit families (a continuous mixture of Gaussians, Molchanova
#: et al. 2019); the amortized guides, whose q(u_n) is one Gaussian per data point (Meng and
#: Zhang 2024; they are checked on a one-layer model of AmortizedGPLayers, the only kind they
#: fit); and a finite mixture of Gaussians (guides.Mixture)
NOT_GAUSSIAN = {"autoiaf": "not a known Gaussian", "mixture": r"Mixture: q\(u\) is not Gaussian",
                **{name: r"SemiImplicit: q\(u\) is not Gaussian"
                   for name in SEMI_IMPLICIT_GUIDES},
                **{name: "per data point" for name in LOCAL_INDUCING_GUIDES}}


def _chosen_q(M: int, low_rank: int | None = None):
    g = torch.Generator().manual_seed(7)
    loc = 0.5 * torch.randn(M, generator=g, dtype=DT)
    if low_rank is not None:
        W = 0.3 * torch.randn(M, low_rank, generator=g, dtype=DT)
        d = 0.05 + 0.1 * torch.rand(M, generator=g, dtype=DT)
        return LowRankMultivariateNormal(loc, W, d)
    A = torch.randn(M, M, generator=g, dtype=DT)
    return MultivariateNormal(loc, covariance_matrix=0.05 * A @ A.mT / M + 0.02 * torch.eye(
        M, dtype=DT))


def _rank(name, guide):
    """The rank of a low-rank family (``None`` for the others)."""
    if name == "coupled-lowrank":
        return guide.rank
    if name == "autolowrank":
        _ = guide.layer_names  # sets the autoguide up
        return guide.inner.rank
    return None


@pytest.mark.parametrize("name", sorted(GUIDES))
def test_every_family_set_to_a_chosen_gaussian_gives_the_closed_form_svgp_elbo(name):
    """Set right after construction (no call of the guide), through ``set_q``; the ELBO is the
    closed form exactly where the family's estimator is exact, else within 3 Monte Carlo
    standard errors."""
    model, X, y = single_layer(M=12)
    if name in LOCAL_INDUCING_GUIDES:
        model = dgp.gp.avdgp_regression(X, y, hidden_dims=(), num_inducing=12)
    guide = make_guide(name, model)
    if name in NOT_GAUSSIAN:
        with pytest.raises(NotImplementedError, match=NOT_GAUSSIAN[name]):
            guide.q("layer1")
        return
    q = _chosen_q(12, low_rank=_rank(name, guide))
    if name == "autonormal":  # a diagonal family
        q = MultivariateNormal(q.loc, covariance_matrix=torch.diag(q.variance))
    guide.set_q(q, "layer1")
    got = guide.q("layer1")
    torch.testing.assert_close(got.loc, q.loc)
    torch.testing.assert_close(got.covariance_matrix, q.covariance_matrix)
    L = torch.linalg.cholesky(q.covariance_matrix)
    exact = dense_svgp_elbo(model, X, y, q.loc.unsqueeze(0), L.unsqueeze(0))
    estimate = dgp.evaluate_elbo(model, guide, X, y, num_particles=4 if name in EXACT else 400)
    if name in EXACT:
        assert estimate.value == pytest.approx(exact, rel=1e-8)
        assert estimate.stderr < 1e-8 * abs(exact)
    else:
        assert abs(estimate.value - exact) < 3 * estimate.stderr, (estimate, exact)


@pytest.mark.parametrize("name", sorted(set(GUIDES) - set(NOT_GAUSSIAN)))
def test_q_is_usable_after_construction_detached_and_kept_by_the_first_call(name):
    X = torch.linspace(-1, 1, 20, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
    guide = make_guide(name, model)
    assert guide.layer_names == ["layer1", "layer2"]
    joint = guide.q()
    assert joint.event_shape == (5 + 5,) and not joint.loc.requires_grad
    q = _chosen_q(5, low_rank=None if _rank(name, guide) is None else 2)
    if name in ("coupled-lowrank", "autolowrank"):
        with pytest.raises(ValueError, match="rank"):
            guide.set_q(q, "layer1")
        return
    if name == "autonormal":  # a diagonal family
        q = MultivariateNormal(q.loc, covariance_matrix=torch.diag(q.variance))
    guide.set_q(q, "layer2")
    guide(X, y)  # the first call must not re-create the parameters
    torch.testing.assert_close(guide.q("layer2").covariance_matrix, q.covariance_matrix)
    assert not guide.q("layer2").covariance_matrix.requires_grad


@pytest.mark.parametrize("name", ["meanfield", "autonormal"])
def test_families_with_independent_layers_refuse_a_correlated_joint(name):
    X = torch.linspace(-1, 1, 10, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=2, num_inducing=3)
    guide = make_guide(name, model)
    A = torch.randn(6, 6, dtype=DT, generator=torch.Generator().manual_seed(0))
    q = MultivariateNormal(torch.zeros(6, dtype=DT), covariance_matrix=A @ A.mT + torch.eye(6))
    with pytest.raises(ValueError, match="correlat|diagonal"):
        guide.set_q(q)


def test_chain_refuses_a_joint_that_is_not_chain_structured_and_takes_one_that_is():
    X = torch.linspace(-1, 1, 10, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=3, num_inducing=2)
    guide = dgp.guides.Chain(model)
    g = torch.Generator().manual_seed(0)
    # a Markov chain over layers: layer 3 depends on layer 1 only through layer 2
    A = torch.randn(6, 6, dtype=DT, generator=g)
    dense = MultivariateNormal(torch.zeros(6, dtype=DT), covariance_matrix=A @ A.mT + 0.1 *
                               torch.eye(6, dtype=DT))
    with pytest.raises(ValueError, match="chain-structured"):
        guide.set_q(dense)
    coupled = dgp.guides.Coupled(model)
    coupled.set_q(coupled.q())  # a Coupled q at initialisation: independent layers
    guide.set_q(coupled.q())
    torch.testing.assert_close(guide.q().covariance_matrix, coupled.q().covariance_matrix)


def test_set_q_names_the_problem():
    X = torch.linspace(-1, 1, 10, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=2, num_inducing=3)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(KeyError, match="no GP layer 'layer9'"):
        guide.q("layer9")
    with pytest.raises(ValueError, match="3 entries"):
        guide.set_q(MultivariateNormal(torch.zeros(4, dtype=DT), torch.eye(4, dtype=DT)),
                    "layer1")
    with pytest.raises(TypeError, match="MultivariateNormal"):
        guide.set_q(torch.distributions.Normal(0.0, 1.0), "layer1")


def test_layer_kl_of_a_set_q_is_the_gaussian_kl_to_the_prior():
    model, X, y = single_layer(M=6)
    q = _chosen_q(6)
    for name in ("meanfield", "coupled", "chain", "autonormal", "automvn"):
        guide = make_guide(name, model)
        if name == "autonormal":  # diagonal family
            q = MultivariateNormal(q.loc, covariance_matrix=torch.diag(q.variance))
        guide.set_q(q, "layer1")
        prior = MultivariateNormal(torch.zeros(6, dtype=DT), torch.eye(6, dtype=DT))
        want = float(torch.distributions.kl_divergence(q, prior))
        assert float(guide.layer_kl(guide.site("layer1"))) == pytest.approx(want, rel=1e-9)
        assert float(guide.layer_kl("layer1")) == pytest.approx(want, rel=1e-9)


def test_fit_reports_the_elbo_at_the_final_parameters():
    model, X, y = single_layer(M=6)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, X, y, num_steps=30, lr=0.05, progress=False)
    loc, tril = (t.detach() for t in guide.q_params(guide.layer_sites[0]))
    assert result.final_elbo == pytest.approx(dense_svgp_elbo(model, X, y, loc, tril),
                                              rel=1e-8)
    assert "final_elbo" in repr(result) and len(repr(result)) < 200
    assert math.isfinite(result.final_elbo_stderr)


@pytest.mark.parametrize("entry", ["fit", "predict", "to_datatree", "variational_pareto_k",
                                   "layer_kl"])
def test_a_guide_of_another_model_is_refused_naming_both(entry):
    X = torch.linspace(-1, 1, 12, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=3, name="ours")
    other = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=3, name="theirs")
    guide = dgp.guides.MeanField(other)
    calls = {
        "fit": lambda: dgp.fit(model, guide, X, y, num_steps=1, progress=False),
        "predict": lambda: dgp.predict(model, guide, X, num_samples=2),
        "to_datatree": lambda: dgp.to_datatree(model, guide, X, y, num_samples=2),
        "variational_pareto_k": lambda: dgp.variational_pareto_k(model, guide, X, y,
                                                                 num_samples=10),
        "layer_kl": lambda: dgp.diagnostics.layer_kl(model, guide, X),
    }
    with pytest.raises(ValueError, match=f"{entry}: .*'theirs'.*'ours'"):
        calls[entry]()


def test_importance_weighted_objectives_refuse_guides_without_per_draw_weights():
    """``dgp.importance.RenyiELBO`` used directly checks the guide as ``fit`` does: collapsed
    and closed-form-KL guides give no importance weights (their Renyi values can exceed
    ``log p(y)``)."""
    model, X, y = single_layer(M=4)
    renyi = dgp.importance.RenyiELBO(alpha=0.5, num_particles=2)
    for name in ("meanfield", "coupled", "chain"):
        guide = make_guide(name, model)
        with pytest.raises(ValueError, match=f"importance weight, which {type(guide).__name__}"):
            renyi.loss(model, guide, X, y)
        with pytest.raises(ValueError, match="importance weight"):
            renyi.loss_and_grads(model, guide, X, y)
    with pytest.raises(ValueError, match=r"SemiImplicit does not give \(its log q\(u\) has no "
                                         "closed form"):
        renyi.loss(model, make_guide("ssivi", model), X, y)
    for name in ("meanfield-sampled", "autonormal"):
        assert math.isfinite(renyi.loss(model, make_guide(name, model), X, y))


@pytest.mark.parametrize("name", ["meanfield", "coupled", "chain", "ssivi", "autonormal"])
def test_a_fresh_guide_loads_a_state_dict(name):
    """Guides create their parameters lazily: ``load_state_dict`` on a guide that has not run
    sets it up first, so the usual PyTorch save/load works and restores every tensor."""
    import copy

    step = dgp.datasets.step(n_train=40, n_test=10, seed=0)
    model = dgp.DeepGP.regression(step.X_train, step.y_train, num_layers=2, num_inducing=5)
    trained = make_guide(name, model)
    trained(step.X_train, step.y_train)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.1)
    fresh = make_guide(name, model)
    fresh.load_state_dict(trained.state_dict())
    want, got = trained.state_dict(), fresh.state_dict()
    assert list(want) == list(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    # a guide copied without its model guides the copy of the model: the error says so
    with pytest.raises(ValueError, match="another object of the same name: a copy"):
        dgp.predict(model, copy.deepcopy(trained), step.X_test, num_samples=2)
