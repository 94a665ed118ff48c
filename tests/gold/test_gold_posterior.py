"""The gold standard's posterior target (``gold.run_nuts(target="posterior")``) against the
exact GP posterior of one layer and an importance-sampling reference on the two-mode toy, and
the combination of chains by grouping and stacking (``pyro_dgp.gold.chains``)."""

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from arviz_stats.base import array_stats

import pyro_dgp as dgp
from pyro_dgp import gold
from pyro_dgp.gold.chains import ChainGroups, GoldMixingWarning, combine_chains
from pyro_dgp.gold.posterior import MAX_POSTERIOR_POINTS, PosteriorTarget
from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.stacking import stacking_weights

DT = torch.float64


def _t(x):
    return torch.tensor(x, dtype=DT)


def _one_layer(noise=0.05, n=8):
    """A one-layer GP with a Gaussian likelihood on ``n`` points, 4 inducing inputs."""
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(-1, 1, n, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=DT)
    Z = torch.linspace(-1, 1, 4, dtype=DT).unsqueeze(-1)
    layer = dgp.GPLayer(1, 1, inducing_points=Z, train_inducing=False,
                        kernel=dgp.kernels.RBF(1, lengthscale=_t(0.5), variance=_t(1.0)))
    return dgp.DeepGP([layer], Gaussian(_t(noise))), X, y


def _exact_gp(model, X, y, Xs):
    """The exact GP posterior predictive of ``f`` at ``Xs``: ``k_*X (K + s^2 I)^-1 y`` and
    ``k_** - k_*X (K + s^2 I)^-1 k_X*``."""
    kern, s2 = model.layers[0].kernel, model.likelihood.variance
    with torch.no_grad():
        K = kern(X) + s2 * torch.eye(X.shape[0], dtype=DT)
        Ks = kern(X, Xs)
        return Ks.mT @ torch.linalg.solve(K, y), kern(Xs, diag=True) - (
            Ks * torch.linalg.solve(K, Ks)).sum(0)


def _mcse(per_draw: torch.Tensor) -> np.ndarray:
    """MCSE of the mean of a per-draw quantity ``(C, S, K)``, per entry (arviz-stats)."""
    x = per_draw.detach().numpy()
    return np.asarray(array_stats.mcse(x, chain_axis=0, draw_axis=1))


def _moments_and_mcse(res, Xs):
    """Predictive mean and variance of ``f`` at ``Xs`` from the chains' draws (all chains,
    equal weight, in chain order) and their MCSEs: the variance as the mean of
    ``var_s + (loc_s - mean)^2``."""
    C, S = res.samples["layer1.u"].shape[:2]
    pred = dataclasses.replace(res, chain_groups=None).predict(Xs)
    loc, var = pred.loc.reshape(C, S, -1), pred.var.reshape(C, S, -1)
    mean = loc.mean((0, 1))
    spread = var + (loc - mean).square()
    return mean, spread.mean((0, 1)), _mcse(loc), _mcse(spread)


# ------------------------------------------------------------------ known answers
def _one_layer_posterior_of_v(model, X, y):
    """The one-layer GP's exact posterior of the whitened ``v``: ``y | v ~ N(A^T v, R)``,
    ``R = K_XX - A^T A + s^2 I``, ``A = L_ZZ^-1 K_ZX``, so ``v | y`` has precision
    ``P = I + A R^-1 A^T`` and mean ``P^-1 A R^-1 y``. Returns ``(mean, cov, A, R)``."""
    layer, s2 = model.layers[0], model.likelihood.variance
    with torch.no_grad():
        A = torch.linalg.solve_triangular(layer.kzz_cholesky(),
                                          layer.kernel(layer.inducing_points, X), upper=False)
        R = layer.kernel(X) - A.mT @ A + s2 * torch.eye(X.shape[0], dtype=DT)
        P = torch.eye(A.shape[0], dtype=DT) + A @ torch.linalg.solve(R, A.mT)
        cov = torch.linalg.inv(P)
        return cov @ A @ torch.linalg.solve(R, y), cov, A, R


