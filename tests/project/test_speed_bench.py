"""The speed benchmark's three implementations run, and the plain-PyTorch floor computes the same
model as pyro_dgp: the same loss and gradients for the same parameters and noise draws."""

import pyro
import pytest
import torch
from pyro import poutine
from speed import Config, PlainDSVI, main, make_implementations

from pyro_dgp.gp.conditional import quadratic_form

CFG = Config(num_layers=3, num_inducing=7, batch_size=40, hidden_dim=3, input_dim=4,
             num_data=120)


def _ours_eps(ours, X, y, seed):
    """The standard normal draws behind ours' inner-layer samples f^l under ``seed``."""
    pyro.set_rng_seed(seed)
    with torch.no_grad():
        trace = poutine.trace(ours.guide).get_trace(X, y)
    eps = []
    for name, site in trace.nodes.items():
        if name.endswith(".f"):
            normal = site["fn"].base_dist.base_dist  # Masked -> FunctionMarginal -> Normal
            eps.append((site["value"] - normal.loc) / normal.scale)
    return eps[:-1]  # the last layer is integrated analytically


# (rtol of the loss, of the gradients): the projected form is the same arithmetic in both, to
# rounding; the quadratic form loses ~eps cond(K_ZZ), which each side rounds differently
# (measured here: loss 1.4e-10, the second layer's Z gradient 4.4e-5 relative)
# (loss, q_loc and noise gradients, Z gradient)
TOLERANCES = {False: (1e-10, 1e-8, 1e-7), True: (1e-9, 2e-4, 2e-4)}


@pytest.mark.parametrize("quadratic", [False, True])
@pytest.mark.parametrize("hidden", [3, 1])
def test_plain_floor_matches_ours_loss_and_gradients(hidden, quadratic):
    cfg = Config(**{**CFG.__dict__, "hidden_dim": hidden})
    X, y, batches, impls = make_implementations(cfg, ("ours", "plain"))
    ours = impls["ours"]
    # move q(u) and the hyperparameters off their initial values so every term matters
    for _ in range(3):
        ours.step(X[batches[0]], y[batches[0]])
    plain = PlainDSVI.from_ours(ours.model, ours.guide, quadratic=quadratic)
    Xb, yb = X[batches[1]], y[batches[1]]
    rtol_loss, rtol_grad, rtol_z = TOLERANCES[quadratic]
    with quadratic_form(quadratic):
        eps = _ours_eps(ours, Xb, yb, seed=11)
        assert len(eps) == cfg.num_layers - 1
        pyro.set_rng_seed(11)
        ours.opt.zero_grad()
        loss_ours = ours.loss(Xb, yb)
        loss_ours.backward()
    loss_plain = plain.loss(Xb, yb, eps)
    loss_plain.backward()
    lp, lo = float(loss_plain.detach()), float(loss_ours.detach())
    assert lp == pytest.approx(lo, rel=rtol_loss, abs=1e-8)

    # gradients: the variational mean of the first layer and the likelihood noise
    loc_ours = ours.guide.locs.layer1.u_unconstrained
    assert loc_ours.grad is not None
    torch.testing.assert_close(plain.layers[0]["q_loc"].grad, loc_ours.grad, rtol=rtol_grad,
                               atol=1e-8)
    noise_ours = ours.model.likelihood.variance_unconstrained.grad
    torch.testing.assert_close(plain.log_noise.grad, noise_ours, rtol=rtol_grad, atol=1e-8)
    z_ours = ours.model.layers[1].inducing_points_unconstrained.grad
    torch.testing.assert_close(plain.layers[1]["Z"].grad, z_ours, rtol=rtol_z, atol=1e-8)


