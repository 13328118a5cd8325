"""The frontier's protocol: online experience replay (its buffers, bytes and batches), the budget-sized
recipe, and the frontier benchmark end to end on generated data."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import benchmark

torch = pytest.importorskip("torch")

from growmem.continual import baselines as B  # noqa: E402
from growmem.continual import methods  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = 0.1307, 0.3081


def _frontier():
    return benchmark("continual_frontier")


def _pixels(rng, n, d=784):
    p = rng.integers(0, 256, size=(n, d))
    return p, torch.from_numpy(((p / 255.0 - MEAN) / STD).astype(np.float32))


def _feed(plugin, x, y, batch=10):
    """Drive the plugin as Avalanche's template does: before_forward, then after_training_iteration."""
    seen = []
    for a in range(0, len(y), batch):
        s = SimpleNamespace(mbatch=[x[a:a + batch], torch.as_tensor(y[a:a + batch]), torch.zeros(len(y[a:a + batch]),
                                                                                              dtype=torch.int64)])
        plugin.before_forward(s)
        seen.append(s.mbatch)
        plugin.after_training_iteration(s)
    return seen


def test_reservoir_keeps_each_stream_sample_with_equal_probability():
    """Vitter's reservoir: after n samples each one is in the buffer with probability m/n — counted over
    400 streams (a binomial check, 5 standard deviations)."""
    n, m, runs = 200, 20, 400
    x = torch.zeros((n, 4))
    hits = np.zeros(n)
    for r in range(runs):
        p = B.OnlineReplay(m, 5, "reservoir", n, seed=r, codes=None, normalize=(0.0, 1.0 / 255))
        _feed(p, x, np.arange(n))                    # every sample its own class: the labels are the ids
        assert p.size == m and p.seen == n
        hits[p.y[:p.size]] += 1
    freq = hits / runs
    sd = np.sqrt((m / n) * (1 - m / n) / runs)
    assert np.all(np.abs(freq - m / n) < 5 * sd), (freq.min(), freq.max())


def test_class_balanced_reservoir_ends_balanced_and_never_evicts_a_smaller_class():
    rng = np.random.default_rng(3)
    y = np.r_[np.zeros(600, int), np.ones(150, int), np.full(60, 2)]
    _, x = _pixels(rng, len(y), d=16)
    p = B.OnlineReplay(90, 10, "balanced", 3, seed=1)
    sizes = []
    for a in range(0, len(y), 10):
        _feed(p, x[a:a + 10], y[a:a + 10])
        sizes.append(np.bincount(p.y[:p.size], minlength=3))
    assert p.size == 90
    assert np.bincount(p.y, minlength=3).tolist() == [30, 30, 30]
    # while class 1 streams in, class 0 only shrinks and class 1 only grows
    during = np.array(sizes[60:75])
    assert np.all(np.diff(during[:, 0]) <= 0) and np.all(np.diff(during[:, 1]) >= 0)


def test_replay_batches_hold_the_stream_then_buffer_samples_decoded_exactly_and_bytes_count_what_is_stored():
    rng = np.random.default_rng(4)
    pix, x = _pixels(rng, 60)
    y = rng.integers(0, 10, 60)
    p = B.OnlineReplay(25, 7, "reservoir", 10, seed=0)
    batches = _feed(p, x, y)
    assert len(batches[0][0]) == 10                                   # an empty buffer adds nothing
    for xb, yb, tb in batches[1:]:
        assert len(xb) == len(yb) == len(tb) == 17
        # the replayed rows are stream samples, decoded from their 8-bit pixels to the stream's inputs
        for row, label in zip(xb[10:], yb[10:]):
            i = int(np.argmin(((x - row) ** 2).sum(1)))
            assert torch.allclose(row, x[i], atol=1e-5) and int(y[i]) == int(label)
    assert p.x.dtype == np.uint8 and p.nbytes() == 25 * (784 + 1)
    assert {tuple(r) for r in p.x.tolist()} <= {tuple(r) for r in pix.tolist()}


def test_dct_codes_are_stored_in_bfloat16_and_counted_as_such():
    rng = np.random.default_rng(5)
    _, x = _pixels(rng, 30)
    y = rng.integers(0, 10, 30)
    codes = B.er_codes("er_balanced:dct", 784)
    p = B.OnlineReplay(12, 4, "balanced", 10, seed=0, codes=codes)
    batches = _feed(p, x, y)
    want = torch.from_numpy(np.asarray(codes.prepare(x.numpy()), np.float32) * np.float32(np.sqrt(codes.key_dim)))
    assert batches[0][0].shape == (10, codes.key_dim)
    torch.testing.assert_close(batches[0][0], want[:10])
    assert p.x.dtype == np.int16 and p.nbytes() == 12 * (2 * codes.key_dim + 1)
    stored = torch.from_numpy(p.x).view(torch.bfloat16).float()
    assert all(torch.isclose(stored[i], want.to(torch.bfloat16).float()).all(1).any() for i in range(12))


def test_the_budget_sizes_the_width_and_the_buffer_and_names_say_what_is_stored():
    assert B.er_width(1_000_000, 784, 10) == 128            # 784·128 + ... float32 ≤ 0.5 MB; 256 would not fit
    assert 4 * (784 * 128 + 128 + 1290 + 10) <= 500_000 < 4 * (784 * 256 + 256 + 2570 + 10)
    assert B.er_width(100_000, 100, 10) == 64
    with pytest.raises(ValueError, match="raise --memory-budget"):
        B.er_width(10_000, 784, 10)
    m = methods.resolve("er_balanced:dct")
    assert (m.kind, m.family) == ("avalanche", "er") and "class-balanced" in m.description and "DCT" in m.description
    assert "er_reservoir:raw" in methods.valid_methods()
    from growmem.continual.budgets import baseline_settings_for
    stream = SimpleNamespace(name="split_mnist", input_size=784, n_classes=10, task_incremental=False)
    s = baseline_settings_for(methods.resolve("er_reservoir:raw"), stream, {}, 1_000_000, 785)
    model = 4 * (784 * 128 + 128 + 128 * 10 + 10)                      # SGD without momentum: no optimizer state
    assert s["hidden_size"] == 128 and s["mem_size"] == (1_000_000 - model) // 785