def test_posterior_density_of_one_layer_is_the_closed_form():
    model, X, y = _one_layer()
    target = PosteriorTarget(model, X, y)
    assert target.names == ["layer1.u"]  # one layer: nothing inner to sample
    mean, cov, A, R = _one_layer_posterior_of_v(model, X, y)
    v = mean + torch.randn(5, 4, generator=torch.Generator().manual_seed(0), dtype=DT)
    log_post = torch.distributions.MultivariateNormal(mean, cov).log_prob(v)
    diff = target.log_density({"layer1.u": v.unsqueeze(-2)}) - log_post
    assert torch.allclose(diff, diff[0].expand(5), atol=1e-9), diff  # equal up to log p(y)
    # the leave-one-out conditionals of y | v ~ N(A^T v, R), by conditioning on the others
    loo = target.loo_log_likelihood({"layer1.u": v[:1].unsqueeze(-2)})[0]
    mu, N = A.mT @ v[0], X.shape[0]
    for n in range(N):
        rest = [i for i in range(N) if i != n]
        k = R[n, rest]
        gain = torch.linalg.solve(R[rest][:, rest], k)
        m = mu[n] + gain @ (y[rest] - mu[rest])
        var = R[n, n] - k @ gain
        by_hand = torch.distributions.Normal(m, var.sqrt()).log_prob(y[n])
        assert float(loo[n]) == pytest.approx(float(by_hand), abs=1e-9), n


def test_posterior_predictive_of_exact_draws_is_the_exact_gp():
    # S independent draws of the exact p(v | y) (no MCMC error) through the gold standard's
    # posterior predictive: each draw's f(x*) | v, y is Gaussian (the GP conditional given
    # v and the noisy y), so the mixture is the exact GP predictive up to the draws' error
    model, X, y = _one_layer()
    mean, cov, _, _ = _one_layer_posterior_of_v(model, X, y)
    S = 4000
    g = torch.Generator().manual_seed(1)
    v = mean + torch.randn(S, 4, generator=g, dtype=DT) @ torch.linalg.cholesky(cov).mT
    res = gold.GoldStandard(model, {"layer1.u": v.reshape(1, S, 1, 4)}, target="posterior",
                            X=X, y=y)
    Xs = torch.linspace(-1.2, 1.2, 7, dtype=DT).unsqueeze(-1)
    pred = res.predict(Xs)
    exact_mean, exact_var = _exact_gp(model, X, y, Xs)
    # var_s is the same for every draw; the draws' spread of loc_s is the rest
    spread = pred.loc.var(0)
    assert torch.allclose(pred.var, pred.var[:1].expand_as(pred.var), atol=1e-12)
    assert torch.all((pred.loc.mean(0) - exact_mean).abs() < 4 * (spread / S).sqrt())
    total = pred.var[0] + spread
    assert torch.all((total - exact_var).abs() < 4 * spread * math.sqrt(2 / S) + 1e-9), (
        total, exact_var)


@pytest.mark.slow
def test_posterior_of_one_layer_is_the_exact_gp_and_agreeing_chains_are_one_group():
    model, X, y = _one_layer()
    res = gold.run_nuts(model, X, y, num_samples=300, warmup_steps=150, num_chains=2, seed=0,
                        progress=False)
    assert res.target == "posterior" and res.divergences == [0, 0]
    # both chains in the one mode: one group, weight 1, mixed within
    assert res.groups == [[0, 1]]
    assert res.weights.tolist() == [1.0]
    assert res.chain_groups.r_hat[0] < 1.05 and res.chain_groups.ess_per_chain[0] > 50
    Xs = torch.linspace(-1.2, 1.2, 5, dtype=DT).unsqueeze(-1)
    mean, var, se_mean, se_var = _moments_and_mcse(res, Xs)
    exact_mean, exact_var = _exact_gp(model, X, y, Xs)
    # within 4 Monte Carlo standard errors (arviz-stats' MCSE from the chains' ESS)
    assert np.all(np.abs((mean - exact_mean).numpy()) < 4 * se_mean), (mean, exact_mean)
    assert np.all(np.abs((var - exact_var).numpy()) < 4 * se_var + 1e-6), (var, exact_var)


