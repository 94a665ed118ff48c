"""Known answers for the ELBO estimators: closed-form SVGP ELBO, exact GP marginal likelihood,
and the collapsed vs sampled-u estimators on a two-layer model."""

import math

import pyro
import pytest
import torch
from known_answers import dense_svgp_elbo, single_layer
from pyro import poutine
from pyro.infer import RenyiELBO, Trace_ELBO, TraceMeanField_ELBO
from torch.distributions import MultivariateNormal

import pyro_dgp as dgp

DT = torch.float64


def _random_q(guide, X, y, seed=1, scale=0.3):
    """Give every layer of ``guide`` a random q(u); returns {site: (loc, tril)}."""
    guide(X, y)  # set up
    g = torch.Generator().manual_seed(seed)
    out = {}
    for site in guide.layer_sites:
        D, M = site.shape
        loc = torch.randn(D, M, generator=g, dtype=DT)
        tril = torch.randn(D, M, M, generator=g, dtype=DT).tril(-1) * scale
        tril = tril + torch.diag_embed(0.2 + torch.rand(D, M, generator=g, dtype=DT))
        guide.set_q_params(site.name, loc, tril)
        out[site.name] = (loc, tril)
    return out


def _estimates(elbo, model, guide, X, y, n):
    with torch.no_grad():
        return torch.tensor([-elbo.loss(model, guide, X, y) for _ in range(n)], dtype=DT)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("Elbo", ["TraceMeanField_ELBO", "AnalyticKL_ELBO"])
def test_collapsed_meanfield_elbo_is_the_closed_form(whiten, Elbo):
    from pyro_dgp.infer.elbo import AnalyticKL_ELBO

    Elbo = AnalyticKL_ELBO if Elbo == "AnalyticKL_ELBO" else TraceMeanField_ELBO
    model, X, y = single_layer(whiten=whiten)
    guide = dgp.guides.MeanField(model, collapsed=True)
    q = _random_q(guide, X, y)
    exact = dense_svgp_elbo(model, X, y, *q["layer1.u"])
    # analytic KL + analytic last layer + collapsed u: the estimate is deterministic
    for validate in (True, False):
        with pyro.validation_enabled(validate):
            assert -Elbo().loss(model, guide, X, y) == pytest.approx(exact, rel=1e-8)


@pytest.mark.parametrize("whiten", [True, False])
def test_completed_autoguide_elbo_monte_carlo_mean_matches_closed_form(whiten):
    """complete(AutoMultivariateNormal(inducing_only(model))): its u_site hand-off and the
    model's conditional given u give an unbiased ELBO (3 Monte Carlo standard errors)."""
    from pyro.infer.autoguide import AutoMultivariateNormal

    model, X, y = single_layer(whiten=whiten)
    guide = dgp.complete(AutoMultivariateNormal(dgp.inducing_only(model), init_scale=0.3),
                         model)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False, objective=Trace_ELBO())
    with torch.no_grad():
        post = guide.inner.get_posterior()
        exact = dense_svgp_elbo(model, X, y, post.loc[None], post.scale_tril[None])
    est = _estimates(Trace_ELBO(), model, guide, X, y, 600)
    se = float(est.std() / math.sqrt(len(est)))
    assert abs(float(est.mean()) - exact) < 3 * se, (float(est.mean()), exact, se)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize(
    "collapsed, objective", [(True, "trace"), (False, "trace"), (False, "meanfield")]
)
def test_svgp_elbo_monte_carlo_mean_matches_closed_form(whiten, collapsed, objective):
    model, X, y = single_layer(whiten=whiten)
    guide = dgp.guides.MeanField(model, collapsed=collapsed)
    q = _random_q(guide, X, y)
    exact = dense_svgp_elbo(model, X, y, *q["layer1.u"])
    elbo = Trace_ELBO() if objective == "trace" else TraceMeanField_ELBO()
    est = _estimates(elbo, model, guide, X, y, 600)
    se = float(est.std() / math.sqrt(len(est)))
    assert se > 0
    assert abs(float(est.mean()) - exact) < 3 * se, (float(est.mean()), exact, se)


