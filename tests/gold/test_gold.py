"""The gold standard (``pyro_dgp.gold``): NUTS on ``q*(U)`` against the closed-form optimum of
a one-layer GP (Titsias 2009), the quadrature of ``g(U)`` against Monte Carlo, the
distances between predictives against their closed forms, and ``compare_to_gold`` for guides
set to that optimum and away from it."""

import math

import pytest
import torch
from known_answers import whitened_optimum
from scipy import integrate
from scipy.stats import norm

import pyro_dgp as dgp
from pyro_dgp import gold
from pyro_dgp.gold.target import GoldTarget
from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.prediction import MixturePredictive

DT = torch.float64


def _t(x):
    return torch.tensor(x, dtype=DT)


def _one_layer(noise=0.05):
    """A one-layer GP with a Gaussian likelihood on 8 points, 4 inducing inputs."""
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(-1, 1, 8, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(8, generator=g, dtype=DT)
    Z = torch.linspace(-1, 1, 4, dtype=DT).unsqueeze(-1)
    layer = dgp.GPLayer(1, 1, inducing_points=Z, train_inducing=False,
                        kernel=dgp.kernels.RBF(1, lengthscale=_t(0.5), variance=_t(1.0)))
    return dgp.DeepGP([layer], Gaussian(_t(noise))), X, y


def _two_layer():
    X = torch.linspace(-1, 1, 6, dtype=DT).unsqueeze(-1)
    y = torch.tanh(3 * X[:, 0])
    first = dgp.GPLayer(1, 1, inducing_points=torch.linspace(-1, 1, 5, dtype=DT)[:, None],
                        kernel=dgp.kernels.RBF(1, lengthscale=_t(0.6), variance=_t(1.0)),
                        mean="identity")
    second = dgp.GPLayer(1, 1, inducing_points=torch.linspace(-1, 1, 3, dtype=DT)[:, None],
                         kernel=dgp.kernels.RBF(1, lengthscale=_t(0.8), variance=_t(1.0)))
    return dgp.DeepGP([first, second], Gaussian(_t(0.05))), X, y


def _titsias_predictive(model, X, y, Xs):
    """The collapsed optimum of Titsias (2009) at ``Xs``, in function space (no whitening):
    ``mean = s^-2 k_*z B^-1 K_zx y``, ``var = k_** - k_*z K_zz^-1 k_z* + k_*z B^-1 k_z*``,
    ``B = K_zz + s^-2 K_zx K_xz``."""
    layer = model.layers[0]
    with torch.no_grad():
        kern, Z, s2 = layer.kernel, layer.inducing_points, model.likelihood.variance
        Kzz = kern(Z) + 1e-10 * torch.eye(Z.shape[0], dtype=DT)
        Kzx, Kzs = kern(Z, X), kern(Z, Xs)
        B = Kzz + Kzx @ Kzx.mT / s2
        mean = Kzs.mT @ torch.linalg.solve(B, Kzx @ y) / s2
        kss = kern(Xs).diagonal()
        var = (kss - (Kzs * torch.linalg.solve(Kzz, Kzs)).sum(0)
               + (Kzs * torch.linalg.solve(B, Kzs)).sum(0))
    return mean, var


def test_nuts_matches_the_closed_form_elbo_optimum_of_one_layer():
    model, X, y = _one_layer()
    res = gold.run_nuts(model, X, y, target="elbo_optimum", num_samples=300,
                        warmup_steps=100, num_chains=1, seed=0, progress=False)
    assert res.divergences == [0]
    Xs = torch.linspace(-1.2, 1.2, 5, dtype=DT).unsqueeze(-1)
    pred = res.predict(Xs)
    mean, var = _titsias_predictive(model, X, y, Xs)
    # One layer: each draw's component is N(a_*^T v, v_*), v_* free of the draw, so the
    # predictive mean is the draws' mean of a_*^T v (standard error sd / sqrt(ESS)) and the
    # variance v_* plus their variance (standard error about sd^2 sqrt(2 / ESS), Gaussian
    # draws). ESS: the smallest over the entries of U, which bounds it for any linear map.
    ess = res.ess[0]
    assert ess > 100, res.ess
    sd = pred.loc.std(0)
    assert torch.all((pred.loc.mean(0) - mean).abs() < 4 * sd / math.sqrt(ess)), (
        pred.loc.mean(0), mean)
    total = pred.var.mean(0) + pred.loc.var(0)
    assert torch.all((total - var).abs() < 4 * sd.square() * math.sqrt(2 / ess)), (total, var)


def test_quadrature_of_g_matches_monte_carlo():
    model, X, y = _two_layer()
    torch.manual_seed(0)
    u = {"layer1.u": 0.5 * torch.randn(3, 1, 5, dtype=DT),
         "layer2.u": torch.randn(3, 1, 3, dtype=DT)}
    exact = gold.expected_log_likelihood(model, X, y, u, num_quadrature=30)
    assert exact.shape == (3,)
    # Monte Carlo: f1 ~ p(f1 | u1) per point, then the last layer's Gaussian expectation
    S = 20000
    first, second = model.layers
    with torch.no_grad():
        loc, var = first.conditional(X, u["layer1.u"].unsqueeze(1))  # (3, 1, N, 1)
        f1 = loc + var.sqrt() * torch.randn(3, S, X.shape[0], 1, dtype=DT)
        loc2, var2 = second.conditional(f1, u["layer2.u"].unsqueeze(1))
        ell = model.likelihood.expected_log_prob(y, loc2.squeeze(-1), var2.squeeze(-1))
        draws = ell.sum(-1)  # (3, S): per draw, summed over the points
    mc, se = draws.mean(-1), draws.std(-1) / math.sqrt(S)
    assert torch.all((exact - mc).abs() < 4 * se), (exact, mc, se)


def test_target_density_is_prior_plus_g_and_batches():
    model, X, y = _two_layer()
    target = GoldTarget(model, X, y, num_quadrature=10)
    torch.manual_seed(1)
    u = {"layer1.u": torch.randn(4, 1, 5, dtype=DT), "layer2.u": torch.randn(4, 1, 3, dtype=DT)}
    batched = target.log_density(u)
    one = torch.stack([target.log_density({k: v[i] for k, v in u.items()}) for i in range(4)])
    assert torch.allclose(batched, one, rtol=1e-12, atol=1e-10)
    prior = sum(-0.5 * v.square().sum((-2, -1)) - 0.5 * v[0].numel() * math.log(2 * math.pi)
                for v in u.values())  # whitened layers: N(0, I)
    assert torch.allclose(target.log_prior(u), prior)


def test_fixed_hyperparameters_train_the_guide_only():
    model, X, y = _one_layer()
    guide = dgp.guides.MeanField(model)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    flags = {k: v.requires_grad for k, v in model.named_parameters()}
    q0 = guide.q("layer1").loc.clone()
    with gold.fixed_hyperparameters(model):
        dgp.fit(model, guide, X, y, num_steps=20, lr=0.05, progress=False,
                final_elbo_particles=0)
    for k, v in model.named_parameters():
        assert torch.equal(v, before[k]), k
        assert v.requires_grad == flags[k], k
    assert not torch.equal(guide.q("layer1").loc, q0)


# ----------------------------------------------------------------------------- distances
def _gaussian(mu, sd, n=3):
    return MixturePredictive(torch.full((1, n), mu, dtype=DT), torch.full((1, n), sd**2,
                                                                              dtype=DT),
                             Gaussian(_t(0.1)))


def test_distance_is_zero_for_identical_predictives():
    g = torch.Generator().manual_seed(0)
    loc, var = torch.randn(7, 4, generator=g, dtype=DT), torch.rand(7, 4, generator=g,
                                                                    dtype=DT) + 0.1
    pred = MixturePredictive(loc, var, Gaussian(_t(0.1)))
    d = gold.predictive_distance(pred, pred)
    assert d.as_dict() == {"mean_abs": 0.0, "log_var_abs": 0.0, "w1": 0.0}
    assert gold.draws_w1(loc, loc.flip(0)) == 0.0  # the same draws in another order
    assert gold.draws_w1(loc, loc + 0.25) == pytest.approx(0.25, abs=1e-12)


def test_distance_of_two_gaussians_is_the_closed_form():
    # equal variances: W1 = |mu_a - mu_b|, exactly with common random numbers
    d = gold.predictive_distance(_gaussian(0.3, 0.5), _gaussian(-0.9, 0.5))
    assert d.mean_abs == pytest.approx(1.2, abs=1e-12)
    assert d.log_var_abs == pytest.approx(0.0, abs=1e-12)
    assert d.w1 == pytest.approx(1.2, abs=1e-9)
    # equal means: W1 = |s_a - s_b| E|Z| = |s_a - s_b| sqrt(2 / pi); the estimate is
    # |s_a - s_b| mean_j |z_j|, whose standard error is |s_a - s_b| sqrt(1 - 2 / pi) / sqrt(J)
    J = 4000
    d = gold.predictive_distance(_gaussian(0.0, 0.5), _gaussian(0.0, 2.0), num_draws=J)
    assert d.log_var_abs == pytest.approx(2 * math.log(4.0), abs=1e-12)
    se = 1.5 * math.sqrt(1 - 2 / math.pi) / math.sqrt(J)
    # averaged over the 3 points, each its own draws: the standard error shrinks by sqrt(3)
    assert abs(d.w1 - 1.5 * math.sqrt(2 / math.pi)) < 4 * se / math.sqrt(3)


def test_distance_of_a_mixture_uses_the_law_of_total_variance():
    loc = torch.tensor([[-1.0], [1.0]], dtype=DT)  # two components of variance 0.25
    mix = MixturePredictive(loc, torch.full_like(loc, 0.25), Gaussian(_t(0.1)))
    d = gold.predictive_distance(mix, _gaussian(0.0, 1.25**0.5, n=1))
    assert d.mean_abs == 0.0
    assert d.log_var_abs == pytest.approx(0.0, abs=1e-12)  # 0.25 + 1 = 1.25
    # bimodal against one Gaussian of the same moments: W1 = int |F_mix - F_gauss| dx =
    # 0.2214 (quadrature); over 60 seeds the estimate's standard deviation is 0.011
    assert abs(d.w1 - 0.2214) < 4 * 0.011


def test_compare_to_gold_is_the_distance_of_each_guide_and_zero_for_the_optimum():
    # A gold standard of S independent draws of the exact q*(U) of a one-layer GP (no MCMC
    # error), against a MeanField guide set to q* and one set to q* shifted by delta.
    model, X, y = _one_layer()
    layer = model.layers[0]
    m, C = whitened_optimum(model, X, y)
    S, J, seed = 4000, 2000, 3
    g = torch.Generator().manual_seed(1)
    v = m + torch.randn(S, 4, generator=g, dtype=DT) @ torch.linalg.cholesky(C).mT
    reference = gold.GoldStandard(model, {"layer1.u": v.reshape(1, S, 1, 4)})
    delta = torch.full((4,), 0.5, dtype=DT)
    guides = {}
    for name, loc in (("optimum", m), ("shifted", m + delta)):
        guides[name] = dgp.guides.MeanField(model)
        guides[name].set_q(torch.distributions.MultivariateNormal(loc, C), layer="layer1")
    Xs = torch.linspace(-1.2, 1.2, 7, dtype=DT).unsqueeze(-1)
    out = gold.compare_to_gold(reference, guides, Xs, num_samples=50, num_draws=J, seed=seed)
    assert set(out) == {"optimum", "shifted"}
    # each is predictive_distance of the guide's predictive from the gold standard's, at the
    # one seed
    for name, guide in guides.items():
        by_hand = gold.predictive_distance(
            reference.predict(Xs, seed=seed),
            dgp.predict(model, guide, Xs, num_samples=50, seed=seed), num_draws=J, seed=seed)
        assert out[name] == by_hand, name
    # f(x*) = a_*^T v + e, e ~ N(0, v_*): under q* it is N(a_*^T m, V), V = v_* + c2 with
    # c2 = a_*^T C a_*; the gold standard's mean of S draws has standard error
    # sqrt(c2 / S), its variance (v_* + the draws' variance of a_*^T v) sqrt(2 / S) c2
    with torch.no_grad():
        Ls = torch.linalg.solve_triangular(layer.kzz_cholesky(),
                                           layer.kernel(layer.inducing_points, Xs), upper=False)
        c2 = ((Ls.mT @ C) * Ls.mT).sum(-1)
        V = layer.kernel(Xs, diag=True) - Ls.square().sum(0) + c2
        shift = (Ls.mT @ delta).abs()  # |a_*^T delta|: the shifted guide's error of the mean
    se_mean = (c2 / S).sqrt()
    se_log_var = math.sqrt(2 / S) * c2 / V  # delta method
    best, off = out["optimum"], out["shifted"]
    assert best.mean_abs < 4 * float(se_mean.mean()), best
    assert best.log_var_abs < 4 * float(se_log_var.mean()), best
    # w1: with S >= J each side's J draws at a point are independent draws of N(a_*^T m, V),
    # and the empirical measure P_J of J draws of P has E W1(P_J, P) <= J_1 / sqrt(J),
    # J_1 = int sqrt(F (1 - F)) dx = sqrt(V) int sqrt(Phi (1 - Phi)) dz (Bobkov and Ledoux
    # 2019): E w1 <= 2 J_1 / sqrt(J), averaged over the points
    j1 = integrate.quad(lambda z: math.sqrt(norm.cdf(z) * norm.sf(z)), -40, 40)[0]  # 1.6147
    assert best.w1 < float((2 * j1 * V.sqrt() / math.sqrt(J)).mean()), best
    # shifted: the mean moves by a_*^T delta at each point, the variances do not; the draws
    # with the same standard normals move by exactly a_*^T delta, so by the triangle
    # inequality | w1 - mean |a_*^T delta| | <= w1 of the optimum
    assert abs(off.mean_abs - float(shift.mean())) < 4 * float(se_mean.mean()), off
    assert off.log_var_abs == pytest.approx(best.log_var_abs, abs=1e-12)
    assert abs(off.w1 - float(shift.mean())) <= best.w1 + 1e-12, (off, best)
    assert off.w1 > 20 * best.w1  # the shift is felt


# ----------------------------------------------------------------------------- bad input
def test_bad_input_is_named():
    model, X, y = _two_layer()
    with pytest.raises(TypeError, match="DeepGP"):
        gold.run_nuts(lambda x: x, X, y)
    with pytest.raises(ValueError, match="paths per point"):
        GoldTarget(model, X, y, num_quadrature=30_000)
    with pytest.raises(ValueError, match="layer2.u"):
        gold.expected_log_likelihood(model, X, y, {"layer1.u": torch.zeros(1, 5, dtype=DT)})
    with pytest.raises(ValueError, match="shape"):
        gold.expected_log_likelihood(model, X, y, {"layer1.u": torch.zeros(1, 4, dtype=DT),
                                                   "layer2.u": torch.zeros(1, 3, dtype=DT)})
    with pytest.raises(ValueError, match="num_samples"):
        gold.run_nuts(model, X, y, num_samples=0)
    with pytest.raises(ValueError, match="jobs must be a positive integer or 'auto'"):
        gold.run_nuts(model, X, y, jobs="all")
    model.layers[0].note = lambda: None  # a lambda does not pickle
    with pytest.raises(TypeError, match=r"run_nuts\(jobs=2\) sends the model and data to "
                       "worker processes by pickle, which failed"):
        gold.run_nuts(model, X, y, num_chains=2, jobs=2)
    del model.layers[0].note
    with pytest.raises(ValueError, match="different numbers of points"):
        gold.predictive_distance(_gaussian(0.0, 1.0, n=3), _gaussian(0.0, 1.0, n=2))
    with pytest.raises(ValueError, match="different shapes"):
        gold.draws_w1(torch.zeros(5, 3, dtype=DT), torch.zeros(5, 2, dtype=DT))
    with pytest.raises(ValueError, match="zero variance"):
        gold.predictive_distance(_gaussian(0.0, 0.0), _gaussian(0.0, 1.0))
    loc = torch.zeros(2, 3, dtype=DT)
    weighted = MixturePredictive(loc, torch.ones_like(loc), Gaussian(_t(0.1)),
                                 weights=torch.tensor([0.9, 0.1], dtype=DT))
    with pytest.raises(ValueError, match="weighted mixture"):
        gold.predictive_distance(weighted, _gaussian(0.0, 1.0))
    data = dgp.datasets.compositional_toy(n_train=10)
    locations = dgp.DeepGP.regression(data.X_train, data.y_train, num_inducing=4,
                                      inducing_scheme="propagated")
    with pytest.raises(ValueError, match="fixed inducing inputs"):
        gold.run_nuts(locations, data.X_train, data.y_train)