@pytest.mark.slow
def test_two_mode_posterior_matches_importance_sampling():
    # the toy with a likelihood variance of 0.1 (NUTS on the default 1e-2 takes minutes:
    # benchmarks/gold.py records it). Both modes give the same predictive of f^2 (mirror
    # images), so one chain checks it
    model, X, y = gold.two_mode_model(noise=0.1)
    x_star = _t([[-0.5]])
    # the posterior by importance sampling (gold.two_mode_posterior_predictive, the last
    # layer's exact GP marginal likelihood as weight), independent of NUTS
    _, reference, se_ref = gold.two_mode_posterior_predictive(model, X, y, x_star)
    assert reference == pytest.approx(0.0515, abs=0.001)  # measured: 0.05153 (0.00011)
    res = gold.run_nuts(model, X, y, num_samples=150, warmup_steps=100, num_chains=1, seed=0,
                        full_mass=True, max_tree_depth=6, progress=False)
    assert sum(res.divergences) == 0
    _, var, _, se_var = _moments_and_mcse(res, x_star)
    assert abs(float(var[0]) - reference) < 4 * math.hypot(float(se_var[0]), se_ref), (
        float(var[0]), reference, float(se_var[0]), se_ref)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pyro_dgp.gold.chains.GoldMixingWarning")  # short chains
def test_chains_in_worker_processes_are_the_chains_run_here():
    """``jobs=2``: chain 0 here, chain 1 in a spawned one-thread worker; with one thread here
    too, every draw and diagnostic is the run's one after another."""
    model, X, y = gold.two_mode_model()
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for jobs in (1, 2):
            runs[jobs] = gold.run_nuts(model, X, y, num_samples=8, warmup_steps=8,
                                       num_chains=2, seed=3, max_tree_depth=3, progress=False,
                                       jobs=jobs)
    finally:
        torch.set_num_threads(threads)
    for name, draws in runs[1].samples.items():
        assert torch.equal(draws, runs[2].samples[name]), name
    assert runs[1].divergences == runs[2].divergences
    assert runs[1].step_size == runs[2].step_size
    assert len(runs[2].seconds) == 2


@pytest.mark.slow
def test_two_separated_modes_are_two_groups_weighed_by_stacking():
    # chains seeded 3 and 4 start in the basins of modes B and A (tests/gold/test_two_modes.py)
    model, X, y = gold.two_mode_model()
    res = gold.run_nuts(model, X, y, num_samples=30, warmup_steps=40, num_chains=2, seed=3,
                        full_mass=True, max_tree_depth=4, progress=False)
    assert res.groups == [[0], [1]]
    # each chain in its own mode: the first layer's orientation, the sign of
    # f^1(1) - f^1(-1), opposite in the two chains (its values at the data are the whitened
    # u^1 times the Cholesky factor of K_ZZ, Z = X; under the posterior the last layer is a
    # stationary GP on them, so their level is free and the sign of f^1(1) alone is not)
    with torch.no_grad():
        f1 = res.samples["layer1.u"][:, :, 0] @ model.layers[0].kzz_cholesky().mT  # (C, S, 7)
    sign = torch.sign(f1[..., -1] - f1[..., 0])
    assert bool((sign[0] == sign[0, 0]).all() and (sign[1] == -sign[0, 0]).all())
    groups = res.chain_groups
    assert groups.elpd_loo.shape == (7, 2)
    assert torch.equal(res.weights, stacking_weights(groups.elpd_loo))
    # the weighted draws: each group's share of the 60 is its weight, to the nearest draw
    drawn = res.weighted_draws()["layer1.u"]
    in_first = sum(bool((d == res.samples["layer1.u"][0]).all((-2, -1)).any()) for d in drawn)
    assert abs(in_first - 60 * float(res.weights[0])) <= 1