def _exact_posterior(whiten, collapsed=True, N=15):
    """One layer with Z = X and Titsias' optimal q(u), which is the exact posterior there:
    ``(model, guide, X, y, log p(y))``."""
    X = torch.linspace(-3, 3, N, dtype=DT).unsqueeze(-1)
    model, _, y = single_layer(N=N, Z=X.clone(), whiten=whiten, jitter=1e-12)
    X = X.clone()
    guide = dgp.guides.MeanField(model, collapsed=collapsed)
    guide(X, y)
    layer = model.layers[0]
    with torch.no_grad():
        K = layer.kernel(X)
        s2 = model.likelihood.variance
        # Titsias' optimal q(u) for Z = X: Sigma = (K + K K / s2)^-1, m = K Sigma K y / s2
        Sigma = torch.linalg.inv(K + K @ K / s2)
        m = K @ Sigma @ K @ y / s2
        S = K @ Sigma @ K
        S = 0.5 * (S + S.mT)
        if whiten:
            L = layer.kzz_cholesky()
            m = torch.linalg.solve_triangular(L, m.unsqueeze(-1), upper=False).squeeze(-1)
            Linv = torch.linalg.solve_triangular(L, torch.eye(N, dtype=DT), upper=False)
            S = Linv @ S @ Linv.mT
        guide.set_q_params("layer1.u", m.unsqueeze(0), torch.linalg.cholesky(S).unsqueeze(0))
        exact = float(MultivariateNormal(torch.zeros(N, dtype=DT), K + s2 * torch.eye(N, dtype=DT))
                      .log_prob(y))
    return model, guide, X, y, exact


@pytest.mark.parametrize("whiten", [True, False])
def test_optimal_q_at_the_data_gives_the_exact_marginal_likelihood(whiten):
    model, guide, X, y, exact = _exact_posterior(whiten)
    elbo = -TraceMeanField_ELBO().loss(model, guide, X, y)
    assert abs(elbo - exact) / abs(exact) < 1e-6, (elbo, exact)


@pytest.mark.parametrize("alpha", [0.5, 0.0])
def test_renyi_bound_at_the_exact_posterior_is_the_marginal_likelihood(alpha):
    """With each draw's own weight (sampled u, f given u), every weight p(y, u) / q(u) at
    the exact posterior is p(y): the Renyi bound equals log p(y) for any alpha and any draws.
    The collapsed estimator is refused: its RenyiELBO exceeds log p(y), so it is no bound."""
    model, guide, X, y, exact = _exact_posterior(whiten=True, collapsed=False)
    renyi = RenyiELBO(alpha=alpha, num_particles=20, vectorize_particles=True,
                      max_plate_nesting=1)
    ours = dgp.infer.objectives.make_objective(renyi, guide)
    assert isinstance(ours, dgp.importance.RenyiELBO) and ours.alpha == alpha
    pyro.set_rng_seed(0)
    bound = -ours.loss(model, guide, X, y)
    assert abs(bound - exact) / abs(exact) < 1e-6, (bound, exact)
    model, guide, X, y, exact = _exact_posterior(whiten=True, collapsed=True)
    with pytest.raises(ValueError, match="RenyiELBO needs each draw's importance weight"):
        dgp.infer.objectives.make_objective(renyi, guide)
    # why: Pyro's RenyiELBO on the collapsed draws, whose estimates of a valid bound would
    # average at or below log p(y), averages above it
    est = torch.tensor([-renyi.loss(model, guide, X, y) for _ in range(40)])
    se = float(est.std()) / math.sqrt(len(est))
    assert float(est.mean()) - exact > 3 * se, (float(est.mean()), exact, se)


def _sparse_exact_posterior(N=30, M=4):
    """One layer with M < N inducing inputs away from the data (``Var[f | u] > 0``) and ``q(u)``
    the exact posterior of the model as the Pyro program defines it (``f_i`` independent given
    ``u``): ``p(y | v) = N(A^T v, diag(c + s2))`` in whitened coordinates, ``c_i`` the
    conditional variances. Returns ``(model, guide, X, y, log p(y))``."""
    model, X, y = single_layer(N=N, M=M, whiten=True, jitter=1e-12)
    guide = dgp.guides.MeanField(model, collapsed=False)
    guide(X, y)
    layer = model.layers[0]
    with torch.no_grad():
        L = layer.kzz_cholesky()
        A = torch.linalg.solve_triangular(L, layer.kernel(layer.inducing_points, X), upper=False)
        c = layer.kernel(X, diag=True) - (A * A).sum(0)
        d = c + model.likelihood.variance
        cov = torch.linalg.inv(torch.eye(M, dtype=DT) + (A / d) @ A.T)
        cov = 0.5 * (cov + cov.T)
        guide.set_q_params("layer1.u", (cov @ A @ (y / d)).unsqueeze(0),
                    torch.linalg.cholesky(cov).unsqueeze(0))
        exact = float(MultivariateNormal(torch.zeros_like(y), A.T @ A + torch.diag(d)).log_prob(y))
    assert float(c.min()) > 1e-3  # f is not determined by u: the case the weights must handle
    return model, guide, X, y, exact


