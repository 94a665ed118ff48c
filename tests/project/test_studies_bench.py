"""The pure parts of the defaults study and the guide atlas (``benchmarks/defaults.py``,
``benchmarks/guides.py``): stacking runs from their side files, the choices, the report's
pivot of objectives."""

import argparse
import datetime as dt
import math
from types import SimpleNamespace

import grid
import guides
import numpy as np
import pointwise
import pytest
import report_studies as studies
import torch
from scipy.special import logsumexp

from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.prediction import MixturePredictive
from pyro_dgp.stacking import stacking_weights


def _predictive(seed: int, S: int = 6, N: int = 9) -> MixturePredictive:
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(S, N, generator=g, dtype=torch.float64)
    var = torch.rand(S, N, generator=g, dtype=torch.float64) + 0.1
    return MixturePredictive(loc, var, Gaussian(0.3), y_mean=1.5, y_std=2.0)


def _side_file(tmp_path, name: str, seed: int, y: torch.Tensor, loo: np.ndarray):
    path = tmp_path / f"{name}.npz"
    pointwise.save_run(path, _predictive(seed), y, loo)
    return path


def test_stacked_log_density_is_the_log_of_the_weighted_mixture():
    lp = np.log(np.array([[0.2, 0.5], [0.1, 0.4], [0.3, 0.3]]))
    out = pointwise.stacked_log_density(lp, [0.25, 0.75])
    assert out == pytest.approx(np.log(0.25 * np.exp(lp[:, 0]) + 0.75 * np.exp(lp[:, 1])))
    # a zero weight drops its candidate exactly; two identical candidates are the one
    assert pointwise.stacked_log_density(lp, [1.0, 0.0]) == pytest.approx(lp[:, 0])
    twice = np.concatenate([lp[:, :1], lp[:, :1]], 1)
    assert pointwise.stacked_log_density(twice, [0.3, 0.7]) == pytest.approx(lp[:, 0])
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        pointwise.stacked_log_density(lp, [1.0])


def test_two_identical_runs_stack_to_the_one_run(tmp_path):
    y = torch.linspace(-1.0, 4.0, 9, dtype=torch.float64)
    loo = np.linspace(-2.0, -1.0, 20)
    path = _side_file(tmp_path, "a", 0, y, loo)
    one = pointwise.load_run(path)
    out = pointwise.stack_runs([path, _side_file(tmp_path, "b", 0, y, loo)])
    assert out["weights"] == pytest.approx([0.5, 0.5])
    assert out["test_loglik"] == pytest.approx(one["test_logp"].mean())
    pred = _predictive(0)
    assert out["crps"] == pytest.approx(float(pred.crps(y).mean()), rel=1e-5)
    assert out["rmse"] == pytest.approx(float((pred.mean - y).square().mean().sqrt()), rel=1e-5)


def test_the_stack_takes_stacking_weights_of_the_loo_densities(tmp_path):
    y = torch.linspace(-1.0, 4.0, 9, dtype=torch.float64)
    rng = np.random.default_rng(0)
    loo = [rng.normal(-1.5, 0.5, 30), rng.normal(-1.5, 0.5, 30)]
    paths = [_side_file(tmp_path, f"r{k}", k, y, loo[k]) for k in range(2)]
    out = pointwise.stack_runs(paths)
    w = stacking_weights(np.stack(loo, 1)).numpy()
    assert out["weights"] == pytest.approx(w.tolist())
    test = np.stack([pointwise.load_run(p)["test_logp"] for p in paths], 1)
    assert out["test_loglik"] == pytest.approx(logsumexp(test + np.log(w), 1).mean())


def test_runs_of_different_splits_are_refused(tmp_path):
    y = torch.zeros(9, dtype=torch.float64)
    a = _side_file(tmp_path, "a", 0, y, np.zeros(20))
    b = _side_file(tmp_path, "b", 1, y, np.zeros(21))
    with pytest.raises(ValueError, match="one split"):
        pointwise.stack_runs([a, b])