# ------------------------------------------------------------------ chains and stacking
def _iid_chains(locs, S=400, T=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([loc + torch.randn(S, T, generator=g, dtype=DT) for loc in locs])


def test_chains_in_two_places_form_two_groups_and_stacking_prefers_the_better():
    draws = _iid_chains([0.0, 0.0, 0.0, 10.0])  # (4, 400, 3): three chains at 0, one at 10
    C, S, N = 4, 400, 5
    ll = torch.zeros(C, S, N, dtype=DT)
    ll[:3] = -1.0  # the chains at 0 predict every point worse than the one at 10
    with warnings.catch_warnings():
        warnings.simplefilter("error", GoldMixingWarning)  # independent draws: they mixed
        out = combine_chains(draws, ll)
    assert out.groups == [[0, 1, 2], [3]]
    assert max(out.r_hat) < 1.01 and min(out.ess_per_chain) > 100
    assert torch.allclose(out.elpd_loo, torch.tensor([[-1.0, 0.0]] * N, dtype=DT))
    assert float(out.weights[1]) > 0.999
    # equal predictions: equal weights; each group better at half the points: equal too
    assert torch.allclose(combine_chains(draws, torch.zeros(C, S, N, dtype=DT)).weights,
                          torch.full((2,), 0.5, dtype=DT), atol=1e-6)
    ll = torch.zeros(C, S, 4, dtype=DT)
    ll[:3, :, :2] = -3.0
    ll[3, :, 2:] = -3.0
    assert torch.allclose(combine_chains(draws, ll).weights,
                          torch.full((2,), 0.5, dtype=DT), atol=1e-4)


def test_groups_of_few_draws_use_raw_importance_weights():
    # under 25 draws a group's Pareto tail cannot be fitted: plain importance sampling of
    # the leave-one-out values (weights 1 / p_s), no k. Its LOO density is then the harmonic
    # mean of the draws' p_s: log(S / sum_s 1 / p_s)
    draws = _iid_chains([0.0, 10.0], S=10)
    ll = -1.0 - torch.rand(2, 10, 3, generator=torch.Generator().manual_seed(2), dtype=DT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GoldMixingWarning)
        out = combine_chains(draws, ll)
    assert out.groups == [[0], [1]]
    assert all(math.isnan(k) for k in out.khat)
    harmonic = math.log(10) - torch.logsumexp(-ll, 1)  # (2 groups, 3 points)
    assert torch.allclose(out.elpd_loo, harmonic.mT)


def test_a_group_that_did_not_mix_is_named_in_a_warning():
    # two chains of one stationary AR(1) process, autocorrelation 0.9: they agree (one
    # group) but have about S (1 - 0.9) / (1 + 0.9) = 79 effective draws each of S = 1,500
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 1500, 2, generator=g, dtype=DT)
    x = torch.empty_like(noise)
    x[:, 0] = noise[:, 0]
    for s in range(1, 1500):
        x[:, s] = 0.9 * x[:, s - 1] + math.sqrt(1 - 0.9**2) * noise[:, s]
    with pytest.warns(GoldMixingWarning, match=r"group of chains \[0, 1\] did not mix"):
        out = combine_chains(x, torch.zeros(2, 1500, 3, dtype=DT))
    assert out.groups == [[0, 1]]
    assert out.ess_per_chain[0] < 100


def test_weighted_draws_follow_the_group_weights():
    model, _, _ = _one_layer()
    samples = {"layer1.u": torch.arange(3 * 4, dtype=DT).reshape(3, 4, 1, 1).expand(3, 4, 1, 4)}
    weights = torch.tensor([0.25, 0.75], dtype=DT)
    groups = ChainGroups([[0, 2], [1]], weights, [1.0, 1.0], [100.0, 100.0], [0.0, 0.0],
                         torch.zeros(3, 2, dtype=DT))
    res = gold.GoldStandard(model, samples, chain_groups=groups)
    drawn = res.weighted_draws()["layer1.u"][:, 0, 0]  # the draws' labels c * 4 + s
    # 12 draws: 3 from chains 0 and 2 (evenly spaced over their 8), 9 from chain 1 (its 4,
    # repeated)
    assert drawn.tolist() == [0.0, 2.0, 9.0, 4.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0, 7.0]
    w = res.draw_weights()
    assert torch.allclose(w.sum(), torch.ones((), dtype=DT))
    assert torch.allclose(w[1], torch.full((4,), 0.75 / 4, dtype=DT))


# ------------------------------------------------------------------ bad input
def test_posterior_refuses_what_it_cannot_do():
    model, X, y = _one_layer(n=MAX_POSTERIOR_POINTS + 1)
    with pytest.raises(ValueError, match=f"N = {MAX_POSTERIOR_POINTS + 1} training points"):
        gold.run_nuts(model, X, y)
    model, X, y = _one_layer()
    with pytest.raises(ValueError, match="target must be one of"):
        gold.run_nuts(model, X, y, target="exact")
    probit = dgp.DeepGP([model.layers[0]], dgp.likelihoods.BernoulliProbit())
    with pytest.raises(ValueError, match="Gaussian likelihood.*elbo_optimum"):
        PosteriorTarget(probit, X, (y > 0).to(DT))