@pytest.mark.parametrize("alpha", [0.5, 0.0])
def test_importance_weights_at_the_sparse_exact_posterior_are_the_marginal_likelihood(alpha):
    """Every exact weight p(y, u) / q(u) at the exact posterior is p(y), also where f is not
    determined by u, so the Renyi bound and Pyro's ``Importance`` give log p(y) exactly:
    with :class:`pyro_dgp.importance.RenyiELBO` (what ``fit`` uses), and with Pyro's own
    inside ``importance_weights()``. Outside it the run scores the ELBO's expected
    log-likelihood, and Pyro's RenyiELBO misses log p(y) by the draws' Jensen gaps."""
    from pyro.infer import Importance

    model, guide, X, y, exact = _sparse_exact_posterior()
    kwargs = dict(alpha=alpha, num_particles=20, vectorize_particles=True, max_plate_nesting=1)
    pyro.set_rng_seed(0)
    with torch.no_grad():
        ours = -dgp.importance.RenyiELBO(**kwargs).loss(model, guide, X, y)
        with dgp.importance_weights():
            theirs = -RenyiELBO(**kwargs).loss(model, guide, X, y)
            importance = Importance(model, guide, num_samples=10).run(X, y)
            log_z = float(importance.get_log_normalizer())
        plain = -RenyiELBO(**kwargs).loss(model, guide, X, y)
    for value in (ours, theirs, log_z):
        assert abs(value - exact) < 1e-6 * abs(exact), (value, exact)
    assert plain < exact - 1.0, (plain, exact)


@pytest.mark.slow
def test_collapsed_and_sampled_estimators_agree_and_collapsed_has_lower_variance():
    torch.manual_seed(0)
    N = 40
    X = torch.linspace(-2, 2, N, dtype=DT).unsqueeze(-1)
    y = torch.sign(X.squeeze(-1)) + 0.05 * torch.randn(N, dtype=DT)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=10, hidden_dim=2)
    collapsed = dgp.guides.MeanField(model, collapsed=True)
    sampled = dgp.guides.MeanField(model, collapsed=False)
    params = _random_q(collapsed, X, y, seed=3, scale=0.1)
    sampled(X, y)
    for name, (loc, tril) in params.items():
        sampled.set_q_params(name, loc, tril)
    elbo = TraceMeanField_ELBO()
    pyro.set_rng_seed(1)
    a = _estimates(elbo, model, collapsed, X, y, 1000)
    b = _estimates(elbo, model, sampled, X, y, 1000)
    se = math.sqrt(float(a.var() / len(a) + b.var() / len(b)))
    assert abs(float(a.mean() - b.mean())) < 3 * se, (float(a.mean()), float(b.mean()), se)
    ratio = float(a.var() / b.var())
    print(f"variance ratio collapsed/sampled-u = {ratio:.3f}")
    assert ratio < 1


# ------------------------------------------------------------------ AnalyticKL_ELBO
def _loss_and_grads(elbo, model, guide, *args, seed=7, params=()):
    pyro.set_rng_seed(seed)
    for p in params:
        p.grad = None
    loss = elbo.differentiable_loss(model, guide, *args)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in params]


def _assert_same_value_and_gradient(Reference, Elbo, num_particles, model, guide, X, y, params):
    """``Elbo`` and Pyro's ``Reference`` give the same loss and gradient for the same draws,
    with and without validation, single and vectorised particles."""
    kw = dict(num_particles=num_particles, vectorize_particles=num_particles > 1,
              max_plate_nesting=1)
    for validate in (True, False):
        with pyro.validation_enabled(validate):
            ref = _loss_and_grads(Reference(**kw), model, guide, X, y, params=params)
            new = _loss_and_grads(Elbo(**kw), model, guide, X, y, params=params)
        assert new[0] == pytest.approx(ref[0], rel=1e-12)
        for a, b in zip(new[1], ref[1], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("num_particles", [1, 3])
def test_analytic_kl_elbo_has_trace_mean_field_elbos_value_and_gradient(num_particles):
    """Same draws, same estimate and gradient as Pyro's TraceMeanField_ELBO on a 2-layer DGP
    (with and without validation, single and vectorised particles)."""
    from pyro_dgp.infer.elbo import AnalyticKL_ELBO

    torch.manual_seed(0)
    X = torch.linspace(-2, 2, 30, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X.squeeze(-1)) + 0.05 * torch.randn(30, dtype=DT)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8, hidden_dim=2)
    guide = dgp.guides.MeanField(model)
    _random_q(guide, X, y, seed=2, scale=0.1)
    params = list(model.parameters()) + list(guide.parameters())
    _assert_same_value_and_gradient(TraceMeanField_ELBO, AnalyticKL_ELBO, num_particles,
                                    model, guide, X, y, params)