def test_a_choice_waits_for_every_candidate():
    assert guides._best({"auto": -1.2, "alpha=1": -1.1}) == "alpha=1"
    assert guides._best({"auto": -1.2, "alpha=1": math.nan}) is None
    assert guides._best({"auto": -1.2, "alpha=1": -math.inf}) == "auto"
    assert guides._best({}) is None


def test_objective_tokens_map_to_the_harness():
    assert grid.objective_argv("alpha=1") == ["--objective", "alpha", "--alpha", "1"]
    assert grid.objective_argv("auto") == ["--objective", "auto"]
    assert grid.objective_label("alpha=0.5") == "alpha=0.5,S=10"
    assert grid.objective_label("auto") == "auto"
    assert grid.objective_argv("auto,P=10") == ["--objective", "auto", "--particles", "10"]
    with pytest.raises(ValueError, match="alpha objective's draws"):
        grid.objective_argv("alpha=1,P=5")
    assert grid.objective_label("auto,P=10") == "auto"


def test_stop_at_is_the_next_occurrence_of_that_time_of_day():
    evening = dt.datetime(2026, 11, 28, 22, 50, tzinfo=dt.UTC)
    assert grid.deadline("23:30", evening) == evening.replace(hour=23, minute=30)
    assert grid.deadline("01:00", evening) == dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
    assert grid.deadline("22:50", evening) == dt.datetime(2026, 11, 29, 22, 50, tzinfo=dt.UTC)
    with pytest.raises(argparse.ArgumentTypeError, match="HH:MM"):
        grid.deadline("1am", evening)


def _defaults_record(dataset, objective, loglik, rmse, splits=1, date="2026-11-28"):
    return {"command": "python benchmarks/defaults.py", "commit": "abc", "date": date,
            "settings": {"dataset": dataset, "guide": "meanfield", "objective": objective,
                         "steps": 3000, "batch": 1000, "inducing": 100, "splits": splits},
            "figures": {"test_loglik": loglik, "rmse": rmse, "test_loglik_se": None,
                        "rmse_se": None}}


def test_objective_rows_pivot_by_set_and_count_the_wins():
    records = [_defaults_record("boston", "auto", -2.2, 2.3),
               _defaults_record("boston", "alpha=1", -2.5, 2.6),
               _defaults_record("power", "auto", -2.8, 4.0),
               _defaults_record("power", "alpha=1", -2.6, 4.1),
               _defaults_record("power", "alpha=1", -2.0, 3.0, splits=0)]  # fewer splits: not used
    records += [_defaults_record("boston", "auto,P=10", -2.1, 2.4),
                _defaults_record("power", "auto,P=10", -2.7, 3.9)]
    rows = studies.objective_rows(records)
    assert [r["settings"]["dataset"] for r in rows] == ["boston", "power", "rule", "draws"]
    assert rows[0]["figures"]["best"] == "ELBO, 10 draws / ELBO, 1 draw"
    assert rows[1]["figures"]["best"] == "alpha 1 / ELBO, 10 draws"
    rule = rows[-2]["figures"]
    assert rule["auto"]["wins"] == [0, 1] and rule["alpha=1"]["wins"] == [1, 0]
    assert rule["auto,P=10"]["wins"] == [1, 1]
    # the two ELBO columns against each other only (alpha 1 leads power's NLL, not counted)
    draws = rows[-1]["figures"]
    assert draws["auto,P=10"]["wins"] == [2, 1] and draws["auto"]["wins"] == [0, 1]
    assert studies.objective_cell(rows[1]["figures"]["alpha=1"]) == "2.60 / 4.10"


@pytest.mark.slow
@pytest.mark.usefixtures("boston_data")
def test_a_run_records_what_explains_its_scores_and_writes_its_side_file(tmp_path):
    import json

    import uci

    out, side = tmp_path / "runs.jsonl", tmp_path / "pointwise"
    assert uci.main(["--datasets", "boston", "--layers", "1", "--splits", "1", "--steps", "3",
                     "--samples", "5", "--inducing", "10", "--threads", "1", "--quiet",
                     "--out", str(out), "--pointwise-dir", str(side), "--no-record"]) == 0
    rec = json.loads(out.read_text().splitlines()[0])
    diag = rec["diagnostics"]
    assert diag["noise_variance"] > 0 and diag["draw_spread_variance_mean"] >= 0
    assert diag["predictive_variance_mean"] > diag["noise_variance"]
    run = pointwise.load_run(side / diag["pointwise"])
    assert run["test_logp"].mean() == pytest.approx(rec["metrics"]["test_loglik"])
    assert run["loo_logp"].shape == (rec["data"]["num_train"],)
    assert np.isfinite(run["loo_logp"]).all() and run["loc"].shape == (5, 51)


