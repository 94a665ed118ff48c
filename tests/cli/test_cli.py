"""The command line end to end on tiny settings."""

import json
from pathlib import Path

import pyro
import pytest
import torch
from uci_data import data_root, needs_uci

from pyro_dgp.cli import main

DATA = data_root("boston", "yacht") or Path("UCI data not found")
needs_boston = needs_uci("boston")
needs_yacht = needs_uci("yacht")
_METRICS = ("nll", "rmse", "crps", "coverage95")


def test_demo_runs_and_writes_results(tmp_path, capsys):
    assert main(["demo", "--steps", "30", "--output", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "DGP 2" in out and "nll" in out
    rows = json.loads((tmp_path / "results.json").read_text())
    assert len(rows) == 3 and all("rmse" in r for r in rows)
    assert (tmp_path / "predictions.png").stat().st_size > 1000
    pngs = sorted(p.name for p in tmp_path.glob("2layer_meanfield_*.png"))
    assert len(pngs) >= 3 and all((tmp_path / p).stat().st_size > 1000 for p in pngs)
    assert (tmp_path / "2layer_meanfield_datatree.nc").exists()


@needs_boston
def test_fit_then_evaluate_reproduces_the_numbers(tmp_path, capsys):
    args = ["fit", "--data", "boston", "--data-dir", str(DATA), "--layers", "2",
            "--num-inducing", "10", "--steps", "20", "--batch-size", "64", "--samples", "5",
            "--output", str(tmp_path), "--quiet"]
    assert main(args) == 0
    fitted = json.loads((tmp_path / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "fit.pt"), "--data-dir", str(DATA),
                 "--samples", "5"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for k in ("nll", "rmse", "crps", "coverage95"):
        assert evaluated[k] == pytest.approx(fitted[k], rel=1e-9), k
    assert main(["evaluate", str(tmp_path / "fit.pt"), "--data-dir", str(DATA),
                 "--samples", "5", "--plots", str(tmp_path / "plots")]) == 0
    assert list((tmp_path / "plots").glob("*.png"))  # 13-D inputs: the hyperparameter plot
    assert (tmp_path / "plots" / "datatree.nc").exists()


@needs_boston
def test_bench_uci_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    import uci

    assert uci.main(["--datasets", "boston", "--layers", "2", "--splits", "1",
                 "--steps", "3", "--samples", "3", "--num-inducing", "5", "--data-dir", str(DATA),
                 "--out", str(out), "--checkpoint-dir", str(tmp_path / "ck"), "--quiet"]) == 0
    assert len(out.read_text().splitlines()) == 1


@pytest.mark.slow  # about 8 s: runs the whole benchmark at a small size
def test_bench_compositional_from_the_command_line(tmp_path):
    import compositional

    assert compositional.main(["--trials", "1", "--steps", "3", "--families",
                 "mean-field", "chain", "inducing-as-locations (whitened last layer)",
                 "--out", str(tmp_path)]) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "layer_paths.png").stat().st_size > 1000
    # resumable: the same command runs nothing again; --first-trial adds the next seed
    args = ["--steps", "3", "--families", "mean-field", "--out", str(tmp_path)]
    assert compositional.main(args + ["--trials", "1"]) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3
    assert compositional.main(args + ["--trials", "1", "--first-trial", "1"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["family"], r["trial"]) for r in rows] == [
        ("mean-field", 0), ("chain", 0), ("inducing-as-locations (whitened last layer)", 0),
        ("mean-field", 1)]
    # the toy's noise and size are settings of a run: another noise is another run, and rows
    # written before the options existed count as the toy's defaults
    assert compositional.main(args + ["--trials", "1", "--noise", "0.1", "--n-train", "30"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and (rows[-1]["noise"], rows[-1]["n_train"]) == (0.1, 30)
    legacy = [{k: v for k, v in r.items() if k not in ("noise", "n_train")} for r in rows[:4]]
    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in legacy + rows[4:]))
    assert compositional.main(args + ["--trials", "1"]) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 5
    with pytest.raises(SystemExit, match="--noise"):
        compositional.main(args + ["--trials", "1", "--noise", "0"])


def test_fit_with_a_csv_and_a_bad_target_names_the_column(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,target\n" + "\n".join(f"{i},{i % 3},{i * 0.1}" for i in range(40)))
    code = main(["fit", "--data", str(csv), "--target", "nope", "--steps", "2",
                 "--output", str(tmp_path / "o"), "--quiet"])
    assert code == 2
    assert "nope" in capsys.readouterr().err
    assert main(["fit", "--data", str(csv), "--target", "target", "--steps", "5",
                 "--num-inducing", "5", "--samples", "3", "--output", str(tmp_path / "o"),
                 "--quiet"]) == 0


def test_fit_cuda_graph_names_the_device_it_needs(tmp_path, capsys):
    code = main(["fit", "--data", "step", "--steps", "2", "--cuda-graph", "--output",
                 str(tmp_path / "o"), "--quiet"])
    assert code == 2
    assert "--cuda-graph needs --device cuda, not --device cpu" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, word",
    [(["fit", "--data", "boston", "--steps", "0"], "--steps"),
     (["fit", "--data", "boston", "--lr", "-1"], "--lr"),
     (["fit", "--data", "boston", "--guide", "nope"], "--guide"),
     (["demo", "--steps", "-3"], "--steps")],
)
def test_bad_arguments_name_the_argument(argv, word, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert word in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [[], ["demo"], ["fit"], ["evaluate"]],
    ids=lambda c: " ".join(c) or "pyro-dgp",
)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_answers_help(command, flag, capsys):
    try:
        code = main(command + [flag])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    assert "usage:" in capsys.readouterr().out


def test_bench_is_not_a_subcommand(capsys):
    """The benchmarks live in the repository's benchmarks/ folder, not in the package."""
    with pytest.raises(SystemExit) as exc:
        main(["bench"])
    assert exc.value.code == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, word",
    [(["--target", "y"], "--target"),
     (["--test-fraction", "0.2"], "--test-fraction")],
)
def test_csv_only_arguments_are_rejected_for_named_sets(tmp_path, extra, word, capsys):
    for data in ("boston", "step"):
        code = main(["fit", "--data", data, "--steps", "2", "--output", str(tmp_path),
                     "--quiet", *extra])
        assert code == 2
        err = capsys.readouterr().err
        assert word in err and data in err


def _fit_then_evaluate(fit_args, eval_args, output, capsys):
    """Metrics reported by ``fit`` and by ``evaluate`` of its fit.pt (fresh param store)."""
    assert main(["fit", *fit_args, "--output", str(output), "--quiet"]) == 0
    fitted = json.loads((output / "metrics.json").read_text())
    capsys.readouterr()
    pyro.clear_param_store()
    assert main(["evaluate", str(output / "fit.pt"), *eval_args]) == 0
    return fitted, json.loads(capsys.readouterr().out)


@needs_yacht
def test_evaluate_reproduces_a_float32_seeded_uci_fit(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PYRO_DGP_DATA", raising=False)  # the saved data_dir must suffice
    fit_args = ["--data", "yacht", "--data-dir", str(DATA), "--dtype", "float32", "--seed", "5",
                "--split", "3", "--layers", "2", "--num-inducing", "5", "--steps", "10",
                "--samples", "5"]
    fitted, evaluated = _fit_then_evaluate(fit_args, [], tmp_path, capsys)
    for k in _METRICS:
        assert evaluated[k] == fitted[k], k
    cfg = torch.load(tmp_path / "fit.pt", weights_only=False)["config"]
    assert {k: cfg[k] for k in ("data", "target", "split", "test_fraction", "dtype", "device",
                                "seed", "samples")} == {
        "data": "yacht", "target": None, "split": 3, "test_fraction": None, "dtype": "float32",
        "device": "cpu", "seed": 5, "samples": 5}
    assert Path(cfg["data_dir"]) == DATA.resolve()
    # an explicit argument overrides the saved value
    assert main(["evaluate", str(tmp_path / "fit.pt"), "--seed", "6"]) == 0
    assert json.loads(capsys.readouterr().out)["nll"] != fitted["nll"]
    assert main(["evaluate", str(tmp_path / "fit.pt"), "--target", "y"]) == 2
    assert "--target" in capsys.readouterr().err


def _write_csv(path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * X[:, 0]) + X[:, 1] ** 2
    rows = [f"{a:.6f},{b:.6f},{t:.6f}" for (a, b), t in zip(X.tolist(), y.tolist(), strict=True)]
    path.write_text("a,b,target\n" + "\n".join(rows) + "\n")
    return path


def test_evaluate_reproduces_a_float32_seeded_csv_fit_without_target(tmp_path, capsys,
                                                                     monkeypatch):
    csv = _write_csv(tmp_path / "d.csv")
    monkeypatch.chdir(tmp_path)  # a relative path in --data is saved as an absolute one
    fit_args = ["--data", "d.csv", "--target", "target", "--dtype", "float32", "--seed", "5",
                "--num-inducing", "5", "--steps", "10", "--samples", "5"]
    fitted, evaluated = _fit_then_evaluate(fit_args, [], tmp_path / "o", capsys)
    for k in _METRICS:
        assert evaluated[k] == fitted[k], k
    cfg = torch.load(tmp_path / "o" / "fit.pt", weights_only=False)["config"]
    assert cfg["data"] == str(csv.resolve()) and Path(cfg["data"]).is_absolute()
    assert (cfg["target"], cfg["split"], cfg["test_fraction"], cfg["dtype"], cfg["seed"]) == (
        "target", 5, 0.1, "float32", 5)
    # --split is the seed of a CSV file's random split, saved and reused by evaluate; another
    # split seed gives another test set
    fit_args += ["--split", "7", "--test-fraction", "0.25"]
    fitted7, evaluated7 = _fit_then_evaluate(fit_args, [], tmp_path / "o7", capsys)
    for k in _METRICS:
        assert evaluated7[k] == fitted7[k], k
    assert fitted7["nll"] != fitted["nll"]
    cfg7 = torch.load(tmp_path / "o7" / "fit.pt", weights_only=False)["config"]
    assert (cfg7["split"], cfg7["test_fraction"], cfg7["seed"]) == (7, 0.25, 5)
    assert main(["evaluate", str(tmp_path / "o7" / "fit.pt"), "--data-dir", "x"]) == 2
    assert "--data-dir" in capsys.readouterr().err


def test_evaluate_still_reads_a_fit_saved_without_the_data_settings(tmp_path, capsys):
    """Fits saved before the data settings were recorded split a CSV file with their seed."""
    csv = _write_csv(tmp_path / "d.csv")
    fit_args = ["--data", str(csv), "--target", "target", "--seed", "3", "--num-inducing", "5",
                "--steps", "5", "--samples", "4"]
    assert main(["fit", *fit_args, "--output", str(tmp_path), "--quiet"]) == 0
    fitted = json.loads((tmp_path / "metrics.json").read_text())
    capsys.readouterr()
    state = torch.load(tmp_path / "fit.pt", weights_only=False)
    cfg = state["config"]
    state["config"] = {"model": cfg["model"], "guide": cfg["guide"], "data": str(csv),
                       "split": 0}
    torch.save(state, tmp_path / "old.pt")
    assert main(["evaluate", str(tmp_path / "old.pt"), "--samples", "4"]) == 2
    assert "--target" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "old.pt"), "--samples", "4", "--target",
                 "target"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for k in _METRICS:
        assert evaluated[k] == fitted[k], k


def test_classification_csv_keeps_its_labels(tmp_path, capsys):
    """A CSV classification target (here -1/1) is kept as labels, not standardised: fit
    learns two separable blobs and evaluate reproduces its accuracy."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(80, 2, generator=g, dtype=torch.float64)
    label = torch.where(X[:, 0] + X[:, 1] > 0, 1, -1)
    X = X + 1.5 * label.unsqueeze(-1)
    rows = [f"{a:.6f},{b:.6f},{t}" for (a, b), t in zip(X.tolist(), label.tolist(), strict=True)]
    csv = tmp_path / "c.csv"
    csv.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    fit_args = ["--data", str(csv), "--target", "label", "--classification", "--layers", "1",
                "--num-inducing", "6", "--steps", "200", "--lr", "0.05", "--samples", "10",
                "--test-fraction", "0.25"]
    fitted, evaluated = _fit_then_evaluate(fit_args, [], tmp_path / "o", capsys)
    assert fitted["accuracy"] >= 0.9
    assert evaluated == {k: fitted[k] for k in evaluated}
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,label\n" + "\n".join(f"{i},{i},{i % 3}" for i in range(20)) + "\n")
    assert main(["fit", "--data", str(bad), "--target", "label", "--classification",
                 "--steps", "2", "--output", str(tmp_path / "b"), "--quiet"]) == 2
    assert "0/1 or -1/1" in capsys.readouterr().err
    for fraction in ("0", "1"):  # nothing held out to score, or nothing to train on
        assert main(["fit", "--data", str(csv), "--target", "label", "--test-fraction",
                     fraction, "--steps", "2", "--output", str(tmp_path / "b"), "--quiet"]) == 2
        assert "--test-fraction must lie in (0, 1)" in capsys.readouterr().err


# ------------------------------------------------------------- what the CLI says it does
def test_every_option_has_help_and_shows_its_default():
    """Each option of each command has a help text; one with a default shows it."""
    import argparse

    from pyro_dgp.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        text = " ".join(command.format_help().split())
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            label = action.option_strings[0] if action.option_strings else action.dest
            assert action.help, f"{name} {label} has no help"
            if action.option_strings and action.default not in (None, False):
                helptext = " ".join(command.formatter_class(name)._expand_help(action).split())
                assert "default" in helptext, f"{name} {label} hides its default"
                assert helptext in text


def test_fit_says_what_it_clamped_and_where_it_wrote(tmp_path, capsys):
    code = main(["fit", "--data", "step", "--num-inducing", "500", "--batch-size", "100000",
                 "--steps", "2", "--samples", "3", "--output", str(tmp_path), "--quiet"])
    assert code == 0
    captured = capsys.readouterr()
    assert "--num-inducing 500 is more than the" in captured.err and "using M =" in captured.err
    assert "--batch-size 100000 covers all" in captured.err and "full-batch" in captured.err
    assert f"wrote the fit to {tmp_path / 'fit.pt'}" in captured.out
    assert str(tmp_path / "metrics.json") in captured.out
    assert str(tmp_path / "checkpoint.pt") in captured.out
    assert (tmp_path / "fit.pt").exists() and (tmp_path / "checkpoint.pt").exists()
    # evaluate's per-layer summary has no empty label in front
    assert main(["evaluate", str(tmp_path / "fit.pt"), "--plots", str(tmp_path / "p")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "per-layer summary" in lines and not any(ln.startswith(":") for ln in lines)


def test_threads_option_sets_torchs_threads_during_the_fit(tmp_path, monkeypatch):
    import pyro_dgp.cli.commands as cli

    seen = []
    real_fit = cli.fit

    def recording_fit(*args, **kwargs):
        seen.append((torch.get_num_threads(), kwargs["threads"]))
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(cli, "fit", recording_fit)
    before = torch.get_num_threads()
    for threads, expected in ((["--threads", "2"], 2), ([], 1)):  # default: small -> one
        assert main(["fit", "--data", "step", "--num-inducing", "5", "--steps", "1", "--samples",
                     "2", "--output", str(tmp_path), "--quiet", *threads]) == 0
        assert seen[-1] == (expected, expected)
        assert torch.get_num_threads() == before


def _recording_fit(monkeypatch):
    """Replace the CLI's ``fit`` by one that records its keyword arguments and trains."""
    import pyro_dgp.cli.commands as cli

    calls, real = [], cli.fit

    def fit(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "fit", fit)
    return calls


_TINY = ["--data", "step", "--num-inducing", "5", "--steps", "3", "--samples", "3", "--quiet"]


def test_fit_trains_the_alpha_objective_with_the_alpha_given(tmp_path, monkeypatch, capsys):
    calls = _recording_fit(monkeypatch)
    assert main(["fit", *_TINY, "--objective", "alpha", "--alpha", "0.3", "--output",
                 str(tmp_path)]) == 0
    assert calls[0]["objective"] == "alpha" and calls[0]["alpha"] == 0.3
    assert (tmp_path / "fit.pt").exists()


def test_fit_takes_natural_gradient_steps_warmed_up_to_gamma(tmp_path, monkeypatch, capsys):
    calls = _recording_fit(monkeypatch)
    assert main(["fit", *_TINY, "--natural-gradient", "0.2", "--output", str(tmp_path)]) == 0
    schedule = calls[0]["natural_gradient"]
    assert schedule(0) == pytest.approx(1e-4) and schedule(100) == pytest.approx(0.2)
    calls.clear()
    assert main(["fit", *_TINY, "--output", str(tmp_path / "plain")]) == 0
    assert "natural_gradient" not in calls[0] and "alpha" not in calls[0]


def test_evaluate_plots_what_applies_to_two_inputs_and_says_what_it_skipped(tmp_path, capsys):
    csv = _write_csv(tmp_path / "d.csv")
    assert main(["fit", "--data", str(csv), "--target", "target", "--num-inducing", "4", "--steps",
                 "2", "--samples", "2", "--output", str(tmp_path / "o"), "--quiet"]) == 0
    capsys.readouterr()
    plots = tmp_path / "p"
    assert main(["evaluate", str(tmp_path / "o" / "fit.pt"), "--plots", str(plots)]) == 0
    written = sorted(p.name for p in plots.iterdir())
    assert written == ["datatree.nc", "hyperparameters.png", "layer_variance.png",
                       "predictive.png"]
    captured = capsys.readouterr()
    assert ("plot 'paths' skipped: layer sample paths are curves against a 1-D input; these "
            "inputs have 2 dims") in captured.err
    assert "wrote layer_variance.png, predictive.png, hyperparameters.png" in captured.out


def test_fit_with_a_kernel_per_output_saves_it_in_the_fits_config(tmp_path, capsys):
    assert main(["fit", "--data", "step", "--steps", "2", "--num-inducing", "5",
                 "--kernel-per-output", "--output", str(tmp_path), "--quiet"]) == 0
    state = torch.load(tmp_path / "fit.pt", weights_only=True)
    assert state["config"]["model"]["kernel_per_output"] is True
    code = main(["fit", "--data", "step", "--steps", "2", "--model", "avdgp",
                 "--kernel-per-output", "--output", str(tmp_path / "a"), "--quiet"])
    assert code == 2 and "--kernel-per-output does not apply to --model avdgp" in \
        capsys.readouterr().err
