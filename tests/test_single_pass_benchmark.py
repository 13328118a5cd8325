"""benchmarks/single_pass.py on its smoke preset: the fp32 and capped runs end to end, then a
--merge of the gauge run into the same JSON (no timing assertions: the machine may be busy)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(out, runs, *extra):
    args = [sys.executable, str(ROOT / "benchmarks" / "single_pass.py"), "--preset", "smoke", "--runs", runs,
            "--out", str(out), *extra]
    res = subprocess.run(args, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout, json.loads((out / "single_pass.json").read_text())


def _run_here(out, runs, *extra):
    """The benchmark's ``main`` in this interpreter (an interpreter's start and imports cost more than a smoke
    run): for the merging invocations after a first one run as a command."""
    from conftest import benchmark

    benchmark("single_pass").main(["--preset", "smoke", "--runs", runs, "--out", str(out), *extra])
    return json.loads((out / "single_pass.json").read_text())


def test_single_pass_smoke_writes_the_floor_the_capped_ratio_and_merges_runs(tmp_path):
    out, doc = _run(tmp_path, "weighted_softmax,capped")
    s = doc["summary"]
    for key in ("wall_s", "accuracy", "floor_s", "ratio_to_floor", "cores_used", "sys_fraction",
                "minor_faults_per_step"):
        assert isinstance(s[key], float) and math.isfinite(s[key]) and s[key] >= 0, (key, s.get(key))
    assert 0 < s["accuracy"] <= 1 and s["floor_s"] > 0
    # the ratio is the wall time over the floor the same run computed (not a constant)
    assert math.isclose(s["ratio_to_floor"], s["wall_s"] / s["floor_s"], rel_tol=1e-9)
    # the compute floor: the final step's flops from the rows each layer holds (d = 784, 10 classes; the
    # first block's rows are read once, by the forward pass, the others twice), at the measured matmul rate
    run = next(r for r in doc["runs"] if r.get("label") == "weighted_softmax fp32")
    rows, b = run["rows"], run["batch"]
    d_out = {name: (10 if name == "readout" else 784) for name in rows}
    want = sum(n * 2 * b * (784 + d_out[name]) * (1 if name == "block_0" else 2) for name, n in rows.items())
    assert math.isclose(run["records"][-1]["step_flops"], want, rel_tol=1e-9), (run["records"][-1], want)
    assert s["compute_floor_s"] > 0 and s["matmul_gflops_per_s"] > 0
    assert max(s["floor_s"], s["compute_floor_s"]) <= s["roofline_floor_s"] * (1 + 1e-9)
    assert s["roofline_floor_s"] <= (s["floor_s"] + s["compute_floor_s"]) * (1 + 1e-9)
    assert math.isclose(s["ratio_to_roofline"], s["wall_s"] / s["roofline_floor_s"], rel_tol=1e-9)
    c = s["capped"]
    assert c["cap"] == 256 and c["ms_per_step"] > 0 and c["uncapped_ms_per_step_same_rows"] > 0
    assert math.isclose(c["ratio"], c["ms_per_step"] / c["uncapped_ms_per_step_same_rows"], rel_tol=1e-9)
    assert "ratio to floor" in out and "capped at 256" in out
    png = tmp_path / "single_pass.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    merged = _run_here(tmp_path, "gauge", "--merge")
    m = merged["summary"]
    assert m["wall_s"] == s["wall_s"] and m["capped"] == c            # the first invocation's runs are kept
    assert 0 < m["gauge"]["accuracy"] <= 1 and m["gauge"]["wall_s"] > 0
    assert [i["runs"] for i in merged["invocations"]] == [["weighted_softmax", "capped"], ["gauge"]]

    # the indexed pass (issue 31): the same preset read through an inverted-file index, merged in
    merged = _run_here(tmp_path, "indexed", "--merge")
    ix = merged["summary"]["indexed"]
    assert 0 < ix["accuracy"] <= 1 and ix["wall_s"] > 0 and ix["index"] == {"n_lists": 8, "nprobe": 2, "train_at": 128}
    assert merged["summary"]["gauge"] == m["gauge"]
    assert ix["indexed_rows"] == ix["rows"] and min(ix["rows"].values()) > 128     # every row in a list


def test_an_unknown_run_is_one_line_naming_the_runs(tmp_path):
    args = [sys.executable, str(ROOT / "benchmarks" / "single_pass.py"), "--preset", "smoke", "--runs", "bogus",
            "--out", str(tmp_path)]
    res = subprocess.run(args, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode != 0 and "unknown runs ['bogus']" in res.stderr and "indexed" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "single_pass.json").exists()