def test_the_choice_runs_follow_the_parts_asked_for():
    runs = guides.choice_runs("boston", 0, ("meanfield", "semi-implicit"))
    assert {(r.guide, r.objective) for r in runs} == {
        ("meanfield", "auto"), ("meanfield", "alpha=1"), ("ssivi", "auto"),
        ("ssivi-iwhvi", "auto"), ("ssivi-discrete", "auto")}
    assert {r.guide for r in guides.choice_runs("energy", 0, ("ensemble",))} == {"meanfield"}
    assert guides.choice_runs("boston", 1) == []


def test_find_tells_runs_of_different_draws_apart():
    args = SimpleNamespace(steps=3000, batch_size=1000, num_inducing=100, validation=None)
    rec = {"dataset": "energy", "guide": "meanfield", "objective": "auto", "split": 0,
           "layers": 2, "status": "ok", "settings": {"steps": 3000, "batch_size": 1000,
                                                     "inducing": 100, "seed": 0}}
    ten = {**rec, "settings": {**rec["settings"], "particles": 10}}
    assert grid.find([rec], grid.Run("energy", "meanfield", "auto", 0), args) is rec
    assert grid.find([rec], grid.Run("energy", "meanfield", "auto,P=10", 0), args) is None
    assert grid.find([rec, ten], grid.Run("energy", "meanfield", "auto,P=10", 0), args) is ten


def test_find_tells_runs_of_different_learning_rate_schedules_apart():
    """A record without ``lr_schedule`` ran at the protocol's constant rate."""
    args = SimpleNamespace(steps=3000, batch_size=1000, num_inducing=100, validation=0.1)
    rec = {"dataset": "naval", "guide": "meanfield", "objective": "auto", "split": 0,
           "layers": 2, "status": "ok", "settings": {"steps": 3000, "batch_size": 1000,
                                                     "inducing": 100, "seed": 0,
                                                     "validation": 0.1}}
    cosine = {**rec, "settings": {**rec["settings"], "lr_schedule": "cosine"}}
    run = grid.Run("naval", "meanfield", "auto", 0)
    assert grid.find([rec, cosine], run, args) is rec
    assert grid.find([rec, cosine], run, SimpleNamespace(**vars(args), lr_schedule="cosine")) \
        is cosine
    assert grid.settings(args) == {"validation": 0.1}
    assert grid.settings(SimpleNamespace(validation=None, lr_schedule="cosine")) == {
        "lr_schedule": "cosine"}


