"""Benchmark results as JSON lines (benchmarks/results.py), and BENCHMARKS.md generated from
them (benchmarks/report.py)."""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts are not an installed package

import report  # noqa: E402
import results  # noqa: E402

FIELDS = {"benchmark", "command", "machine", "date", "session", "commit", "dirty", "settings",
          "figures"}


def test_record_appends_one_line_per_call_and_reads_back(tmp_path):
    first = results.record("toy", {"n": 1}, {"ms": 2.5}, command="python benchmarks/toy.py --n 1",
                           results_dir=tmp_path)
    results.record("toy", {"n": 2}, {"ms": {"ours": 3.5}}, command=["python", "toy.py", "a b"],
                   results_dir=tmp_path)
    lines = (tmp_path / "toy.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == first
    assert FIELDS <= set(first)
    assert first["benchmark"] == "toy" and first["session"] is None
    assert first["machine"]["cores"] and first["machine"]["host"] is not None
    assert {"arch", "cpu", "python"} <= set(first["machine"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", first["date"])
    assert first["dirty"] in (True, False, None)
    back = results.read("toy", tmp_path)
    assert [r["settings"]["n"] for r in back] == [1, 2]
    assert back[1]["figures"] == {"ms": {"ours": 3.5}}
    assert back[1]["command"] == "python toy.py 'a b'"
    assert results.read("absent", tmp_path) == []


def test_record_defaults_to_this_command_line_and_the_environment_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["benchmarks/toy.py", "--steps", "3"])
    rec = results.record("toy", {"n": 1}, {"ms": 1.0})
    assert rec["command"].startswith("python ") and rec["command"].endswith("toy.py --steps 3")
    assert results.read("toy") == [rec]


def _write(directory: Path, name: str, records: list[dict]) -> None:
    with open(directory / f"{name}.jsonl", "a") as fh:
        for rec in records:
            fh.write(json.dumps({"benchmark": name, "machine": None, "commit": None, **rec}) + "\n")


def test_report_shows_the_latest_record_of_each_configuration(tmp_path):
    results.record("toy", {"n": 1}, {"ms": 9.0}, command="first", results_dir=tmp_path)
    results.record("toy", {"n": 1}, {"ms": 2.0}, command="second", results_dir=tmp_path)
    results.record("toy", {"n": 2}, {"ms": 7.0}, command="third", results_dir=tmp_path)
    out = tmp_path / "BENCHMARKS.md"
    args = ["--output", str(out), "--results-dir", str(tmp_path)]
    assert report.main(args) == 0
    text = out.read_text()
    assert "| 1 | 2.0 |" in text and "| 2 | 7.0 |" in text and "| 9.0 |" not in text
    assert "`second`" in text and "`first`" not in text
    assert "history.md" in text and "report.py" in text


def test_latest_is_by_date_then_session_then_file_order(tmp_path):
    _write(tmp_path, "toy", [
        {"date": "2026-01-02", "session": 1, "settings": {"n": 1}, "figures": {"ms": 1.5},
         "command": "a"},
        {"date": "2026-01-01", "session": 9, "settings": {"n": 1}, "figures": {"ms": 2.5},
         "command": "b"},
        {"date": "2026-01-01", "session": 3, "settings": {"n": 2}, "figures": {"ms": 3.5},
         "command": "c"},
        {"date": "2026-01-01", "session": 2, "settings": {"n": 2}, "figures": {"ms": 4.5},
         "command": "d"},
    ])
    latest = report.latest_per_configuration(results.read("toy", tmp_path))
    assert sorted(r["command"] for r in latest) == ["a", "c"]


def test_check_detects_a_stale_file(tmp_path):
    results.record("toy", {"n": 1}, {"ms": 2.0}, command="first", results_dir=tmp_path)
    out = tmp_path / "BENCHMARKS.md"
    args = ["--output", str(out), "--results-dir", str(tmp_path)]
    assert report.main([*args, "--check"]) == 1  # not written yet
    assert report.main(args) == 0
    assert report.main([*args, "--check"]) == 0
    results.record("toy", {"n": 1}, {"ms": 1.0}, command="second", results_dir=tmp_path)
    assert report.main([*args, "--check"]) == 1
    assert report.main(args) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert report.main([*args, "--check"]) == 1


def test_published_figures_stand_in_their_own_column(tmp_path):
    settings = {"dataset": "boston", "model": "DGP 2", "guide": "meanfield", "steps": 10}
    results.record("uci", settings, {"splits": 1, "test_loglik": -2.2}, command="x",
                   results_dir=tmp_path)
    text = report.render(tmp_path)
    header = next(line for line in text.splitlines() if line.startswith("| "))
    assert f"published log-lik / RMSE ({report.SALIMBENI})" in header
    assert "| -2.47 (0.05) / 2.90 (0.17) |" in text


def test_records_copied_from_the_log_point_at_their_figures():
    lines = (RESULTS / "history.md").read_text().splitlines()
    copied = [r for path in sorted(RESULTS.glob("*.jsonl"))
              for r in results.read(path.stem, RESULTS) if r.get("source") == "history.md"]
    assert copied
    for rec in copied:
        assert FIELDS <= set(rec)
        line = lines[rec["source_line"] - 1]
        numbers = {float(t) for t in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", line)}
        values = [v for v in report.flatten(rec["figures"]).values() if isinstance(v, float)]
        assert any(v in numbers for v in values), (rec["source_line"], rec["settings"])


def test_benchmarks_md_is_generated_from_the_recorded_results():
    assert report.main(["--check", "--results-dir", str(RESULTS)]) == 0, (
        "BENCHMARKS.md is stale: run python benchmarks/report.py")


def test_alpha_summary_puts_the_alphas_side_by_side_and_marks_the_best():
    def rec(dataset, alpha, loglik, steps=5000, splits=3):
        return {"settings": {"dataset": dataset, "guide": "meanfield", "steps": steps,
                             "model": "DGP 2", "objective": f"alpha={alpha},S=10"},
                "figures": {"splits": splits, "test_loglik": loglik, "test_loglik_se": 0.01,
                            "rmse": 0.5}}
    records = [rec("b", 0.5, -1.0), rec("b", 1, -1.2), rec("a", 0.001, 2.0), rec("a", 1, 2.5),
               rec("a", 0.5, 9.0, steps=1000), rec("a", 0.5, 9.0, splits=2),
               {"settings": {"dataset": "a", "guide": "meanfield", "steps": 5000,
                             "objective": "elbo"}, "figures": {"splits": 3, "test_loglik": 9.0}}]
    lines = report.alpha_summary(records)
    assert lines[2] == "| dataset | guide | alpha 0.001 | alpha 0.5 | alpha 1.0 |"
    assert lines[4] == "| a | meanfield | 2.000 (0.010) / 0.5 |  | **2.500 (0.010) / 0.5** |"
    assert lines[5] == "| b | meanfield |  | **-1.000 (0.010) / 0.5** | -1.200 (0.010) / 0.5 |"
    assert len(lines) == 7 and lines[-1] == ""
    assert report.alpha_summary(records[4:]) == []


def test_graph_summary_lines_up_the_replayed_steps_of_the_gpu_rows():
    def rec(L, B, device="cuda", **ms):
        return {"settings": {"num_layers": L, "batch_size": B, "dtype": "float64",
                             "num_inducing": 128, "hidden_dim": 8, "device": device},
                "figures": {"ms_per_step": ms}}
    records = [rec(3, 10000, ours=24.0, graph=3.6, **{"plain-graph": 3.0}, gpytorch=36.0),
               rec(2, 1024, ours=16.0, graph=2.0),
               rec(2, 1024, device="cpu", ours=9.0, graph=1.0), rec(3, 1024, ours=20.0)]
    lines = report.graph_summary(records)
    assert lines[4] == "| 2 | 128 | 8 | 1024 | float64 | 16.0 | 2.0 |  |  |  |  |"
    assert lines[5] == "| 3 | 128 | 8 | 10000 | float64 | 24.0 | 3.6 | 3.0 | 36.0 | 1.20 | 0.10 |"
    assert len(lines) == 7 and lines[-1] == ""
    assert report.graph_summary(records[2:]) == []