def test_all_implementations_step(capsys):
    pytest.importorskip("gpytorch")
    X, y, batches, impls = make_implementations(CFG)
    assert set(impls) == {"ours", "svi", "gpytorch", "plain"}
    for impl in impls.values():
        losses = [impl.step(X[batches[k]], y[batches[k]]) for k in range(3)]
        assert all(torch.isfinite(torch.tensor(losses)))
    # ours and GPyTorch start from the same model: the same ELBO up to its 1/N scaling,
    # GPyTorch's own jitter and the missing 1e-5 white noise. At the initial q (inner
    # variance 1e-5) the loss's spread over noise draws is ~1e-12 relative (measured), so
    # one draw each suffices and the difference is the systematic part: 4.4e-7 relative
    # (measured), held to 1e-5.
    X2, y2, b2, fresh = make_implementations(CFG)
    with torch.no_grad():
        lo = [float(fresh["ours"].loss(X2[b2[0]], y2[b2[0]])) for _ in range(3)]
        lg = [float(fresh["gpytorch"].loss(X2[b2[0]], y2[b2[0]])) * CFG.num_data
              for _ in range(3)]
    assert max(lo) - min(lo) < 1e-9 * abs(lo[0]) and max(lg) - min(lg) < 1e-9 * abs(lg[0])
    assert lg[0] == pytest.approx(lo[0], rel=1e-5)


@pytest.mark.slow
def test_gpytorch_computes_our_model_away_from_its_initial_state():
    """At the initial state the last layer's q is its prior, so the loss does not see the
    inner layers. After 60 of our steps, with our values copied into GPyTorch's model: the
    first layer's marginals agree (but for our 1e-5 white noise and the jitters), and the
    losses agree within 4 Monte Carlo standard errors (500 draws each)."""
    pytest.importorskip("gpytorch")
    import math

    import gpytorch

    cfg = Config(num_layers=2, num_inducing=8, batch_size=60, hidden_dim=3, input_dim=4,
                 num_data=200)
    X, y, batches, impls = make_implementations(cfg, ("ours", "gpytorch"))
    ours, gp = impls["ours"], impls["gpytorch"]
    for k in range(60):
        ours.step(X[batches[k % 16]], y[batches[k % 16]])
    gp.copy_from(ours)
    Xb, yb = X[batches[3]], y[batches[3]]
    with torch.no_grad(), gpytorch.settings.debug(False), \
            gpytorch.settings.num_likelihood_samples(1):
        site = ours.guide.layer_sites[0]
        m_o, v_o = site.layer.conditional(Xb, *ours.guide.q_params(site))
        out = gp.model.layers[0](Xb)  # (samples, N, D): the inputs repeated per sample
        torch.testing.assert_close(out.mean[0], m_o, rtol=0, atol=1e-4)
        torch.testing.assert_close(out.variance[0], v_o, rtol=0, atol=1e-4)
        lo = torch.tensor([float(ours.loss(Xb, yb)) for _ in range(500)])
        lg = torch.tensor([float(gp.loss(Xb, yb)) * cfg.num_data for _ in range(500)])
    se = math.sqrt(float(lo.var() + lg.var()) / 500)
    assert abs(float(lo.mean() - lg.mean())) < 4 * se, (float(lo.mean()), float(lg.mean()), se)
    assert float(v_o.max()) > 1e-3  # the first layer is not deterministic here


@pytest.mark.slow
def test_command_line_table_and_markdown(tmp_path, capsys):
    pytest.importorskip("gpytorch")
    out = tmp_path / "BENCH.md"
    args = ["--layers", "2", "--num-inducing", "6", "--batch", "30", "--hidden", "2",
            "--input-dim", "3", "--num-data", "90", "--warmup", "1", "--repeats", "2",
            "--threads", "1", "--append", str(out)]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "ours/gpytorch" in table and "L=2 M=6 B=30 H=2" in table
    text = out.read_text()
    assert "## Speed" in text and "torch " in text and "--num-data 90" in text