def test_the_atlas_stacks_both_objectives_of_a_split_beside_its_chosen_fits(tmp_path):
    """Mean-field fits with the ELBO and with alpha = 1 on one split: the chosen one is the
    atlas's member, ``stacked`` needs two members so is absent, and ``stacked, both
    objectives`` is the stack of the two fits (weights from their LOO densities)."""
    y = torch.linspace(-1.0, 4.0, 9, dtype=torch.float64)
    rng = np.random.default_rng(1)
    loo = {"auto": rng.normal(-1.2, 0.3, 30), "alpha=1": rng.normal(-1.6, 0.3, 30)}
    records, paths = [], []
    for k, (objective, lp) in enumerate(loo.items()):
        path = _side_file(tmp_path, objective, k, y, lp)
        paths.append(path)
        records.append({
            "dataset": "energy", "guide": "meanfield", "split": 0, "layers": 2, "status": "ok",
            "objective": grid.objective_label(objective), "seconds": 10.0 + k,
            "settings": {"steps": 3000, "batch_size": 1000, "inducing": 100, "seed": 0},
            "metrics": {"test_loglik": -1.0, "rmse": 1.0, "crps": 0.5, "coverage95": 0.9},
            "diagnostics": {"pointwise": path.name}})
    args = SimpleNamespace(steps=3000, batch_size=1000, num_inducing=100, validation=None,
                           pointwise_dir=str(tmp_path))
    lines = guides.split_lines(records, "energy", 0, args)
    assert ("meanfield", "auto") in lines and (guides.STACKED, "own") not in lines
    both = lines[(guides.STACKED_ALL, "own")]
    expected = pointwise.stack_runs(paths)
    assert both["test_loglik"] == pytest.approx(expected["test_loglik"])
    assert both["weights"] == {"meanfield": pytest.approx(expected["weights"][0]),
                               "meanfield alpha=1": pytest.approx(expected["weights"][1])}
    assert both["seconds"] == pytest.approx(21.0)
    assert "diverged_at" not in lines[("meanfield", "auto")]
    # fit's defaults (ten draws, the cosine schedule) join the stack where they have run
    path = _side_file(tmp_path, "cosine", 2, y, rng.normal(-1.0, 0.3, 30))
    records.append({**records[0], "objective": "auto", "seconds": 5.0,
                    "settings": {**records[0]["settings"], "particles": 10,
                                 "lr_schedule": "cosine"},
                    "diagnostics": {"pointwise": path.name}})
    both = guides.split_lines(records, "energy", 0, args)[(guides.STACKED_ALL, "own")]
    assert set(both["weights"]) == {"meanfield", "meanfield alpha=1",
                                    "meanfield auto,P=10 cosine"}
    assert both["test_loglik"] == pytest.approx(
        pointwise.stack_runs([*paths, path])["test_loglik"])
    records.pop()
    # a run whose loss became NaN is scored where it stopped, and says so
    records[0] = {**records[0], "status": "diverged", "steps_done": 1655}
    lines = guides.split_lines(records, "energy", 0, args)
    assert lines[("meanfield", "auto")]["diverged_at"] == 1655


def test_hold_out_splits_the_training_points_by_a_seeded_permutation():
    import uci

    from pyro_dgp.datasets.splits import Split

    X = torch.arange(40, dtype=torch.float64).reshape(20, 2)
    data = Split(X, X[:, 0] / 10, X[:3], X[:3, 0], X.mean(0), X.std(0), 1.0, 2.0, "toy")
    assert uci.hold_out(data, None, 0) == (data, None)
    train, (X_val, y_val) = uci.hold_out(data, 0.1, seed=3)
    assert X_val.shape == (2, 2) and train.num_train == 18 and train.num_test == 3
    rows = {tuple(r) for r in train.X_train.tolist()} | {tuple(r) for r in X_val.tolist()}
    assert len(rows) == 20  # disjoint, and together the whole training split
    assert torch.equal(y_val, X_val[:, 0] / 10)  # the targets travel with their inputs
    again = uci.hold_out(data, 0.1, seed=3)[1][0]
    assert torch.equal(again, X_val) and not torch.equal(uci.hold_out(data, 0.1, 4)[1][0], X_val)


def test_stacking_takes_the_held_out_densities_where_every_run_has_them(tmp_path):
    y = torch.linspace(-1.0, 4.0, 9, dtype=torch.float64)
    rng = np.random.default_rng(2)
    loo = [rng.normal(-1.0, 0.3, 30), rng.normal(-2.0, 0.3, 30)]
    val = [rng.normal(-2.0, 0.3, 6), rng.normal(-1.0, 0.3, 6)]
    paths = []
    for k in range(2):
        path = tmp_path / f"v{k}.npz"
        pointwise.save_run(path, _predictive(k), y, loo[k], val[k])
        paths.append(path)
    out = pointwise.stack_runs(paths)
    assert out["weights_from"] == "val_logp"
    assert out["weights"] == pytest.approx(stacking_weights(np.stack(val, 1)).numpy().tolist())
    assert out["weights"][1] > 0.5  # the run better on held-out points, worse by LOO
    mixed = pointwise.stack_runs([paths[0], _side_file(tmp_path, "nov", 1, y, loo[1])])
    assert mixed["weights_from"] == "loo_logp"