def test_budget_matched_replay_and_gdumb_narrow_their_model_to_half_the_budget():
    """replay_bytes / gdumb_bytes keep the recipe's width where model and state fit half the budget, else the
    widest of 512, 256, ... that does; the buffer is the rest (sizes by hand: SimpleMLP 784-h-h-10 with
    biases and SGD momentum; GDumbMLP 784-h-h-10 bias-free with batch norm, momentum and GDumb's init copy)."""
    from growmem.continual.budgets import baseline_settings_for
    stream = SimpleNamespace(name="split_mnist", input_size=784, n_classes=10, task_incremental=False)

    def simple(h):
        return 2 * 4 * (784 * h + h + h * h + h + 10 * h + 10)

    def gdumb(h):
        bn = lambda n: 4 * 4 * n + 8                     # weight, bias, running mean and variance; the step count
        return 3 * (4 * (784 * h + h * h + 10 * h) + 2 * bn(h) + bn(10))

    assert simple(400) <= 7_850_000 and simple(128) > 500_000 >= simple(64)
    s = baseline_settings_for(methods.resolve("replay_bytes"), stream, {}, 15_700_000, 785)
    assert "hidden_size" not in s and s["mem_size"] == (15_700_000 - simple(400)) // 785   # the recipe, as before
    s = baseline_settings_for(methods.resolve("replay_bytes"), stream, {}, 1_000_000, 785)
    assert s["hidden_size"] == 64 and s["mem_size"] == (1_000_000 - simple(64)) // 785
    assert gdumb(64) > 500_000 >= gdumb(32)
    m = methods.resolve("gdumb_bytes")
    assert (m.kind, m.family) == ("avalanche", "gdumb") and "budget" in m.description
    s = baseline_settings_for(m, stream, {}, 1_000_000, 785)
    assert s["hidden_size"] == 32 and s["mem_size"] == (1_000_000 - gdumb(32)) // 785
    assert B.recipe("gdumb_bytes", "split_mnist")["epochs"] == B.recipe("gdumb", "split_mnist")["epochs"] == 128
    s = baseline_settings_for(m, stream, {"hidden_size": 16}, 1_000_000, 785)    # a width asked for is kept
    assert s["hidden_size"] == 16 and s["mem_size"] == (1_000_000 - gdumb(16)) // 785
    with pytest.raises(ValueError, match="gdumb_bytes needs a memory budget"):
        baseline_settings_for(m, stream, {}, None, 785)
    # the API without the runner: a buffer-sized strategy built without its buffer size says the same
    for name in ("replay_bytes", "gdumb_bytes", "er_reservoir:raw"):
        with pytest.raises(ValueError, match=f"^{name} needs a memory budget"):
            B.make_baseline(name, stream, seed=0, evaluator=None)
    with pytest.raises(ValueError, match="raise --memory-budget"):
        baseline_settings_for(m, stream, {}, 20_000, 785)