@pytest.mark.slow
def test_guides_timing_records_one_line_per_guide(tmp_path, capsys, monkeypatch):
    """``--guides``: fit's ms per step for each guide named (eager only on the CPU; the
    amortized guide on the AVDGP model), one result line each; the graph mode on CUDA
    (tests/train/test_cuda.py covers the option itself)."""
    import json

    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    args = ["--guides", "meanfield", "amortized-ar2p", "--layers", "2", "--num-inducing", "6",
            "--batch", "30", "--hidden", "2", "--input-dim", "3", "--num-data", "90",
            "--steps", "2", "--threads", "1"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "| L=2 M=6 B=30 H=2 | meanfield |" in table and "| amortized-ar2p |" in table
    records = [json.loads(line) for line in (tmp_path / "speed_guides.jsonl").open()]
    assert [r["settings"]["guide"] for r in records] == ["meanfield", "amortized-ar2p"]
    assert all(r["figures"]["ms_per_step"]["eager"] > 0 for r in records)
    assert all("graph" not in r["figures"]["ms_per_step"] for r in records)


def test_plain_pyro_svi_computes_the_same_loss_and_gradients_as_ours():
    """``svi`` (pyro.infer.SVI, TraceMeanField_ELBO, pyro.optim.Adam) trains the same model
    from the same initial values: from the same seed its loss and the gradients of every
    parameter equal ours (the analytic-KL ELBO that fit uses) to round-off."""
    import pyro

    X, y, batches, impls = make_implementations(CFG, ["ours", "svi"])
    Xb, yb = X[batches[0]], y[batches[0]]
    losses, grads = {}, {}
    for name in ("ours", "svi"):
        impl = impls[name]
        with torch.no_grad():
            impl.guide(Xb, yb)  # the guide's parameters exist from its first call
        params = [p for m in (impl.model, impl.guide) for p in m.parameters()]
        for p in params:
            p.grad = None
        pyro.set_rng_seed(5)
        if name == "ours":
            loss = impl.loss(Xb, yb)
            loss.backward()
            losses[name] = float(loss)
        else:
            losses[name] = float(impl.svi.loss_and_grads(impl.model, impl.guide, Xb, yb))
        grads[name] = [p.grad.clone() for p in params]
    assert losses["svi"] == pytest.approx(losses["ours"], rel=1e-12)
    scale = max(float(g.abs().max()) for g in grads["ours"])  # some are round-off zeros
    for a, b in zip(grads["ours"], grads["svi"], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-9 * scale)


def test_gpytorch_step_variants_record_their_split_and_settings(tmp_path, monkeypatch):
    """``gpytorch_step.py``: one line per variant (ours and the three GPyTorch settings), each
    with forward, backward and optimiser times that add up to about the step, and the ten
    likelihood samples really reach GPyTorch's layers (its second layer sees 10x the rows)."""
    pytest.importorskip("gpytorch")
    import json

    import gpytorch_step

    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    args = ["--num-inducing", "6", "--batch", "30", "--hidden", "2", "--num-data", "90",
            "--repeats", "2", "--warmup", "1", "--top", "2"]
    assert gpytorch_step.main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "gpytorch_step.jsonl").open()]
    assert [r["settings"]["variant"] for r in records] == [
        "ours", *(name for name, _, _ in gpytorch_step.VARIANTS)]
    for r in records:
        f = r["figures"]
        assert min(f["forward_ms"], f["backward_ms"], f["optimiser_ms"]) > 0
        assert len(f["top_operators"]) == 2
    cfg = Config(num_layers=2, num_inducing=6, batch_size=30, hidden_dim=2, num_data=90)
    X, y, batches, impls = make_implementations(cfg, ("ours",))
    gp = gpytorch_step.GPyTorchAs(cfg, X, y, impls["ours"], samples=10, debug=False)
    seen, mll = [], gp.mll
    gp.mll = lambda output, target: seen.append(output.mean.shape) or mll(output, target)
    gp.loss(X[batches[0]], y[batches[0]])
    assert seen == [torch.Size([10, 30])]