@pytest.mark.slow
@pytest.mark.usefixtures("boston_data")
def test_a_run_with_a_validation_fraction_trains_on_the_rest_and_writes_its_densities(
        tmp_path):
    import json

    import uci

    out, side = tmp_path / "runs.jsonl", tmp_path / "pointwise"
    assert uci.main(["--datasets", "boston", "--layers", "1", "--splits", "1", "--steps", "3",
                     "--samples", "5", "--inducing", "10", "--threads", "1", "--quiet",
                     "--validation", "0.1", "--out", str(out), "--pointwise-dir", str(side),
                     "--no-record"]) == 0
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["settings"]["validation"] == 0.1 and rec["data"]["num_train"] == 409
    run = pointwise.load_run(side / rec["diagnostics"]["pointwise"])
    assert run["val_logp"].shape == (46,) and np.isfinite(run["val_logp"]).all()
    assert run["loo_logp"].shape == (409,)


def test_a_run_with_the_cosine_schedule_trains_with_it_and_says_so(tmp_path, monkeypatch):
    """``--lr-schedule cosine`` hands ``fit`` its cosine schedule (the protocol's constant
    rate is ``lr_decay=1``), and its record and side file are not the constant rate's."""
    import json

    import uci

    seen = []
    real_fit = uci.fit
    monkeypatch.setattr(uci, "fit", lambda *a, **kw: seen.append(kw) or real_fit(*a, **kw))
    out, side = tmp_path / "runs.jsonl", tmp_path / "pointwise"
    argv = ["--datasets", "boston", "--layers", "1", "--splits", "1", "--steps", "3",
            "--samples", "5", "--inducing", "10", "--threads", "1", "--quiet", "--out",
            str(out), "--pointwise-dir", str(side), "--no-record"]
    assert uci.main(argv) == 0 and uci.main([*argv, "--lr-schedule", "cosine"]) == 0
    constant, cosine = (json.loads(line) for line in out.read_text().splitlines())
    assert seen[0]["lr_decay"] == 1.0 and "lr_schedule" not in seen[0]
    assert seen[1]["lr_schedule"] == "cosine" and "lr_decay" not in seen[1]
    assert "lr_schedule" not in constant["settings"]
    assert cosine["settings"]["lr_schedule"] == "cosine"
    assert constant["diagnostics"]["pointwise"] != cosine["diagnostics"]["pointwise"]


def test_the_defaults_stack_waits_for_both_fits_and_stacks_them(tmp_path):
    import defaults

    y = torch.linspace(-1.0, 4.0, 9, dtype=torch.float64)
    rng = np.random.default_rng(3)
    args = SimpleNamespace(steps=3000, batch_size=1000, num_inducing=100, validation=0.1,
                           pointwise_dir=str(tmp_path))
    records, paths = [], []
    for k, objective in enumerate(defaults.STACKED):
        path = tmp_path / f"{k}.npz"
        pointwise.save_run(path, _predictive(k), y, rng.normal(-1, 0.3, 30),
                           rng.normal(-1, 0.3, 6))
        paths.append(path)
        records.append({
            "dataset": "energy", "guide": "meanfield", "split": 0, "layers": 2, "status": "ok",
            "objective": grid.objective_label(objective), "seconds": 5.0,
            "settings": {"steps": 3000, "batch_size": 1000, "inducing": 100, "seed": 0,
                         "validation": 0.1},
            "diagnostics": {"pointwise": path.name}})
        found = defaults.stack_figures(records, "energy", "meanfield", 0, args)
        assert found is None if k == 0 else found is not None
    assert found["test_loglik"] == pytest.approx(pointwise.stack_runs(paths)["test_loglik"])
    assert found["weights_from"] == "val_logp" and found["seconds"] == 10.0
    args.validation = None  # runs without a held-out part are other runs
    assert defaults.stack_figures(records, "energy", "meanfield", 0, args) is None