@pytest.mark.parametrize("num_particles", [1, 3])
@pytest.mark.parametrize("kind", ["autonormal", "ssivi", "score-function"])
def test_reparam_trace_elbo_has_trace_elbos_value_and_gradient(num_particles, kind):
    """Same draws, same estimate and gradient as Pyro's Trace_ELBO: a completed autoguide,
    a semi-implicit guide (auxiliary sites), and a guide with a site that is not
    reparametrised (Pyro's surrogate, through Pyro's own code)."""
    import pyro.distributions as dist

    from pyro_dgp.infer.elbo import ReparamTrace_ELBO

    torch.manual_seed(0)
    X = torch.linspace(-2, 2, 30, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X.squeeze(-1)) + 0.05 * torch.randn(30, dtype=DT)
    pyro.clear_param_store()
    if kind == "score-function":
        def model(X, y):
            c = pyro.sample("c", dist.Bernoulli(torch.tensor(0.3, dtype=DT)))
            m = pyro.sample("m", dist.Normal(torch.zeros((), dtype=DT), 1.0))
            with pyro.plate("data", X.shape[0]):
                pyro.sample("y", dist.Normal(m + c * X[:, 0], 1.0), obs=y)

        def guide(X, y):
            p = pyro.param("p", torch.tensor(0.6, dtype=DT))
            loc = pyro.param("loc", torch.tensor(0.2, dtype=DT))
            pyro.sample("c", dist.Bernoulli(p))
            pyro.sample("m", dist.Normal(loc, 0.5))

        guide(X, y)
        params = [pyro.param("p").unconstrained(), pyro.param("loc").unconstrained()]
    else:
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, hidden_dim=2)
        guide = (dgp.guides.SemiImplicit(model) if kind == "ssivi" else
                 dgp.complete(pyro.infer.autoguide.AutoNormal(dgp.inducing_only(model)), model))
        guide(X, y)
        params = list(model.parameters()) + list(guide.parameters())
    _assert_same_value_and_gradient(Trace_ELBO, ReparamTrace_ELBO, num_particles, model, guide,
                                    X, y, params)