def test_frontier_smoke_runs_both_protocol_parts_and_combines_runs_made_apart(tmp_path, capsys):
    """The script runs as a command (part a); the other parts call its ``main`` in this interpreter (an
    interpreter's start and imports cost more than the smoke runs)."""
    args = ["--preset", "smoke", "--streams", "split_mnist", "--methods", "target:dct_merge,er_balanced:dct",
            "--budgets", "0.2MB"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "continual_frontier.py"), *args]
    proc = subprocess.run(cmd + ["--seeds", "1,2", "--out", str(tmp_path / "a")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cf = _frontier()
    cf.main(args + ["--seeds", "3", "--out", str(tmp_path / "b")])
    doc = json.loads((tmp_path / "a" / "continual_frontier.json").read_text())
    rows = doc["summary"]["split_mnist"]["200000"]
    assert set(rows) == {"target:dct_merge", "er_balanced:dct"} and doc["protocol"] == "online"
    for r in rows.values():
        assert r["seeds"] == [1, 2] and r["within_budget"] and 0 < r["bytes_peak"] <= 200_000
        assert np.mean(r["accuracy_values"]) == pytest.approx(r["accuracy_mean"])
    v = doc["verdicts"]["split_mnist"]["200000"]
    assert (v["growmem"], v["other"], v["seeds"]) == ("target:dct_merge", "er_balanced:dct", [1, 2])
    from scipy import stats                                         # the verdict, computed independently
    a, b = rows["target:dct_merge"]["accuracy_values"], rows["er_balanced:dct"]["accuracy_values"]
    d = np.subtract(a, b)
    assert v["difference"] == pytest.approx(d.mean())
    sig = d.std(ddof=1) == 0 and d.mean() != 0 or (d.std(ddof=1) > 0 and stats.ttest_rel(a, b).pvalue < 0.05)
    assert v["verdict"] == ("tie" if not sig else "better" if d.mean() > 0 else "worse")
    runs = [r for r in doc["runs"] if r["method"] == "target:dct_merge"]
    assert all(r["protocol"] == "online" and r["budget"] == 200_000 for r in runs)
    assert all(r["config"]["batch_size"] == 10 and r["config"]["epochs"] == 1 for r in runs)
    from growmem.reporting import host
    assert all(r["host"] == host() for r in doc["runs"])        # each run says which CPU it ran on
    assert (tmp_path / "a" / "continual_frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cf.main(args + ["--out", str(tmp_path / "c"), "--combine", str(tmp_path / "a" / "continual_frontier.json"),
                    str(tmp_path / "b" / "continual_frontier.json")])
    both = json.loads((tmp_path / "c" / "continual_frontier.json").read_text())
    assert both["summary"]["split_mnist"]["200000"]["er_balanced:dct"]["seeds"] == [1, 2, 3]
    assert len(both["invocations"]) == 3
    # combining a file whose runs are already in: its history is not repeated, only this invocation added
    cf.main(args + ["--out", str(tmp_path / "c"), "--combine", str(tmp_path / "a" / "continual_frontier.json")])
    again = json.loads((tmp_path / "c" / "continual_frontier.json").read_text())
    assert [i["command"] for i in again["invocations"][:3]] == [i["command"] for i in both["invocations"]]
    assert len(again["invocations"]) == 4 and again["summary"] == both["summary"]
    # the offline protocol merged beside the online runs: its own table and verdicts, the online ones untouched
    before = json.loads((tmp_path / "b" / "continual_frontier.json").read_text())
    capsys.readouterr()
    cf.main(["--preset", "smoke", "--streams", "split_mnist", "--protocol", "offline", "--budgets", "0.2MB", "--seeds",
             "3", "--merge", "--out", str(tmp_path / "b")])
    stdout = capsys.readouterr().out
    doc = json.loads((tmp_path / "b" / "continual_frontier.json").read_text())
    assert doc["summary"] == before["summary"] and doc["verdicts"] == before["verdicts"]
    rows = doc["offline"]["summary"]["split_mnist"]["200000"]
    assert set(rows) == {"target:dct_merge", "replay_bytes", "gdumb_bytes"}
    assert all(r["within_budget"] and 0 < r["bytes_peak"] <= 200_000 for r in rows.values())
    assert doc["offline"]["verdicts"]["split_mnist"]["200000"]["verdict"] == "untested"      # one seed
    runs = {r["method"]: r for r in doc["runs"] if r["protocol"] == "offline"}
    g = runs["gdumb_bytes"]["config"]
    assert (g["epochs"], g["model"], g["mem_size"]) == (2, "GDumbMLP(8, batch norm)", (200_000 - 3 * 26_104) // 785)
    assert g["hidden_size"] == 8                      # the width recorded as a setting, as the tuning grids name it
    assert runs["target:dct_merge"]["config"]["batch_size"] == 32       # the preset's own batch, not the online 10
    online_target = [r for r in doc["runs"] if r["protocol"] == "online" and r["method"] == "target:dct_merge"]
    assert len(online_target) == 1 and online_target[0]["config"]["batch_size"] == 10
    assert "offline (batch" not in stdout and "split_mnist, offline (epochs per experience)" in stdout
    sys.path.insert(0, str(ROOT / "docs"))
    import render
    text = render.render_continual_frontier(doc)
    assert text.count("**split_mnist**, online") == 1 and text.count("**split_mnist**, offline") == 1
    findings = render.render_frontier_findings(doc)
    assert "`gdumb_bytes`" in text and "split_mnist, offline, 0.20 MB" in findings
    # how many of the preset's methods each row compares: 2 of the 4 online ones ran here, all 3 offline ones
    assert "| 2 of 4 |" in findings.split("split_mnist, online, 0.20 MB")[1].splitlines()[0]
    assert "| 3 of 3 |" in findings.split("split_mnist, offline, 0.20 MB")[1].splitlines()[0]


def test_proj_baselines_store_the_target_proj_merge_presets_keys():
    """``:proj`` baselines (kNN, NCM, SLDA, online replay) store what ``target:proj_merge`` stores: the
    preset's random projections, whatever the pixel order — distances between permuted images are those
    between the images (the same permutation applied to both), up to the projection's distortion."""
    from growmem import config
    from growmem.continual.learner import OrderFreePreset

    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (40, 784)).astype(np.float32)
    space = config.load("target_proj_merge").key_space(784)
    want = np.asarray(space.prepare(x))
    knn = methods.resolve("knn:proj")
    assert knn.family == "knn" and "random projections" in knn.description
    assert {"ncm:proj", "slda:proj", "er_reservoir:proj", "er_balanced:proj"} <= set(methods.valid_methods())
    np.testing.assert_array_equal(np.asarray(OrderFreePreset("knn", "proj").key_space(784).prepare(x)), want)
    np.testing.assert_array_equal(np.asarray(B.er_codes("er_balanced:proj", 784).prepare(x)), want)
    assert B.er_codes("er_balanced:raw", 784) is None
    target = methods.resolve("target:proj_merge")
    assert (target.family, target.preset) == ("target", "target_proj_merge")
    # whatever the order of the pixels: with one permutation applied to both images of a pair, the keys'
    # distance follows the pixels' distance (Johnson-Lindenstrauss), the pairs ranging from near to far
    a = rng.uniform(0, 1, (30, 784)).astype(np.float32)
    b = a + np.linspace(0.02, 2.0, 30, dtype=np.float32)[:, None] * rng.uniform(0, 1, (30, 784)).astype(np.float32)
    unit = lambda v: (v - v.min(1, keepdims=True)) / np.linalg.norm(v - v.min(1, keepdims=True), axis=1, keepdims=True)
    d_pix = np.linalg.norm(unit(a) - unit(b), axis=1)
    perm = rng.permutation(784)
    d_key = np.linalg.norm(np.asarray(space.prepare(a[:, perm])) - np.asarray(space.prepare(b[:, perm])), axis=1)
    assert np.corrcoef(d_pix, d_key)[0, 1] > 0.95
    with pytest.raises(Exception, match="key set"):
        methods.resolve("knn:pca")


def test_tuning_grid_edges_are_judged_per_setting():
    """A chosen value at the smallest or largest value tried for its setting is an edge; the center of a
    one-setting-at-a-time grid is not, whatever its position in the list."""
    cf = _frontier()
    grid = cf._cross({"a": 1.0, "b": 1.0}, a=(0.5, 2.0), b=(0.3, 3.0))
    assert [g["overrides"] for g in grid] == [{"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 1.0}, {"a": 2.0, "b": 1.0},
                                             {"a": 1.0, "b": 0.3}, {"a": 1.0, "b": 3.0}]
    assert cf.on_edge(grid, 0) == []
    assert cf.on_edge(grid, 2) == ["a"] and cf.on_edge(grid, 3) == ["b"]
    line = [{"hidden_size": w} for w in (64, 128, 256)]
    assert cf.on_edge(line, 1) == [] and cf.on_edge(line, 0) == ["hidden_size"]
    assert cf.on_edge([{"overrides": {"k": 3}}], 0) == []          # one value tried: no edge to speak of


def test_tuning_reads_back_the_points_it_already_tried(tmp_path):
    """``--tune --merge``: a second invocation over the same grid runs nothing and chooses the same point."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "continual_frontier.py"), "--preset", "smoke", "--streams",
           "split_mnist", "--methods", "knn:dct", "--budgets", "0.2MB", "--tune", "--merge", "--out", str(tmp_path)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr.count("tune split_mnist knn:dct") == 3
    doc = json.loads((tmp_path / "continual_frontier_tune.json").read_text())
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "tune split_mnist knn:dct" not in second.stderr
    again = json.loads((tmp_path / "continual_frontier_tune.json").read_text())
    entry, before = again["streams"]["split_mnist"]["200000"]["knn:dct"], doc["streams"]["split_mnist"]["200000"]["knn:dct"]
    assert entry["results"] == before["results"] and entry["chosen"] == before["chosen"]
    assert [r["settings"]["overrides"]["k"] for r in entry["results"]] == [1, 3, 5]
    assert len(again["invocations"]) == 2


def test_each_policy_of_the_readout_is_paired_with_the_readout_alone_by_seed():
    """``policy_verdicts``: a variant of the growing readout against the readout alone over their common seeds,
    by the paired t-test at 95 % (scipy's, computed here); a budget without the readout alone has none."""
    from scipy import stats

    cf = _frontier()

    def row(values, seeds):
        return {"accuracy_mean": float(np.mean(values)), "accuracy_values": list(values), "seeds": list(seeds)}

    base = row([0.80, 0.82, 0.81, 0.79], [1, 2, 3, 4])
    merge = row([0.86, 0.85, 0.84], [2, 3, 4])                  # seed 1 not run: paired over 2, 3, 4
    novelty = row([0.81, 0.80, 0.82, 0.78], [1, 2, 3, 4])
    summary = {"split_mnist": {"1000000": {cf.POLICY_BASE: base, "net:readout_replay_dct_merge": merge,
                                           "net:readout_replay_dct_novelty": novelty, "knn:dct": row([0.9], [1])},
                               "300000": {"net:readout_replay_dct_merge": merge}}}
    out = cf.policy_verdicts(summary)
    assert set(out) == {"split_mnist"} and set(out["split_mnist"]) == {"1000000"}
    got = out["split_mnist"]["1000000"]
    assert set(got) == {"net:readout_replay_dct_merge", "net:readout_replay_dct_novelty"}
    for m, (a, b) in {"net:readout_replay_dct_merge": ([0.86, 0.85, 0.84], [0.82, 0.81, 0.79]),
                      "net:readout_replay_dct_novelty": ([0.81, 0.80, 0.82, 0.78], [0.80, 0.82, 0.81, 0.79])}.items():
        d = np.subtract(a, b)
        want = "tie" if stats.ttest_rel(a, b).pvalue >= 0.05 else "better" if d.mean() > 0 else "worse"
        assert got[m]["verdict"] == want and got[m]["other"] == cf.POLICY_BASE, m
        assert got[m]["difference"] == pytest.approx(d.mean()) and len(got[m]["seeds"]) == len(a)
    assert got["net:readout_replay_dct_merge"]["verdict"] == "better"


def test_tuning_reruns_a_growmem_point_tried_on_another_version_of_its_preset(tmp_path, monkeypatch):
    """A tried point is read back only with the preset file's digest it ran on: a changed preset (a policy
    option set in the TOML, not in the point's overrides) reruns the grid instead of reusing stale numbers."""
    import argparse
    import hashlib

    from growmem import config
    from growmem.continual.methods import preset_digest, resolve

    cf = _frontier()
    calls = []

    def fake_run(stream, method, seeds, budget, options, **kw):
        calls.append(kw["settings"])
        return [{"summary": {"acc_mean_over_experiences": 0.5 + 0.01 * len(calls), "bytes_in_use_peak": 1,
                             "within_budget": True}}]

    monkeypatch.setattr(cf, "run_one", fake_run)
    args = argparse.Namespace(out=tmp_path, merge=True, combine=None, protocol="online", methods="target:dct_merge",
                              data_dir=None, preset="smoke")
    m = resolve("target:dct_merge", "split_mnist")
    want = hashlib.sha256(config.resolve(m.preset).read_bytes()).hexdigest()[:16]   # the file's own digest
    assert preset_digest(m) == want and preset_digest(resolve("knn:dct", "split_mnist")) is None
    cf.tune(args, cf.PRESETS["cpu"], ["split_mnist"], [0], [300_000])
    n = len(calls)
    assert n == 5
    cf.tune(args, cf.PRESETS["cpu"], ["split_mnist"], [0], [300_000])          # the same preset: read back
    assert len(calls) == n
    path = tmp_path / "continual_frontier_tune.json"
    doc = json.loads(path.read_text())
    results = doc["streams"]["split_mnist"]["300000"]["target:dct_merge"]["results"]
    assert {r["preset_digest"] for r in results} == {want}
    for r in results:
        r["preset_digest"] = "0" * 16                                             # tried on another version
    path.write_text(json.dumps(doc))
    cf.tune(args, cf.PRESETS["cpu"], ["split_mnist"], [0], [300_000])
    assert len(calls) == 2 * n
    # a point recorded before points named their preset's digest is read back, as the choice and pending count it
    doc = json.loads(path.read_text())
    for r in doc["streams"]["split_mnist"]["300000"]["target:dct_merge"]["results"]:
        del r["preset_digest"]
    path.write_text(json.dumps(doc))
    cf.tune(args, cf.PRESETS["cpu"], ["split_mnist"], [0], [300_000])
    assert len(calls) == 2 * n
    assert not any(p["method"] == "target:dct_merge" and p["budget"] == 300_000
                   for p in json.loads(path.read_text())["pending"])


def test_tuning_files_made_apart_combine_into_one_choice_per_grid(tmp_path):
    """``--tune --combine``: the points of two tuning runs of one grid join, the choice is made again over all
    of them (a top edge in the first file is inside once the second extends the grid), a point tried in both
    is the later file's, other grids are kept, and every invocation is listed once."""
    cf = _frontier()
    pt = lambda n, acc: {"settings": {"overrides": {"keys.n": n}}, "accuracy": acc, "bytes_peak": 1,
                         "within_budget": True}

    def tuning(folder, points, command, others=None):
        folder.mkdir()
        streams = {"split_mnist": {"1000000": {"target:dct_merge": cf._tuned_entry("target:dct_merge", points, 1,
                                                                                   "online"), **(others or {})}}}
        (folder / "continual_frontier_tune.json").write_text(json.dumps(
            {"streams": streams, "invocations": [{"command": command, "seconds": 1.0}]}))
        return folder / "continual_frontier_tune.json"

    knn = {"knn:dct": cf._tuned_entry("knn:dct", [{"settings": {"overrides": {"k": k}}, "accuracy": a, "bytes_peak": 1,
                                                   "within_budget": True} for k, a in ((1, .5), (3, .7), (5, .6))],
                                      1, "online")}
    a = tuning(tmp_path / "a", [pt(8, .90), pt(10, .91), pt(12, .93)], "first", knn)
    first = json.loads(a.read_text())["streams"]["split_mnist"]["1000000"]["target:dct_merge"]
    assert first["chosen"] == {"overrides": {"keys.n": 12}} and first["on_edge"] == ["keys.n"]
    b = tuning(tmp_path / "b", [pt(12, .94), pt(14, .92), pt(16, .91)], "second")
    out = tmp_path / "out"
    out.mkdir()
    assert cf.main(["--preset", "smoke", "--tune", "--out", str(out), "--combine", str(a), str(b)]) is not None
    doc = json.loads((out / "continual_frontier_tune.json").read_text())
    e = doc["streams"]["split_mnist"]["1000000"]["target:dct_merge"]
    assert [(r["settings"]["overrides"]["keys.n"], r["accuracy"]) for r in e["results"]] == \
        [(8, .90), (10, .91), (12, .94), (14, .92), (16, .91)]
    assert e["chosen"] == {"overrides": {"keys.n": 12}} and e["on_edge"] == []
    assert doc["streams"]["split_mnist"]["1000000"]["knn:dct"]["chosen"] == {"overrides": {"k": 3}}
    assert doc["summary"]["split_mnist"]["1000000"]["target:dct_merge"] == {"chosen": e["chosen"], "on_edge": []}
    assert [i["command"] for i in doc["invocations"]][:2] == ["first", "second"] and len(doc["invocations"]) == 3
    assert doc["invocations"][2]["combined"] == [str(a), str(b)]
    # --combine with no file makes --out's own file's choices again (a grid's reasons changed, say): nothing runs
    edited = json.loads(json.dumps(doc))
    edited["streams"]["split_mnist"]["1000000"]["target:dct_merge"]["chosen"] = {"overrides": {"keys.n": 8}}
    (out / "continual_frontier_tune.json").write_text(json.dumps(edited))
    again = cf.main(["--preset", "smoke", "--tune", "--merge", "--out", str(out), "--combine"])
    assert again["streams"]["split_mnist"]["1000000"]["target:dct_merge"]["chosen"] == {"overrides": {"keys.n": 12}}
    assert again["invocations"][-1]["combined"] == [] and len(again["invocations"]) == 4


def test_a_stale_copy_of_a_tuning_file_cannot_bring_old_points_back(tmp_path):
    """A lane copies the tuning file, tunes another grid and combines its copy back: the copy's older points
    of a grid rerun meanwhile (on a changed preset, or later) must not replace the rerun's, and a point run
    on another version of the preset is never chosen."""
    from growmem.continual.methods import preset_digest, resolve

    cf = _frontier()
    m = "net:readout_replay_dct_novelty"
    now = preset_digest(resolve(m, "split_mnist"))
    pt = lambda tau, acc, **kw: {"settings": {"overrides": {"policy.0.tau": tau}}, "accuracy": acc, "bytes_peak": 1,
                                 "within_budget": True, **kw}

    def tuning(name, points):
        (tmp_path / name).mkdir()
        path = tmp_path / name / "continual_frontier_tune.json"
        path.write_text(json.dumps({"streams": {"split_mnist": {"1000000": {m: cf._tuned_entry(m, points, 1, "online")}}},
                                    "invocations": [{"command": name, "seconds": 1.0}]}))
        return path

    old = [pt(0.1, .60), pt(0.2, .70), pt(0.4, .80)]                      # before digests were recorded
    rerun = [pt(0.1, .90, preset_digest=now, ran_at="2026-12-07T07:00:00Z"),
             pt(0.2, .85, preset_digest=now, ran_at="2026-12-07T07:05:00Z"),
             pt(0.4, .50, preset_digest=now, ran_at="2026-12-07T07:10:00Z")]
    out = tmp_path / "out"
    out.mkdir()
    cf.main(["--preset", "smoke", "--tune", "--out", str(out), "--combine", str(tuning("rerun", rerun)),
             str(tuning("stale_copy", old))])
    e = json.loads((out / "continual_frontier_tune.json").read_text())["streams"]["split_mnist"]["1000000"][m]
    assert [r["accuracy"] for r in e["results"]] == [.90, .85, .50]
    assert e["chosen"] == {"overrides": {"policy.0.tau": 0.1}}
    # a point of another preset version is kept for the record, never chosen; of two current points of the same
    # settings the later run wins whichever file comes last
    later = [pt(0.1, .95, preset_digest=now, ran_at="2026-12-07T06:00:00Z"), pt(0.8, .99, preset_digest="0" * 16)]
    cf.main(["--preset", "smoke", "--tune", "--merge", "--out", str(out), "--combine", str(tuning("later", later))])
    e = json.loads((out / "continual_frontier_tune.json").read_text())["streams"]["split_mnist"]["1000000"][m]
    assert [r["accuracy"] for r in e["results"]] == [.90, .85, .50, .99]
    assert e["chosen"] == {"overrides": {"policy.0.tau": 0.1}}


def test_the_tuning_file_counts_the_grid_points_left_to_run():
    """``pending_points``: a point never run, and one run only on another version of the preset, are left; a
    point run before digests were recorded and one that failed (over the budget) are not (as the choice
    counts them); a grid run through is not listed, nor one of another stream's methods."""
    from growmem.continual.methods import preset_digest, resolve

    cf = _frontier()
    smoke = cf.PRESETS["smoke"]
    now = preset_digest(resolve("target:dct_merge", "split_mnist"))
    pt = lambda n, **kw: {"settings": {"overrides": {"keys.n": n}}, "accuracy": 0.9, "within_budget": True, **kw}
    merge = [pt(8, preset_digest=now), pt(10, preset_digest="0" * 16), pt(12), {**pt(14), "accuracy": None}]
    knn = [{"settings": {"overrides": {"k": k}}, "accuracy": 0.8, "within_budget": True} for k in (1, 3, 5)]
    doc = {"streams": {"split_mnist": {"200000": {"target:dct_merge": {"results": merge},
                                                  "knn:dct": {"results": knn}}}}}
    left = {(p["stream"], p["budget"], p["protocol"], p["method"]): (p["never_run"], p["stale"], p["of"])
            for p in cf.pending_points(doc, smoke)}
    assert left[("split_mnist", 200_000, "online", "target:dct_merge")] == (1, 1, 5)
    assert ("split_mnist", 200_000, "online", "knn:dct") not in left
    assert left[("split_mnist", 500_000, "online", "knn:dct")] == (3, 0, 3)
    assert left[("split_mnist", 200_000, "offline", "replay_bytes")] == (5, 0, 5)   # 1 to 100 epochs below 0.3 MB
    assert not any(m == "target:dct_merge" and st != "split_mnist" for st, _, _, m in left)
    assert set(left) == {(st, b, pr, m) for pr in cf.PROTOCOLS for st in smoke["streams"] for b in (200_000, 500_000)
                         for m in cf.grids(smoke, st, pr)} - {("split_mnist", 200_000, "online", "knn:dct")}


def test_offline_tuning_chooses_replays_epochs_and_justifies_only_the_edge_it_cannot_pass(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "continual_frontier.py"), "--preset", "smoke", "--streams",
           "split_mnist", "--protocol", "offline", "--methods", "replay_bytes", "--budgets", "0.5MB", "--tune",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    e = json.loads((tmp_path / "continual_frontier_tune.json").read_text())["streams"]["split_mnist"]["500000"][
        "replay_bytes"]
    assert [r["settings"]["epochs"] for r in e["results"]] == [1, 3, 10] and e["protocol"] == "offline"
    # below 0.3 MB the grid goes on to 30 and 100 epochs (10, then 30 won at 0.1 MB), from 3 MB to 30
    grid = _frontier().OFFLINE_TUNE_GRID["replay_bytes"]
    assert [[p["epochs"] for p in grid(b, "split_mnist")] for b in (100_000, 1_000_000, 3_000_000)] == \
        [[1, 3, 10, 30, 100], [1, 3, 10], [1, 3, 10, 30]]
    best = max(e["results"], key=lambda r: r["accuracy"])
    assert e["chosen"] == best["settings"]
    want_edge = [] if best["settings"]["epochs"] == 3 else ["epochs"]
    assert e["on_edge"] == want_edge
    assert e["edge_reasons"] == ({"epochs": "one epoch per experience is the fewest an offline run takes"}
                                 if best["settings"]["epochs"] == 1 else {})
    sys.path.insert(0, str(ROOT / "docs"))
    import render
    row = render.render_continual_frontier_tune(json.loads((tmp_path / "continual_frontier_tune.json").read_text()))
    assert ("fewest an offline run takes" in row) == (best["settings"]["epochs"] == 1)


def test_each_stream_tunes_the_grids_of_its_own_methods():
    cf = _frontier()
    cpu = cf.PRESETS["cpu"]
    # Split-MNIST's DCT learners are not tuned on the domain-incremental streams, nor theirs on Split-MNIST
    perm, split = cf.grids(cpu, "permuted_mnist", "online"), cf.grids(cpu, "split_mnist", "online")
    assert {"target:proj_merge", "knn:proj", "er_balanced:proj", "er_balanced:raw", "er_reservoir:raw"} == set(perm)
    assert "target:dct_merge" in split and not {"target:proj_merge", "knn:proj"} & set(split)
    assert set(cf.grids(cpu, "rotated_mnist", "offline")) == {"replay_bytes"}
    assert set(cf.grids(cpu, "permuted_mnist", "online", "knn:proj,knn:dct")) == {"knn:proj"}
    # the key size's grid holds the preset's 100 projections inside it, kNN's k its k = 1 edge (EDGE_REASONS)
    dims = [p["overrides"]["keys.dim"] for p in perm["target:proj_merge"](1_000_000, "permuted_mnist")]
    assert min(dims) < 100 < max(dims)
    assert [p["overrides"]["k"] for p in perm["knn:proj"](3_000_000, "permuted_mnist")] == [1, 3, 5, 10]
    # online replay's width: the rule's inside, from an eighth of it (a narrower model, a larger buffer) up by
    # doublings to the widest whose parameters still fit the budget (not 4h for raw images at 1 MB: 784 x 4h floats)
    h = B.er_width(1_000_000, 784, 10)
    assert [p["hidden_size"] for p in perm["er_reservoir:raw"](1_000_000, "permuted_mnist")] == \
        [h // 8, h // 4, h // 2, h, 2 * h]
    d = B.er_codes("er_balanced:proj", 784).key_dim
    h = B.er_width(1_000_000, d, 10)
    assert [p["hidden_size"] for p in perm["er_balanced:proj"](1_000_000, "permuted_mnist")] == \
        [h // 8, h // 4, h // 2, h, 2 * h, 4 * h] and 4 * (d * 4 * h + 4 * h + 40 * h + 10) < 1_000_000
    for budget in (3_000_000, 15_700_000):             # past eight times the rule's where it fits (the rule stops)
        h = B.er_width(budget, d, 10)
        widths = [p["hidden_size"] for p in perm["er_balanced:proj"](budget, "permuted_mnist")]
        assert widths[0] == h // 8 and all(b == 2 * a for a, b in zip(widths, widths[1:]))
        assert B.er_model_bytes(d, widths[-1], 10) < budget <= B.er_model_bytes(d, 2 * widths[-1], 10)
    assert widths[-1] > 8 * h
    # the widest that fits, chosen, is an edge with its reason; a width chosen below it on the top edge has none
    pts = [{"settings": {"hidden_size": w}, "accuracy": 0.5 + i / 100, "bytes_peak": 1, "within_budget": True}
           for i, w in enumerate(widths)]
    e = cf._tuned_entry("er_balanced:proj", pts, 1, "online", budget=15_700_000)
    nxt = B.er_model_bytes(d, 2 * widths[-1], 10)
    assert e["edge_reasons"] == {"hidden_size": f"the widest model of the grid whose float32 parameters fit 15.7 MB "
                                                f"at all ({2 * widths[-1]} units take {nxt / 1e6:.2g} MB)"}
    assert cf._tuned_entry("er_balanced:proj", pts[:-1], 1, "online", budget=15_700_000)["edge_reasons"] == {}
    small = cf._tuned_entry("er_reservoir:raw", [dict(p, settings={"hidden_size": w}) for p, w in zip(pts, (8, 16))],
                            1, "online", budget=100_000)
    assert small["edge_reasons"]["hidden_size"].endswith(f"(32 units take "
                                                         f"{B.er_model_bytes(784, 32, 10) / 1e3:.0f} kB)")
    # a value on the edge that gains less than FLAT_GAIN over the next one inward (the others as chosen) is not
    # extended: the last three values along its line are named; a larger gain, or another line's points, are not
    line = [({"readout.beta": b, "readout.temperature": 1.0}, a) for b, a in ((3.0, 0.90), (1.0, 0.93), (0.3, 0.95))]

    def entry(last_gain, extra=()):
        pts = line + [({"readout.beta": 0.1, "readout.temperature": 1.0}, 0.95 + last_gain)] + list(extra)
        res = [{"settings": {"overrides": o}, "accuracy": a, "bytes_peak": 1, "within_budget": True} for o, a in pts]
        return cf._tuned_entry("net:readout_replay_dct", res, 1, "online", budget=3_000_000)

    flat = entry(cf.FLAT_GAIN / 2)
    assert flat["on_edge"] == ["readout.beta"] and flat["edge_reasons"] == {"readout.beta": (
        f"the gain has flattened (validation 0.9300, 0.9500, {0.95 + cf.FLAT_GAIN / 2:.4f} at readout.beta 1, 0.3, "
        f"0.1, one seed: less than {cf.FLAT_GAIN:g} from the last step)")}
    assert entry(2 * cf.FLAT_GAIN)["edge_reasons"] == {}
    off_line = [({"readout.beta": 0.3, "readout.temperature": 2.0}, 0.1)]   # another T: not on the chosen's line
    assert entry(cf.FLAT_GAIN / 2, off_line)["edge_reasons"] == flat["edge_reasons"]


def test_the_policy_presets_are_tuned_from_the_readouts_chosen_t_with_their_presets_value_inside(tmp_path, monkeypatch):
    from growmem import config

    cf = _frontier()
    tune = {"streams": {"split_mnist": {"300000": {"net:readout_replay_dct": {
        "chosen": {"overrides": {"readout.temperature": 0.25, "readout.beta": 3.0}}}}}}}
    (tmp_path / "continual_frontier_tune.json").write_text(json.dumps(tune))
    monkeypatch.setattr(cf, "RESULTS", tmp_path)
    split = cf.grids(cf.PRESETS["cpu"], "split_mnist", "online")
    for method, key, entry in (("net:readout_replay_dct_novelty", "policy.0.tau", ("novelty", "tau")),
                               ("net:readout_replay_dct_decay", "policy.0.gamma", ("weight_decay", "gamma")),
                               ("net:readout_replay_dct_hybrid", "hybrid.learning_rate", None)):
        at = [p["overrides"] for p in split[method](300_000, "split_mnist")]
        assert all(o["readout.temperature"] == 0.25 and o["readout.beta"] == 3.0 for o in at), method
        # where the readout was not tuned, the preset's own T and β
        assert all(set(p["overrides"]) == {key} for p in split[method](100_000, "split_mnist")), method
        pre = config.load(method.split(":", 1)[1])
        if entry is None:
            value = dict(pre.hybrid)["learning_rate"]
        else:
            value = next(dict(p)[entry[1]] for n, p in pre.policy_entries if n == entry[0])
        values = [o[key] for o in at]
        assert min(values) < value < max(values), (method, value, values)
        # every point is a preset the loader accepts (the override names an existing entry)
        config.load(method.split(":", 1)[1], overrides=at[0])
    # a tuning run takes the readout's choice from the file it makes (--out), not the committed one
    import argparse
    out = tmp_path / "out"
    out.mkdir()
    tune["streams"]["split_mnist"]["300000"]["net:readout_replay_dct"]["chosen"]["overrides"]["readout.beta"] = 0.3
    tune["streams"]["split_mnist"]["300000"]["net:readout_replay_dct"].update(results=[], on_edge=[])
    tune["invocations"] = []
    (out / "continual_frontier_tune.json").write_text(json.dumps(tune))
    calls = []

    def fake_run(stream, method, seeds, budget, options, **kw):
        calls.append(kw["settings"]["overrides"])
        return [{"summary": {"acc_mean_over_experiences": 0.5, "bytes_in_use_peak": 1, "within_budget": True}}]

    monkeypatch.setattr(cf, "run_one", fake_run)
    args = argparse.Namespace(out=out, merge=True, combine=None, protocol="online", preset="cpu", data_dir=None,
                              methods="net:readout_replay_dct_decay")
    doc = cf.tune(args, cf.PRESETS["cpu"], ["split_mnist"], [0], [300_000])
    assert calls and all(o["readout.beta"] == 0.3 and o["readout.temperature"] == 0.25 for o in calls)
    assert not any(p["method"] == "net:readout_replay_dct_decay" and p["budget"] == 300_000 for p in doc["pending"])
    # the novelty preset lets self-replay's rehearsals through its test (copies of stored keys)
    pre = config.load("readout_replay_dct_novelty")
    assert "admit_replayed" in repr(pre.policies()) and pre.self_replay() is not None


def test_the_merging_readouts_replay_rate_is_tuned_at_its_own_chosen_bandwidth(tmp_path, monkeypatch):
    cf = _frontier()
    chosen = {"overrides": {"readout.temperature": 0.5, "readout.beta": 3.0, "replay.samples": 32}}
    (tmp_path / "continual_frontier_tune.json").write_text(json.dumps(
        {"streams": {"split_mnist": {"1000000": {"net:readout_replay_dct_merge": {"chosen": chosen}}}}}))
    monkeypatch.setattr(cf, "RESULTS", tmp_path)
    grid = cf.TUNE_GRID["net:readout_replay_dct_merge"](1_000_000, "split_mnist")
    rate = [p["overrides"] for p in grid if "replay.samples" in p["overrides"]]
    assert rate == [{"readout.temperature": 0.5, "readout.beta": 3.0, "replay.samples": n} for n in (1, 2, 4, 8, 16, 32)]
    assert {"overrides": {"readout.temperature": 1.0, "readout.beta": 1.0}} in grid     # the first stage stays
    # where nothing was chosen yet, the preset's own T and β
    rate = [p["overrides"] for p in cf.TUNE_GRID["net:readout_replay_dct_merge"](3_000_000, "split_mnist")
            if "replay.samples" in p["overrides"]]
    assert rate == [{"replay.samples": n} for n in (1, 2, 4, 8, 16, 32)]
    # below 1 MB also no self-replay at all (1 won at 0.3 MB with validation falling as the rate rose)
    rate = [p["overrides"]["replay.samples"] for p in cf.TUNE_GRID["net:readout_replay_dct_merge"](
        300_000, "split_mnist") if "replay.samples" in p["overrides"]]
    assert rate == [0, 1, 2, 4, 8, 16, 32]


def test_one_tuning_run_takes_the_replay_rate_to_the_bandwidth_its_first_stage_chose(tmp_path, monkeypatch):
    """The replay rate's points are built at the merging readout's chosen T; when the run's own first-stage
    points move that choice, the grid is built again and the rate's points at the new T run in the same
    invocation (at most STAGE_PASSES times), and none is left pending."""
    import argparse

    cf = _frontier()
    monkeypatch.setattr(cf, "RESULTS", tmp_path)          # no committed choice: the preset's T = 1 to start
    calls = []

    def fake_run(stream, method, seeds, budget, options, **kw):
        o = kw["settings"]["overrides"]
        calls.append(o)
        t = o.get("readout.temperature", 1.0)           # T = 0.25 is best; at it, 2 rows a step
        acc = 0.9 - abs(t - 0.25) - 0.01 * abs(o.get("replay.samples", 16) - 2)
        return [{"summary": {"acc_mean_over_experiences": acc, "bytes_in_use_peak": 1, "within_budget": True}}]

    monkeypatch.setattr(cf, "run_one", fake_run)
    args = argparse.Namespace(out=tmp_path / "out", merge=True, combine=None, protocol="online", preset="cpu",
                              data_dir=None, methods="net:readout_replay_dct_merge")
    args.out.mkdir()
    doc = cf.tune(args, cf.PRESETS["cpu"], ["split_mnist"], [0], [1_000_000])
    e = doc["streams"]["split_mnist"]["1000000"]["net:readout_replay_dct_merge"]
    assert e["chosen"] == {"overrides": {"readout.temperature": 0.25, "readout.beta": 1.0, "replay.samples": 2}}
    at_new_t = [c for c in calls if "replay.samples" in c and c.get("readout.temperature") == 0.25]
    assert [c["replay.samples"] for c in at_new_t] == [1, 2, 4, 8, 16, 32]
    assert len(calls) == len({json.dumps(c, sort_keys=True) for c in calls})     # no point ran twice
    assert not any(p["method"] == "net:readout_replay_dct_merge" and p["budget"] == 1_000_000
                   for p in doc["pending"])