def test_a_choice_takes_held_out_densities_where_the_run_has_them(tmp_path):
    y = torch.linspace(-1.0, 4.0, 9, dtype=torch.float64)
    path = tmp_path / "v.npz"
    pointwise.save_run(path, _predictive(0), y, np.full(30, -3.0), np.full(6, -1.0))
    rec = {"diagnostics": {"pointwise": path.name}}
    assert pointwise.held_out_elpd(rec, tmp_path) == -1.0
    pointwise.save_run(path, _predictive(0), y, np.full(30, -3.0))
    assert pointwise.held_out_elpd(rec, tmp_path) == -3.0


def _atlas_record(dataset, guide, objective, loglik, rmse=1.0, validation=None, split=0):
    settings = {"dataset": dataset, "guide": guide, "objective": objective, "steps": 3000,
                "split": split}
    if validation:
        settings["validation"] = validation
    return {"date": "2026-11-28", "settings": settings,
            "figures": {"test_loglik": loglik, "rmse": rmse}}


def test_atlas_goal_rows_take_one_protocol_per_set_and_count_the_goals():
    records = [
        # boston: the held-out runs are the protocol; the better full-split row is not used
        _atlas_record("boston", "meanfield", "auto", -2.0),
        _atlas_record("boston", "meanfield", "auto", -2.3, validation=0.1),
        _atlas_record("boston", "stacked", "own", -2.2, validation=0.1),
        # power: MeanField best, below SGHMC's -2.65
        _atlas_record("power", "meanfield", "alpha=1,S=10", -2.7, validation=0.1),
        _atlas_record("power", "coupled", "alpha=1,S=10", -2.8, validation=0.1),
        # wine_red: alpha = 1's spikes do not count, its ELBO fit does
        _atlas_record("wine_red", "meanfield", "alpha=1,S=10", 1.7, validation=0.1),
        _atlas_record("wine_red", "meanfield", "auto", -0.9),
        _atlas_record("wine_red", "amortized-ar2pp", "auto", 0.1),  # its noise collapses too
        # a summary over splits is not a per-split line
        {**_atlas_record("power", "chain", "auto", 9.0),
         "settings": {"dataset": "power", "guide": "chain", "objective": "auto"}},
    ]
    rows = {r["settings"]["dataset"]: r for r in studies.atlas_goal_rows(records)}
    assert list(rows) == ["boston", "wine_red", "power", "goal"]
    boston = rows["boston"]
    assert boston["settings"]["protocol"] == "validation"
    assert boston["figures"]["best"] == "stacked (own)"
    assert boston["figures"]["best_cell"] == "-2.200 / 1.00"
    assert boston["figures"]["meanfield"] == "-2.300 / 1.00"
    assert boston["figures"]["goal"] == "yes; yes"
    assert rows["power"]["figures"]["goal"] == "no; no"
    assert rows["power"]["figures"]["richer"] == "coupled: -2.800 / 1.00"
    wine = rows["wine_red"]
    assert wine["settings"]["protocol"] == "full" and wine["figures"]["best"] == "meanfield (auto)"
    assert wine["figures"]["goal"] == "no; no"
    assert rows["goal"]["figures"]["goal"] == "1; 1"
    # a protocol without a counted MeanField row (its alpha = 1 fit left out): no count
    records.append(_atlas_record("wine_red", "mixture", "auto", -0.95, validation=0.1))
    rows = {r["settings"]["dataset"]: r for r in studies.atlas_goal_rows(records)}
    assert rows["wine_red"]["figures"]["best"] == "mixture (auto)"
    assert rows["wine_red"]["figures"]["goal"] == "no; —"
    assert rows["goal"]["figures"]["goal"] == "1; 1"


