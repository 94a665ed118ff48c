"""Benchmark results as JSON lines, and BENCHMARKS.md generated from them."""

import json
from pathlib import Path

import report
import results

ROOT = Path(__file__).resolve().parents[1]


def test_record_appends_one_line_with_its_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    results.record("toy", {"n": 1}, {"ms": 2.5}, command="python benchmarks/toy.py --n 1")
    results.record("toy", {"n": 2}, {"ms": 3.5}, command="python benchmarks/toy.py --n 2")
    lines = (tmp_path / "toy.jsonl").read_text().splitlines()
    assert len(lines) == 2
    rec = json.loads(lines[0])
    assert {"benchmark", "date", "command", "machine", "commit", "settings", "figures"} <= set(rec)
    assert rec["figures"] == {"ms": 2.5} and rec["machine"]["cores"]
    assert [r["settings"]["n"] for r in results.read("toy", tmp_path)] == [1, 2]


def test_report_shows_the_latest_record_of_each_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    results.record("toy", {"n": 1}, {"ms": 9.0}, command="first")
    results.record("toy", {"n": 1}, {"ms": 2.0}, command="second")
    out = tmp_path / "BENCHMARKS.md"
    assert report.main(["--output", str(out)]) == 0
    text = out.read_text()
    assert "| 1 | 2 |" in text and "| 1 | 9 |" not in text and "`second`" in text
    assert report.main(["--output", str(out), "--check"]) == 0
    results.record("toy", {"n": 3}, {"ms": 1.0}, command="third")
    assert report.main(["--output", str(out), "--check"]) == 1


def test_benchmarks_md_is_generated_from_the_recorded_results(monkeypatch):
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(ROOT / "benchmarks" / "results"))
    assert report.main(["--check"]) == 0, "run python benchmarks/report.py"