def test_analytic_kl_elbos_differentiable_loss_reads_no_value_back(monkeypatch):
    """No ``.item()`` (a host sync on a GPU) in the loss that fit differentiates."""
    import pyro_dgp.infer.elbo as elbo_module

    def no_item(x):
        raise AssertionError("torch_item called")

    monkeypatch.setattr(elbo_module, "torch_item", no_item)
    X = torch.linspace(-2, 2, 20, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, torch.sin(X[:, 0]), num_layers=2, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    with pyro.validation_enabled(False):
        loss = elbo_module.AnalyticKL_ELBO().differentiable_loss(model, guide, X,
                                                                 torch.sin(X[:, 0]))
    assert loss.requires_grad and torch.isfinite(loss)


def test_analytic_kl_elbo_falls_back_and_handles_masks_and_auxiliary_sites():
    """Sites without a registered KL (LogNormal guide, Gamma prior) fall back to log p - log q,
    masked-out sites add nothing, auxiliary guide sites add -log q: as TraceMeanField_ELBO."""
    import pyro.distributions as pdist
    from pyro.nn import PyroParam
    from torch.distributions import constraints

    from pyro_dgp.infer.elbo import AnalyticKL_ELBO

    data = torch.tensor([0.3, -1.2, 2.0, 0.7], dtype=DT)

    def model(data):
        z = pyro.sample("z", pdist.Normal(torch.tensor(0.0, dtype=DT), 1.0))
        w = pyro.sample("w", pdist.Gamma(torch.tensor(2.0, dtype=DT), 2.0))
        with pyro.plate("data", len(data)):
            pyro.sample("hidden", pdist.Normal(z, 1.0).mask(False))
            pyro.sample("y", pdist.Normal(z, w), obs=data)

    class Guide(pyro.nn.PyroModule):
        def __init__(self):
            super().__init__()
            self.loc = PyroParam(torch.tensor(0.2, dtype=DT))
            self.scale = PyroParam(torch.tensor(0.5, dtype=DT), constraints.positive)

        def forward(self, data):
            a = pyro.sample("aux", pdist.Normal(self.loc, 1.0), infer={"is_auxiliary": True})
            pyro.sample("z", pdist.Normal(a, self.scale))
            pyro.sample("w", pdist.LogNormal(self.loc, self.scale))
            with pyro.plate("data", len(data)):
                pyro.sample("hidden", pdist.Normal(a, 1.0).mask(False))

    guide = Guide()
    params = list(guide.parameters())
    for validate in (True, False):
        with pyro.validation_enabled(validate):
            ref = _loss_and_grads(TraceMeanField_ELBO(), model, guide, data, params=params)
            new = _loss_and_grads(AnalyticKL_ELBO(), model, guide, data, params=params)
        assert new[0] == pytest.approx(ref[0], rel=1e-12)
        for a, b in zip(new[1], ref[1], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _model_and_guides(kind):
    torch.manual_seed(0)
    N = 24
    X = torch.linspace(-2, 2, N, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X.squeeze(-1)) + 0.05 * torch.randn(N, dtype=DT)
    if kind == "locations":
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6,
                                      inducing_scheme="propagated")
    else:
        layers = 3 if kind == "three-layer" else 2
        model = dgp.DeepGP.regression(X, y, num_layers=layers, num_inducing=6, hidden_dim=2)
    model.num_data = 3 * N  # a minibatch: the data plate scales the likelihood by 3
    if kind == "autonormal":
        from pyro.infer.autoguide import AutoNormal

        guide = dgp.complete(AutoNormal(dgp.inducing_only(model)), model)
    elif kind == "sampled-u":
        guide = dgp.guides.MeanField(model, collapsed=False)
    else:
        guide = dgp.guides.MeanField(model)
    with torch.no_grad():
        guide(X, y)
    if isinstance(guide, dgp.guides.MeanField):
        _random_q(guide, X, y, seed=2, scale=0.1)
    return model, guide, X, y


@pytest.mark.parametrize("kind", ["meanfield", "sampled-u", "three-layer", "locations",
                                  "autonormal"])
def test_model_trace_from_the_guides_run_equals_the_replayed_model(kind):
    """LayerGuide.traces: the model's trace taken from the guide's own run of the model has
    the sites, values, distributions, observation flags, scales and masks of the model run
    again under poutine.replay (the trace AnalyticKL_ELBO used to build)."""
    from pyro import poutine

    model, guide, X, y = _model_and_guides(kind)
    with pyro.validation_enabled(False):
        pyro.set_rng_seed(5)
        guide_trace, model_trace = guide.traces(X, y)
        replayed = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(X, y)
    sample_sites = [n for n, s in replayed.nodes.items()
                    if s["type"] == "sample" and not n.endswith(".data") and n != "data"]
    assert list(model_trace.nodes) == sample_sites
    for name in sample_sites:
        a, b = model_trace.nodes[name], replayed.nodes[name]
        assert type(a["fn"]) is type(b["fn"]), name
        assert a["is_observed"] == b["is_observed"], name
        assert a["value"] is b["value"] or torch.equal(a["value"], b["value"]), name
        assert a["scale"] == b["scale"] and a["mask"] is b["mask"], name
        assert [f.name for f in a["cond_indep_stack"]] == [f.name for f in b["cond_indep_stack"]]
        if b["is_observed"] or name.endswith(".u"):
            torch.testing.assert_close(a["fn"].log_prob(a["value"]),
                                       b["fn"].log_prob(b["value"]), rtol=1e-12, atol=0)
    assert any(s["scale"] == 3.0 for s in model_trace.nodes.values() if s["is_observed"])


@pytest.mark.parametrize("kind", ["meanfield", "locations", "autonormal"])
def test_analytic_kl_elbo_single_pass_equals_replay_and_steps_outer_handlers_aside(kind):
    """AnalyticKL_ELBO's loss and gradient from the guide's run alone equal those from the
    model replayed; under SVI (a param-only trace around the loss) it still takes one pass;
    under any other handler (here poutine.scale) it replays the model, which that handler then
    scales like the guide."""
    from pyro import poutine

    from pyro_dgp.infer import elbo as elbo_module
    from pyro_dgp.infer.elbo import AnalyticKL_ELBO

    model, guide, X, y = _model_and_guides(kind)
    params = list({id(p): p for m in (model, guide) for p in m.parameters()}.values())
    elbo = AnalyticKL_ELBO()
    with pyro.validation_enabled(False):
        assert elbo_module.single_pass(model, guide)
        one = _loss_and_grads(elbo, model, guide, X, y, params=params)
        with poutine.trace(param_only=True) as params_seen:
            assert elbo_module.single_pass(model, guide)
            under_svi = _loss_and_grads(elbo, model, guide, X, y, params=params)
        # as SVI.step needs: the parameters of model and guide are all seen
        seen = {id(site["value"].unconstrained()) for site in params_seen.trace.nodes.values()}
        assert {id(p) for p in params} <= seen
        with poutine.block(hide_fn=lambda msg: False):  # a no-op handler: forces the replay
            assert not elbo_module.single_pass(model, guide)
            two = _loss_and_grads(elbo, model, guide, X, y, params=params)
        with poutine.scale(scale=2.0):
            scaled = _loss_and_grads(elbo, model, guide, X, y, params=params)
    assert one[0] == pytest.approx(two[0], rel=1e-12)
    assert under_svi[0] == pytest.approx(one[0], rel=1e-12)
    assert scaled[0] == pytest.approx(2 * one[0], rel=1e-12)
    for a, b, c in zip(one[1], two[1], under_svi[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(c, a, rtol=1e-10, atol=1e-12)
    other = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6)
    assert not elbo_module.single_pass(other, guide)


def test_log_q_at_the_guides_own_draws_survives_an_ill_conditioned_factor():
    """A MeanField factor with off-diagonal entries above its diagonal (as Adam makes of an
    inner layer's S = 1e-5 I at lr 0.01) has cond(L) ~ 4.3^M, 1e51 at M = 80; log q at the guide's
    own draws must still be right: its Monte Carlo mean is minus the closed-form entropy, and
    Trace_ELBO (which scores q) agrees with the analytic-KL ELBO within Monte Carlo error."""
    M = 80
    model, X, y = single_layer(N=20, M=M)
    guide = dgp.guides.MeanField(model, collapsed=False)
    guide(X, y)
    L = 0.01 * torch.ones(M, M, dtype=DT).tril(-1) + 0.003 * torch.eye(M, dtype=DT)
    loc = torch.zeros(1, M, dtype=DT)
    guide.set_q_params("layer1.u", loc, L.unsqueeze(0))
    assert torch.linalg.cond(L) > 1e15  # numerically singular (float64 saturates here)
    log_q, elbo = [], []
    pyro.set_rng_seed(0)
    with torch.no_grad():
        for _ in range(200):
            gt = poutine.trace(guide).get_trace(X, y)
            site = gt.nodes["layer1.u"]
            log_q.append(float(site["fn"].log_prob(site["value"]).sum()))
            elbo.append(-Trace_ELBO().loss(model, guide, X, y))
    entropy = float(MultivariateNormal(loc[0], scale_tril=L).entropy())
    log_q, elbo = torch.tensor(log_q), torch.tensor(elbo)
    se = float(log_q.std()) / math.sqrt(len(log_q))
    assert abs(float(-log_q.mean()) - entropy) < 4 * se, (float(-log_q.mean()), entropy, se)
    analytic = torch.tensor([-dgp.infer.AnalyticKL_ELBO().loss(model, guide, X, y)
                             for _ in range(200)])
    se = math.sqrt(float(elbo.var() + analytic.var()) / 200)
    assert abs(float(elbo.mean() - analytic.mean())) < 4 * se


def test_trace_enum_elbo_runs_on_float64_models_and_equals_trace_elbo():
    """The masked ``<layer>.f`` sites score zeros in the model's dtype (Pyro's masked
    distribution gives float32 zeros, which TraceEnum_ELBO's contraction refuses beside
    float64 terms); with nothing to enumerate its estimate is Trace_ELBO's for the same draws."""
    from pyro.infer import TraceEnum_ELBO

    model, X, y = single_layer()
    guide = dgp.guides.MeanField(model)
    _random_q(guide, X, y)
    values = []
    for elbo in (TraceEnum_ELBO(max_plate_nesting=1), Trace_ELBO()):
        pyro.set_rng_seed(3)
        with torch.no_grad():
            values.append(elbo.loss(model, guide, X, y))
    assert values[0] == pytest.approx(values[1], rel=1e-10)
