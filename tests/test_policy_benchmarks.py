"""Smoke runs of the policy benchmarks (tiny presets; no timing assertions)."""
import json


def _main(name):
    from conftest import benchmark
    return benchmark(name).main


def _read(out, name):
    doc = json.loads((out / f"{name}.json").read_text())
    assert (out / f"{name}.png").stat().st_size > 0
    assert doc["preset"] == "smoke"
    return doc["summary"]


def test_hybrid_growth_smoke(tmp_path):
    _main("hybrid_growth")(["--preset", "smoke", "--out", str(tmp_path)])
    s = _read(tmp_path, "hybrid_growth")
    assert 0 <= s["full_growth_accuracy"] <= 1
    assert s["points"] and set(s["points"][0]) == {"tau", "capacity_fraction", "accuracy"}
    assert all(0 < p["capacity_fraction"] <= 1 for p in s["points"])


def test_decay_bounded_smoke(tmp_path):
    _main("decay_bounded")(["--preset", "smoke", "--out", str(tmp_path)])
    s = _read(tmp_path, "decay_bounded")
    assert 0 < s["rows_at_half"] and 0 < s["rows_at_end"]


def test_novelty_search_smoke(tmp_path):
    _main("novelty_search")(["--preset", "smoke", "--out", str(tmp_path)])
    s = _read(tmp_path, "novelty_search")
    assert s["ratio"] > 0 and s["shapes"]["B"] == 16