def test_atlas_goal_rows_compare_rows_over_the_stacked_rows_splits():
    v = {"validation": 0.1}
    records = [
        _atlas_record("kin8nm", "meanfield", "auto", 1.30, rmse=2.0, **v),
        _atlas_record("kin8nm", "meanfield", "auto", 1.40, rmse=4.0, split=1, **v),
        _atlas_record("kin8nm", "stacked", "own", 1.34, **v),
        _atlas_record("kin8nm", "stacked", "own", 1.38, split=1, **v),
        # split 0 only: not comparable with the means over splits 0 and 1, so left out
        _atlas_record("kin8nm", "meanfield x5", "auto", 1.50, **v),
        # a split the stacked row lacks does not enter the means
        _atlas_record("kin8nm", "meanfield", "auto", -9.0, split=2, **v),
    ]
    rows = {r["settings"]["dataset"]: r for r in studies.atlas_goal_rows(records)}
    kin = rows["kin8nm"]
    assert kin["settings"]["splits"] == 2
    assert kin["figures"]["best"] == "stacked (own)"
    assert kin["figures"]["best_cell"] == "1.360 / 1.00"
    assert kin["figures"]["meanfield"] == "1.350 / 3.00"
    assert kin["figures"]["goal"] == "no; yes"
    # without a stacked row, the row with the most splits sets them
    rows = {r["settings"]["dataset"]: r
            for r in studies.atlas_goal_rows([r for r in records
                                              if r["settings"]["guide"] != "stacked"])}
    assert rows["kin8nm"]["settings"]["splits"] == 3
    assert rows["kin8nm"]["figures"]["best"] == "meanfield (auto)"


def _peer_record(dataset, peer, split, loglik, rmse=1.0, particles=True, steps=3000):
    settings = {"dataset": dataset, "peer": peer, "split": split, "device": "cpu",
                "steps": steps, **({"particles": 10} if particles and peer != "deepgp" else {})}
    return {"settings": settings, "figures": {"test_loglik": loglik, "rmse": rmse},
            "command": "python benchmarks/peers.py", "date": f"2026-11-28T0{split}"}


def _budget_record(dataset, objective, loglik, splits, steps=10000, schedule=None):
    """A defaults-study summary over ``splits`` (a list of split indices)."""
    settings = {"dataset": dataset, "guide": "meanfield", "objective": objective,
                "steps": steps, "splits": len(splits), "validation": 0.1}
    if schedule:
        settings["lr_schedule"] = schedule
    return {"date": "2026-11-29", "settings": settings,
            "figures": {"test_loglik": loglik, "rmse": 1.0, "splits_run": list(splits)}}


def test_budget_goal_rows_compare_the_same_splits_at_each_longer_budget():
    records = [
        # energy: the alpha = 1 fits cover splits 0 and 1 apart; the ELBO's cover all three
        _budget_record("energy", "alpha=1", -0.1, [0]),
        _budget_record("energy", "alpha=1", -3.0, [1]),
        _budget_record("energy", "auto", -0.5, [0, 1, 2]),
        _budget_record("energy", "auto", -0.2, [0]),
        _budget_record("energy", "stack", -0.4, [0, 1, 2]),
        _budget_record("energy", "stack", -0.1, [0]),
        # naval: only fit's defaults at the cosine schedule, above SGHMC's 7.77
        _budget_record("naval", "auto,P=10", 8.1, [0, 1, 2], schedule="cosine"),
        # wine_red: alpha = 1's degenerate log-lik and its stack do not count
        _budget_record("wine_red", "alpha=1", 1.5, [0, 1]),
        _budget_record("wine_red", "stack", 1.4, [0, 1]),
        _budget_record("wine_red", "auto", -0.9, [0, 1]),
        # the atlas's budget and sets outside Lindinger et al.'s table are not rows
        _budget_record("boston", "auto", -2.0, [0, 1, 2], steps=3000),
        _budget_record("yacht", "auto", 0.5, [0, 1, 2]),
    ]
    # the atlas reaches SGHMC's -2.65 on power (a set the longer budget has not run)
    atlas = [_atlas_record("power", "meanfield", "auto", -2.6, validation=0.1),
             _atlas_record("power", "stacked", "own", -2.5, validation=0.1),
             _atlas_record("naval", "meanfield", "auto", 7.0, validation=0.1),
             _atlas_record("naval", "stacked", "own", 7.1, validation=0.1)]
    rows = {r["settings"]["dataset"]: r for r in studies.budget_goal_rows(records, atlas)}
    assert set(rows) == {"energy", "naval", "wine_red", "goal"}
    energy = rows["energy"]
    assert energy["settings"]["splits"] == 3
    assert energy["figures"]["best"] == "meanfield, auto"
    assert energy["figures"]["best_cell"].startswith("-0.500")
    assert energy["figures"]["stack"].startswith("-0.400")
    assert energy["figures"]["goal"] == "no"  # the stack, -0.4, is the best; SGHMC's -0.34
    assert rows["naval"]["figures"]["best"] == "meanfield, auto,P=10, cosine"
    assert rows["naval"]["figures"]["atlas"].startswith("7.100")
    assert rows["naval"]["figures"]["goal"] == "yes"
    assert rows["wine_red"]["figures"]["best_cell"].startswith("-0.900")
    assert rows["wine_red"]["figures"]["stack"] == ""
    assert rows["wine_red"]["figures"]["goal"] == "no"
    assert rows["goal"]["figures"]["goal"] == "1; 2 at either budget"  # naval; and power


