"""benchmarks/block_drift.py: what a growing network's readout answers over its block's features now and
over the features its samples had when their experience ended (generated MNIST-format data)."""
import json

import numpy as np
import pytest

from conftest import benchmark

pytest.importorskip("torch")


def test_the_probes_measure_what_the_run_evaluates_and_the_fixed_features_do_not_move(tmp_path):
    bd = benchmark("block_drift")
    doc = bd.main(["--preset", "smoke", "--out", str(tmp_path), "--no-progress"])
    assert json.loads((tmp_path / "block_drift.json").read_text())["summary"] == doc["summary"]
    assert (tmp_path / "block_drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["config"]["split"] == "validation" and {r["method"] for r in doc["runs"]} == {
        "net:replay_dct", "net:readout_replay_dct"}
    for run in doc["runs"]:
        assert run["within_budget"]
        recs = [r for r in doc["records"] if (r["method"], r["seed"]) == (run["method"], run["seed"])]
        assert [r["after"] for r in recs] == list(range(len(run["accuracy_matrix"])))
        for r in recs:
            # the probes' accuracy over the current features is the run's own evaluation (FastLoop.eval, the
            # learner's predict) of the same held-out samples after the same experience
            assert [p["acc_now"] for p in r["probes"]] == pytest.approx(run["accuracy_matrix"][r["after"]][:r["after"] + 1],
                                                                       abs=1e-6)
            own = r["probes"][-1]           # the experience just learned: its features are those of its time
            assert own["experience"] == r["after"] and own["drift"] == 0 and own["acc_stale"] == own["acc_now"]
            for layer, rows in r["rows_by_experience"].items():
                assert len(rows) == r["after"] + 1 and min(rows) >= 0, (layer, rows)
            for layer, rows in r["rows_by_class_experience"].items():   # rows of each experience's classes
                assert len(rows) == r["after"] + 1 and sum(rows) <= sum(r["rows_by_experience"][layer]), (layer, rows)
    block = [p for r in doc["records"] if r["method"] == "net:replay_dct" for p in r["probes"][:-1]]
    fixed = [p for r in doc["records"] if r["method"] == "net:readout_replay_dct" for p in r["probes"][:-1]]
    assert block and fixed
    # the block learns on: the readout's queries of earlier samples move; the readout alone reads fixed DCT keys
    assert max(p["drift"] for p in block) > 0.01
    assert all(p["drift"] == 0 and p["acc_stale"] == p["acc_now"] for p in fixed)
    s = doc["summary"]["net:readout_replay_dct"]
    assert s["drift_old_mean"] == 0 and s["acc_stale_old_mean"] == s["acc_now_old_mean"]
    assert set(doc["summary"]["net:replay_dct"]) >= {"rows_block_0_by_experience", "rows_readout_by_experience",
                                                      "rows_readout_by_class_experience"}
    assert any(r["rows_by_class_experience"] for r in doc["records"] if r["method"] == "net:replay_dct")
    old = np.mean([p["acc_now"] for r in doc["records"] if r["method"] == "net:replay_dct" and r["after"] == 4
                   for p in r["probes"][:-1]])
    assert doc["summary"]["net:replay_dct"]["acc_now_old_mean"] == pytest.approx(old)


def test_an_unknown_method_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match="knn:dct"):
        benchmark("block_drift").main(["--preset", "smoke", "--out", str(tmp_path), "--methods", "knn:dct"])
    assert not any(tmp_path.iterdir())
