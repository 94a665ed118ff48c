"""End-to-end test of the UCI benchmark harness (pyro_uci) on a tiny setting."""

import json

import pytest
import uci

needs_data = pytest.mark.usefixtures("boston_data")


@needs_data
def test_uci_harness_end_to_end_resume_and_summary(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    report = tmp_path / "BENCHMARKS.md"
    argv = ["--datasets", "boston", "--layers", "1", "--splits", "1", "--steps", "5",
            "--samples", "5", "--inducing", "10", "--threads", "1", "--quiet",
            "--out", str(out), "--summary"]
    assert uci.main(argv) == 0
    first = capsys.readouterr()

    lines = out.read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    for key in ("dataset", "layers", "guide", "objective", "split", "model", "status",
                "settings", "data", "metrics", "final_elbo", "seconds", "versions"):
        assert key in rec, key
    assert (rec["dataset"], rec["layers"], rec["guide"], rec["objective"], rec["split"]) == (
        "boston", 1, "meanfield", "auto", 0)
    assert rec["model"] == "SGP" and rec["status"] == "ok"
    s = rec["settings"]
    assert (s["steps"], s["samples"], s["inducing_used"], s["lr"], s["particles"]) == (
        5, 5, 10, 0.01, 1)
    assert s["batch_size_used"] == rec["data"]["num_train"] == 455  # min(10000, N)
    assert rec["data"]["num_splits"] == 20
    assert rec["steps_done"] == 5
    m = rec["metrics"]
    assert set(m) >= {"test_loglik", "nll", "rmse", "crps", "coverage95"}
    assert m["test_loglik"] == pytest.approx(-m["nll"])
    assert 0 < m["rmse"] < 30 and 0 < m["crps"] < m["rmse"] + 1e-9  # CRPS <= MAE <= RMSE
    # a fraction of the 51 test points
    n_test = rec["data"]["num_test"]
    assert n_test == 51 and m["coverage95"] * n_test == pytest.approx(
        round(m["coverage95"] * n_test), abs=1e-9)
    assert rec["final_elbo"] < 0 and rec["seconds"] > 0
    # the finished run's checkpoint is gone, the folder stays
    assert list((tmp_path / "results.jsonl.ckpt").iterdir()) == []

    # the summary sits beside the published boston numbers (REFERENCE.md §6)
    assert "| boston | SGP |" in first.out
    assert "-2.47(0.05)" in first.out and "2.87(0.15)" in first.out

    # a second invocation skips the finished run and appends the report
    assert uci.main(argv + ["--append", str(report)]) == 0
    second = capsys.readouterr()
    assert "1 of 1 runs already in" in second.err
    assert out.read_text().splitlines() == lines
    text = report.read_text()
    assert text.startswith("# Benchmarks")
    assert "--steps 5" in text and "-2.47(0.05)" in text and "torch " in text
    assert "steps 5 (protocol 20000)" in text


@needs_data
def test_uci_harness_resumes_a_killed_run(tmp_path, monkeypatch):
    """A run whose process died mid-fit continues from its checkpoint."""
    out = tmp_path / "r.jsonl"
    argv = ["--datasets", "boston", "--layers", "1", "--splits", "1", "--steps", "6",
            "--samples", "3", "--inducing", "5", "--threads", "1", "--quiet",
            "--checkpoint-every", "2", "--out", str(out)]
    real_fit = uci.fit

    def dying_fit(*args, **kwargs):
        kwargs["num_steps"] = 4  # stand-in for a kill after step 4: the checkpoint holds 4
        real_fit(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(uci, "fit", dying_fit)
    with pytest.raises(KeyboardInterrupt):
        uci.main(argv)
    assert not out.exists()
    monkeypatch.setattr(uci, "fit", real_fit)
    assert uci.main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["resumed_from"] == 4 and rec["steps_done"] == 6


@needs_data
def test_snapshot_scores_an_unfinished_run_as_the_run_of_that_many_steps(tmp_path, monkeypatch,
                                                                          capsys):
    """--snapshot scores a killed run at its checkpoint (step 4 of 6) without training it or
    touching its checkpoint, and gives exactly the record of a 4-step run."""
    out, snap = tmp_path / "r.jsonl", tmp_path / "snap.jsonl"
    argv = ["--datasets", "boston", "--layers", "2", "--splits", "1", "--steps", "6",
            "--samples", "3", "--inducing", "5", "--threads", "1", "--quiet",
            "--checkpoint-every", "2", "--out", str(out)]
    real_fit = uci.fit

    def dying_fit(*args, **kwargs):
        kwargs["num_steps"] = 4
        real_fit(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(uci, "fit", dying_fit)
    with pytest.raises(KeyboardInterrupt):
        uci.main(argv)
    monkeypatch.setattr(uci, "fit", real_fit)
    (ckpt,) = (tmp_path / "r.jsonl.ckpt").iterdir()
    before = ckpt.read_bytes()
    assert uci.main(argv + ["--snapshot", str(snap)]) == 0
    assert "at step 4 of 6" in capsys.readouterr().err
    assert ckpt.read_bytes() == before and not out.exists()
    rec = json.loads(snap.read_text())
    assert (rec["settings"]["steps"], rec["steps_done"], rec["snapshot_of_steps"]) == (4, 4, 6)
    # the 4-step run itself, from scratch
    four = tmp_path / "four.jsonl"
    assert uci.main([a if a != "6" else "4" for a in argv[:-2]] + ["--out", str(four)]) == 0
    ref = json.loads(four.read_text())
    assert rec["metrics"] == pytest.approx(ref["metrics"], rel=1e-12)
    assert rec["final_elbo"] == pytest.approx(ref["final_elbo"], rel=1e-12)
    # the killed run still continues from its checkpoint, and a finished run has no snapshot
    assert uci.main(argv) == 0
    assert json.loads(out.read_text())["resumed_from"] == 4
    assert uci.main(argv + ["--snapshot", str(snap)]) == 0
    assert "no unfinished run" in capsys.readouterr().err
    assert len(snap.read_text().splitlines()) == 1


def test_parse_splits():
    assert uci._parse_splits(["all"], 5) == [0, 1, 2, 3, 4]
    assert uci._parse_splits(["3"], 20) == [0, 1, 2]
    assert uci._parse_splits(["30"], 5) == [0, 1, 2, 3, 4]
    assert uci._parse_splits(["4", "1"], 20) == [1, 4]
    assert uci._parse_splits(["5:7"], 20) == [5, 6]
    with pytest.raises(ValueError):
        uci._parse_splits(["4", "25"], 20)


@needs_data
def test_uci_harness_records_a_failed_run_and_retries_it(tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    argv = ["--datasets", "boston", "--layers", "1", "--splits", "1", "--steps", "2",
            "--samples", "2", "--inducing", "5", "--threads", "1", "--quiet", "--out", str(out)]

    def broken_fit(*args, **kwargs):
        raise RuntimeError("cholesky failed")

    monkeypatch.setattr(uci, "fit", broken_fit)
    assert uci.main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "failed" and "cholesky failed" in rec["error"]
    monkeypatch.undo()
    assert uci.main(argv + ["--summary"]) == 0  # the failed run is tried again
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in recs] == ["failed", "ok"]


def test_a_record_after_a_line_cut_short_is_kept(tmp_path):
    """A kill mid-write leaves an unfinished line: the next record starts on its own line,
    so only the cut run is lost (and rerun)."""
    out = tmp_path / "r.jsonl"
    uci.append_record(out, {"split": 0})
    with out.open("a") as fh:
        fh.write('{"split": 1, "metr')  # killed here
    uci.append_record(out, {"split": 2})
    assert [r["split"] for r in uci.read_records(out)] == [0, 2]


def test_summary_counts_each_split_once():
    """A split recorded twice (a failed run then its rerun, or two processes on one file)
    counts once, with its last record."""
    def rec(split, loglik, status="ok"):
        return {"dataset": "boston", "layers": 2, "model": "DGP 2", "guide": "meanfield",
                "objective": "auto", "split": split, "status": status,
                "settings": {"steps": 5, "batch_size_used": 455, "inducing_used": 100,
                             "samples": 100},
                "metrics": {"test_loglik": loglik, "rmse": 3.0, "crps": 1.5, "coverage95": 0.9},
                "seconds_per_step": 0.1, "data": {"num_splits": 20}}

    table = uci.summarize([rec(0, 0.0, "failed"), rec(0, -2.0), rec(1, -3.0), rec(1, -3.0)])
    row = table.splitlines()[-1]
    assert "| 2/20 |" in row and "-2.50(0.50)" in row and "diverged" not in row


def test_runs_with_other_draws_per_step_are_summarised_apart():
    def rec(split, particles):
        settings = {"steps": 5, "batch_size_used": 455, "inducing_used": 100, "samples": 100}
        if particles is not None:
            settings["particles"] = particles
        return {"dataset": "boston", "layers": 2, "model": "DGP 2", "guide": "meanfield",
                "objective": "auto", "split": split, "status": "ok", "settings": settings,
                "metrics": {"test_loglik": -2.0, "rmse": 3.0, "crps": 1.5, "coverage95": 0.9},
                "seconds_per_step": 0.1, "data": {"num_splits": 20}}

    groups = uci.group_by_configuration([rec(0, None), rec(0, 10), rec(1, 1)])
    assert sorted(len(v) for v in groups.values()) == [1, 2]  # no key: 1 draw
    rows = uci.summarize([rec(0, None), rec(0, 10)]).splitlines()[2:]
    assert len(rows) == 2 and sum("10 draws/step" in r for r in rows) == 1


def test_runs_of_another_width_are_summarised_and_recorded_apart(monkeypatch):
    """A width asked for (``--hidden-dim``) is a setting of the run's summary record: the
    same runs at the builder's default width are another configuration."""
    def rec(split, hidden):
        settings = {"steps": 5, "batch_size_used": 455, "inducing_used": 100, "samples": 100,
                    "hidden_dim": hidden}
        return {"dataset": "boston", "layers": 2, "model": "DGP 2", "guide": "meanfield",
                "objective": "auto", "split": split, "status": "ok", "settings": settings,
                "metrics": {"test_loglik": -2.0, "rmse": 3.0, "crps": 1.5, "coverage95": 0.9},
                "seconds_per_step": 0.1, "data": {"num_splits": 20}}

    runs = [rec(0, None), rec(0, 10), rec(1, 10)]
    assert sorted(len(v) for v in uci.group_by_configuration(runs).values()) == [1, 2]
    rows = uci.summarize(runs).splitlines()[2:]
    assert len(rows) == 2 and sum("width 10" in r for r in rows) == 1
    recorded = []
    monkeypatch.setattr(uci.results, "record", lambda name, settings, figures:
                        recorded.append(settings))
    uci.record_summary(runs)
    assert sorted(str(s.get("hidden_dim")) for s in recorded) == ["10", "None"]


@needs_data
def test_exact_gp_control_runs_and_appends_its_table(tmp_path, capsys):
    """benchmarks/exact_gp.py (the exact-GP control of a split) on a tiny setting."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "exact_gp.py"
    spec = importlib.util.spec_from_file_location("exact_gp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = tmp_path / "BENCHMARKS.md"
    assert module.main(["--dataset", "boston", "--splits", "0", "1", "--steps", "3",
                        "--threads", "1", "--append", str(report)]) == 0
    printed = capsys.readouterr().out
    text = report.read_text()
    assert "## Exact-GP control: boston" in text and "--splits 0 1 --steps 3" in text
    rows = [line for line in text.splitlines() if line.startswith("| 0 |")
            or line.startswith("| 1 |")]
    assert len(rows) == 2 and "| mean (se) |" in printed
    lls = [float(r.split("|")[2]) for r in rows]
    assert all(-10 < v < 0 for v in lls)  # boston in original units: a few nats per point


@needs_data
def test_alpha_benchmark_runs_and_names_each_alpha(tmp_path, capsys):
    import alpha

    out = tmp_path / "a.jsonl"
    assert alpha.main(["--datasets", "boston", "--splits", "1", "--steps", "2", "--alphas",
                       "1e-3", "1.0", "--guides", "meanfield", "--alpha-samples", "3",
                       "--out", str(out), "--no-record", "--quiet"]) == 0
    table = capsys.readouterr().out
    # the guide is labelled with its start (the package's defaults) and the objective
    assert "meanfield (package), alpha=0.001,S=3" in table
    assert "meanfield (package), alpha=1,S=3" in table


@needs_data
def test_init_option_builds_that_initialisation_and_records_it(tmp_path):
    import inits

    out = tmp_path / "r.jsonl"
    assert uci.main(["--datasets", "boston", "--layers", "2", "--splits", "1", "--steps", "2",
                     "--init", "gpytorch", "--inducing", "10", "--out", str(out),
                     "--no-record", "--quiet"]) == 0
    rec = uci.read_records(out)[0]
    assert rec["settings"]["init"] == "gpytorch"
    knobs = inits.resolve("gpytorch")
    assert knobs["noise_variance"] == 0.693 and knobs["inner_variance"] == 1.0
    assert knobs["train_mean"] and knobs["ard"] and knobs["lr_decay"] == 1.0
    with pytest.raises(SystemExit):
        uci.main(["--init", "nonsense"])