def test_a_stack_summary_without_its_split_list_takes_its_commands_splits():
    rec = _budget_record("energy", "stack", -0.3, [1, 2])
    rec["figures"]["splits_run"] = 2
    rec["command"] = "python benchmarks/defaults.py --splits 1 2 --steps 10000"
    assert studies.summary_splits(rec) == (1, 2)
    rec["command"] = "python benchmarks/defaults.py --splits 0 1 2 --steps 10000"
    assert studies.summary_splits(rec) is None  # two of three: which two is unknown


def test_kernel_rows_compare_the_two_layouts_over_the_splits_both_have_run():
    records = [
        _peer_record("boston", "ours", 0, -2.0, 2.0), _peer_record("boston", "ours", 1, -3.0),
        _peer_record("boston", "ours-per-output", 0, -2.5, 3.0),
        _peer_record("boston", "ours-per-output", 1, -2.0),
        _peer_record("boston", "ours", 2, 5.0),  # a split the other layout lacks: left out
        _peer_record("boston", "deepgp", 0, -4.0),  # not every split: no DeepGP cell
        _peer_record("kin8nm", "ours", 0, 1.0), _peer_record("kin8nm", "ours-per-output", 0, 0.5),
        _peer_record("kin8nm", "deepgp", 0, 1.1, 0.5),
        # before fit's current settings (no particles): not compared
        _peer_record("kin8nm", "ours", 1, 9.0, particles=False),
        _peer_record("kin8nm", "ours-per-output", 1, 0.0),
        _peer_record("power", "ours", 0, 1.0),  # one layout only: no row
    ]
    rows = {r["settings"]["dataset"]: r for r in studies.kernel_rows(records)}
    assert list(rows) == ["boston", "kin8nm", "sets led"]
    boston = rows["boston"]["figures"]
    assert rows["boston"]["settings"]["splits"] == 2
    assert boston["ours"] == "-2.500 / 1.5" and boston["ours-per-output"] == "-2.250 / 2"
    assert boston["deepgp"] == "—" and boston["ahead"] == "a kernel per hidden GP, 1 of 2"
    kin8nm = rows["kin8nm"]["figures"]
    assert kin8nm["deepgp"] == "1.100 / 0.5" and kin8nm["ahead"] == "one kernel per layer, 1 of 1"
    assert rows["sets led"]["figures"]["ours"] == "1"
    assert rows["sets led"]["figures"]["ours-per-output"] == "1"
    assert rows["sets led"]["settings"]["steps"] == 3000


def test_kernel_rows_keep_runs_of_other_settings_apart():
    records = [_peer_record("boston", "ours", 0, -2.0),
               _peer_record("boston", "ours-per-output", 0, -2.5),
               _peer_record("boston", "ours", 0, -1.0, steps=10_000),
               _peer_record("boston", "ours-per-output", 0, -0.5, steps=10_000)]
    rows = [r for r in studies.kernel_rows(records) if r["settings"]["dataset"] == "boston"]
    cells = {r["settings"]["steps"]: r["figures"]["ours"] for r in rows}
    assert cells == {3000: "-2.000 / 1", 10_000: "-1.000 / 1"}
