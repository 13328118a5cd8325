"""The continual benchmark's protocol: validation splits, honest method names, bytes as a user stores
them, budget-matched replay, the baselines' recipes, ties by a Student t-test at 95 %, tuning."""
import json
import math

import numpy as np
import pytest

from growmem import config
from growmem.continual import methods
from growmem.continual.errors import UnknownNameError
from growmem.reporting import compare, mean_std, standard_error_of_difference


# ----------------------------------------------------------------------------- ties and verdicts

def test_compare_calls_a_difference_only_by_a_students_t_test_at_95_percent():
    from scipy import stats
    a, b = [0.90, 0.91, 0.92], [0.80, 0.81, 0.79]
    se = math.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 3)
    assert standard_error_of_difference(a, b) == pytest.approx(se)
    assert compare(a, b) == "better" and compare(b, a) == "worse"
    # unpaired: Welch's test — a shift of 2.5 standard errors is a tie with 3 values a side (df = 4,
    # t_{4, 0.975} = 2.78), 3.5 is not; scipy's Welch test says the same
    base = [0.0, 0.1, 0.2]
    s = standard_error_of_difference(base, base)
    for shift, call in ((2.5, "tie"), (3.5, "better")):
        moved = [v + shift * s for v in base]
        assert compare(moved, base) == call
        assert (stats.ttest_ind(moved, base, equal_var=False).pvalue < 0.05) == (call == "better")
    assert compare([0.5], [0.4, 0.41]) == "untested"                  # one seed: no spread measured
    assert compare([0.3, 0.31], [0.3, 0.31], higher=False) == "tie"
    assert compare([0.2, 0.21], [0.3, 0.31], higher=False) == "better"  # lower is better (a loss)
    # paired by seed: a constant gain over strongly varying seeds is called, unpaired it is a tie
    base, gain = [0.70, 0.80, 0.90], [0.71, 0.812, 0.909]
    assert compare(gain, base) == "tie" and compare(gain, base, paired=True) == "better"
    assert stats.ttest_rel(gain, base).pvalue < 0.05                    # the independent check of that call
    # paired, 3 seeds: t = 3.5 is beyond 2 standard errors but a tie at 95 % (t_{2, 0.975} = 4.30)
    d = np.array([0.01, 0.03, 0.02])
    t = d.mean() / (d.std(ddof=1) / np.sqrt(3))
    assert 2 < t < 4.3 and compare(list(0.5 + d), [0.5] * 3, paired=True) == "tie"
    assert stats.ttest_rel(0.5 + d, [0.5] * 3).pvalue > 0.05
    with pytest.raises(ValueError, match="one value per seed"):
        compare([1, 2], [1, 2, 3], paired=True)
    m = mean_std([1.0, 2.0, 4.0])
    assert m["mean"] == pytest.approx(7 / 3) and m["std"] == pytest.approx(np.std([1, 2, 4], ddof=1)) and m["n"] == 3


# ----------------------------------------------------------------------------- names

def test_a_json_says_which_cpu_and_instruction_set_measured_it(tmp_path):
    import json
    from pathlib import Path

    from growmem import native
    from growmem.reporting import host, write_json

    env = json.loads(write_json(tmp_path / "r.json", {"summary": {}}).read_text())["environment"]
    info = Path("/proc/cpuinfo")
    if info.is_file():
        names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")]
        if names:
            assert env["cpu"] == names[0]
    assert env["isa"] == (native.isas()[0] if native.isas() else None) and env["cores"] >= 1
    assert {k: env[k] for k in ("cpu", "isa", "cores")} == host()


def test_the_environment_names_the_growmem_checkout_and_only_its_own(tmp_path, monkeypatch):
    import subprocess
    from pathlib import Path

    from growmem import reporting

    def repo(root, pkg):        # a git repository with a growmem package at ``pkg`` inside it
        (root / pkg).mkdir(parents=True)
        (root / pkg / "reporting.py").write_text("# a copy\n")
        for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
            subprocess.run(["git", "-C", str(root), *cmd], check=True, capture_output=True)
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()

    head = repo(tmp_path / "checkout", "growmem")
    monkeypatch.setattr(reporting, "__file__", str(tmp_path / "checkout" / "growmem" / "reporting.py"))
    assert reporting._checkout() == {"git_commit": head, "git_dirty": False}
    (tmp_path / "checkout" / "growmem" / "new.py").write_text("")
    assert reporting._checkout() == {"git_commit": head, "git_dirty": True}
    # installed into a virtual environment that sits inside some other repository: not growmem's commit
    repo(tmp_path / "project", ".venv/lib/site-packages/growmem")
    monkeypatch.setattr(reporting, "__file__",
                        str(tmp_path / "project" / ".venv/lib/site-packages/growmem" / "reporting.py"))
    assert reporting._checkout() == {"git_commit": None, "git_dirty": None}
    monkeypatch.undo()
    env = reporting.environment()
    assert env["load_average"] is None or len(env["load_average"]) == 3
    assert {"written_at", "python", "jax", "growmem", "devices", "cpu", "isa", "git_commit"} <= set(env)


def test_benchmark_results_carry_the_one_environment_record(tmp_path):
    import json
    import sys
    from pathlib import Path

    from growmem import reporting

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import _common
    finally:
        sys.path.pop(0)
    env = json.loads(_common.write_results("x", {"a": 1}, {}, out_dir=tmp_path).read_text())["environment"]
    assert set(env) == set(reporting.environment()) and not hasattr(_common, "environment")


def test_methods_are_named_by_what_they_are():
    m = methods.resolve("growmem", "split_mnist")
    assert (m.name, m.family, m.alias) == ("target:dct", "target", "growmem")
    assert methods.resolve("growmem", "drifting_teacher").name == "net:continual_growmem"
    assert methods.resolve("growmem:continual_decay").name == "net:continual_decay"
    assert methods.resolve("growmem:target_subspaces").name == "target:subspaces"
    assert methods.resolve("knn:dct").description.startswith("k nearest neighbours")
    assert methods.resolve("replay_bytes").family == "replay" and methods.resolve("replay_77").family == "replay"
    with pytest.raises(UnknownNameError, match="name the method target:dct"):
        methods.resolve("net:target_dct")
    with pytest.raises(UnknownNameError, match="key set"):
        methods.resolve("knn:pixels")
    with pytest.raises(UnknownNameError, match="valid methods"):
        methods.resolve("svm")
    with pytest.raises(ValueError, match="listed twice.*growmem.*target:dct"):
        methods.resolve_all(["growmem", "target:dct"], "split_mnist")


def test_preset_overrides_are_validated_like_the_file():
    p = config.load("target_dct", {"keys.n": 8, "target.temperature": 0.01})
    assert dict(p.keys)["n"] == 8 and dict(p.target)["temperature"] == 0.01
    assert config.load("continual_decay", {"policy.0.gamma": 0.02}).policy_entries[0][1][0] == ("gamma", 0.02)
    for bad, what in (({"keys.n": -1}, "not allowed"), ({"keys.nope": 1}, "unknown key"),
                      ({"policy.5.gamma": 0.1}, "1 \\[\\[policy\\]\\] entries"), ({"a.b.c": 1}, "section.key")):
        with pytest.raises(config.ConfigError, match=what):
            config.load("continual_decay" if "policy" in str(bad) else "target_dct", bad)


# ----------------------------------------------------------------------------- validation split

def test_the_validation_split_holds_out_a_tenth_of_each_class_fixed_by_the_seed():
    from growmem.continual.streams import validation_indices
    y = np.repeat(np.arange(4), [50, 100, 30, 20])
    keep, val = validation_indices(y, seed=3)
    assert len(np.intersect1d(keep, val)) == 0 and len(keep) + len(val) == len(y)
    assert [int(np.sum(y[val] == c)) for c in range(4)] == [5, 10, 3, 2]
    again = validation_indices(y, seed=3)
    other = validation_indices(y, seed=4)
    assert np.array_equal(again[1], val) and not np.array_equal(other[1], val)


def test_a_validation_stream_trains_on_the_rest_and_never_reads_the_test_images(monkeypatch):
    from growmem.continual.streams import make_stream, validation_indices
    from growmem.data import mnist

    x, y = mnist.load("train")
    read = []
    real = mnist.load
    monkeypatch.setattr(mnist, "load", lambda split, *a, **k: read.append(split) or real(split, *a, **k))
    st = make_stream("split_mnist", seed=5, split="validation")
    assert read == ["train"]                                               # the test split is not opened
    keep, val = validation_indices(y, 5)
    assert sum(len(e.dataset) for e in st.train_stream) == len(keep)
    assert sum(len(e.dataset) for e in st.test_stream) == len(val)
    # the held-out images are training images, with Avalanche's normalisation
    got = np.sort(np.concatenate([list(e.dataset.targets) for e in st.test_stream]))
    assert np.array_equal(got, np.sort(y[val]))


# ----------------------------------------------------------------------------- bytes

def test_stored_samples_are_counted_as_a_user_stores_them():
    from growmem.continual.memory_bytes import stored_sample_bytes
    assert stored_sample_bytes(784, 10, uint8_inputs=True) == 784 + 1
    assert stored_sample_bytes(784, 10, uint8_inputs=True, task_labels=True) == 784 + 2
    assert stored_sample_bytes(8, 5, uint8_inputs=False) == 8 * 4 + 1          # float inputs stay float32
    assert stored_sample_bytes(3072, 1000, uint8_inputs=True) == 3072 + 2      # > 256 classes: two bytes
    assert stored_sample_bytes(784, 10, uint8_inputs=True, replay_dtype="float32") is None
    with pytest.raises(ValueError, match="uint8, float32"):
        stored_sample_bytes(784, 10, uint8_inputs=True, replay_dtype="int4")


def test_budget_matched_replay_holds_what_the_budget_leaves_beside_the_model():
    from growmem.continual import baselines as B
    assert B.replay_capacity(15_700_000, 3_827_280, 785) == (15_700_000 - 3_827_280) // 785
    with pytest.raises(ValueError, match="raise --memory-budget"):
        B.replay_capacity(2_000_000, 3_827_280, 785)


def test_the_gdumb_schedule_is_its_authors_warm_up_then_sgdr():
    """TrainingRecipe's learning rates against torch's CosineAnnealingWarmRestarts driven as GDumb's
    main.py drives it (one epoch at 0.1 × lr, one at lr, then scheduler.step() every epoch)."""
    import torch
    from growmem.continual import baselines as B

    r = B.recipe("gdumb", "split_mnist")
    assert (r["lr"], r["min_lr"], r["epochs"], r["train_mb_size"], r["clip"], r["mem_size"]) == \
        (0.05, 0.0005, 128, 16, 10.0, 4400)
    plan = B.TrainingRecipe(r["lr"], r["schedule"], r["min_lr"], r["clip"])
    p = [torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD(p, lr=r["lr"], momentum=0.9)
    sch = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=1, T_mult=2, eta_min=r["min_lr"])
    for epoch in range(40):
        if epoch == 0:
            opt.param_groups[0]["lr"] = 0.1 * r["lr"]
        elif epoch == 1:
            opt.param_groups[0]["lr"] = r["lr"]
        else:
            sch.step()
        assert plan.lr_at(epoch, 128) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9), epoch
    cos = B.TrainingRecipe(0.1, "cosine", 0.0)
    assert cos.lr_at(0, 10) == pytest.approx(0.1) and cos.lr_at(5, 10) == pytest.approx(0.05)


def test_the_gdumb_model_is_its_authors_mlp():
    from growmem.continual import baselines as B
    m = B.GDumbMLP(784, 10, 400)
    linear = [l for l in m.modules() if l.__class__.__name__ == "Linear"]
    assert [(l.in_features, l.out_features, l.bias is None) for l in linear] == \
        [(784, 400, True), (400, 400, True), (400, 10, True)]
    assert sum(1 for l in m.modules() if l.__class__.__name__ == "BatchNorm1d") == 3


def test_gdumb_trains_on_its_buffer_read_once_with_the_same_results(monkeypatch):
    """GDumb's buffer read into tensors once per experience (MaterializedTrainingData) trains on the same
    batches as Avalanche reading it through its transforms every epoch: the same accuracy matrix, bit for bit,
    on Split-MNIST (the Normalize transform) over its 5 experiences; the plugin is installed only where the
    stream's training transforms are fixed."""
    from growmem.continual import baselines as B
    from growmem.continual.runner import run_continual
    from growmem.continual.streams import Stream, make_stream

    kw = dict(methods=["gdumb_bytes"], seeds=[3], budget_bytes="0.2MB", epochs=3, progress=False, verbose=False,
              stream_options=dict(n_experiences=5, train_limit=600, test_limit=200))
    installed = []
    make = B.make_baseline
    monkeypatch.setattr(B, "make_baseline", lambda *a, **k: installed.append(make(*a, **k)) or installed[-1])
    fast = run_continual("split_mnist", **kw)["runs"][0]
    assert any(isinstance(p, B.MaterializedTrainingData) for p in installed[-1].plugins)
    monkeypatch.setattr(Stream, "fixed_train_transforms", property(lambda self: False))
    slow = run_continual("split_mnist", **kw)["runs"][0]
    assert not any(isinstance(p, B.MaterializedTrainingData) for p in installed[-1].plugins)
    assert fast["accuracy_matrix"] == slow["accuracy_matrix"] and len(fast["accuracy_matrix"]) == 5
    assert fast["summary"]["acc_mean_over_experiences"] > 0.3          # it learned (10 classes: chance is 0.1)
    monkeypatch.undo()
    assert make_stream("split_mnist").fixed_train_transforms and make_stream("drifting_teacher").fixed_train_transforms


def test_gdumb_final_only_trains_the_last_experience_alone_to_the_same_final_model():
    """GDumb retrains from scratch at every experience, so ``final_only`` trains (and evaluates) it after the
    last experience alone: the final accuracies are bit for bit the full run's, the earlier rows are not
    measured (None, no forgetting claimed), the buffer's peak bytes are the same; a method that keeps its
    model (replay) is still trained and evaluated at every experience."""
    from growmem.continual.runner import run_continual

    kw = dict(seeds=[2], budget_bytes="0.2MB", epochs=2, progress=False, verbose=False,
              stream_options=dict(n_experiences=5, train_limit=600, test_limit=200))
    full = run_continual("split_mnist", methods=["gdumb_bytes"], **kw)["runs"][0]
    last = run_continual("split_mnist", methods=["gdumb_bytes", "replay_bytes"], final_only=True, **kw)["runs"]
    fast, replay = last
    assert fast["accuracy_matrix"][-1] == full["accuracy_matrix"][-1]
    assert all(v is not None for v in fast["accuracy_matrix"][-1])
    assert all(v is None for row in fast["accuracy_matrix"][:-1] for v in row)
    assert fast["summary"]["acc_mean_over_experiences"] == full["summary"]["acc_mean_over_experiences"]
    assert fast["summary"]["acc_stream_weighted"] == full["summary"]["acc_stream_weighted"]
    assert full["summary"]["forgetting"] is not None and fast["summary"]["forgetting"] is None
    assert fast["summary"]["bytes_in_use_peak"] == full["summary"]["bytes_in_use_peak"]
    assert fast["config"]["evaluated"] == "final" and full["config"]["evaluated"] == "every experience"
    assert replay["config"]["evaluated"] == "every experience"
    assert replay["accuracy_matrix"][0][0] is not None and replay["summary"]["forgetting"] is not None


# ----------------------------------------------------------------------------- tuning

def _tune_module():
    from conftest import benchmark
    return benchmark("continual_tune")


def _row(acc, error=None, overrides=None, **settings):
    return {"settings": {**settings, **({"overrides": overrides} if overrides else {})}, "accuracy": acc,
            "within_budget": True, "error": error}


def test_a_chosen_value_on_the_grids_edge_is_extended_past_it_until_inside_or_a_stated_reason():
    tune = _tune_module()
    dim = lambda n: {"keys.dim": n}                             # noqa: E731
    rows = [_row(0.90, lr=0.01, overrides=dim(20)), _row(0.93, lr=0.05, overrides=dim(20)),
            _row(0.95, lr=0.05, overrides=dim(30))]
    ext = {}
    nxt = tune.next_points("m", rows, tune.choose(rows, 1), ext)
    # both settings sit at their top: each moves on by the grid's own ratio, an integer staying one
    assert nxt == [{"lr": 0.05, "overrides": {"keys.dim": 45}}, {"lr": 0.25, "overrides": {"keys.dim": 30}}] or \
        nxt == [{"lr": 0.25, "overrides": {"keys.dim": 30}}, {"lr": 0.05, "overrides": {"keys.dim": 45}}]
    assert all(type(p["overrides"]["keys.dim"]) is int for p in nxt)
    rows += [_row(0.94, lr=0.25, overrides=dim(30)), _row(0.96, lr=0.05, overrides=dim(45))]
    chosen = tune.choose(rows, 1)
    e = tune.edges("m", rows, chosen, ext)
    assert chosen == {"lr": 0.05, "overrides": {"keys.dim": 45}} and set(e) == {"keys.dim"}
    assert e["keys.dim"]["reason"] is None                       # may go on: one step of two taken
    rows += [_row(None, error="keys.dim must be <= 50", lr=0.05, overrides=dim(68))]
    ext[("keys.dim", "high")] += 1
    e = tune.edges("m", rows, tune.choose(rows, 1), ext)
    assert "refused: keys.dim must be <= 50" in e["keys.dim"]["reason"]
    assert tune.next_points("m", rows, tune.choose(rows, 1), ext) == []
    # a stated reason and a bound stop it too
    epochs = [_row(0.9, epochs=1, lr=0.1), _row(0.8, epochs=3, lr=0.1)]
    e = tune.edges("replay_bytes", epochs, tune.choose(epochs, 1))
    assert set(e) == {"epochs"} and "fewest" in e["epochs"]["reason"]       # lr, tried at one value: no edge
    # the reason names its value: the top of the epochs grid winning is no reason to stop
    epochs = [_row(0.8, epochs=1, lr=0.1), _row(0.9, epochs=3, lr=0.1)]
    assert tune.edges("replay_bytes", epochs, tune.choose(epochs, 1))["epochs"]["reason"] is None
    assert tune.next_points("replay_bytes", epochs, tune.choose(epochs, 1), {}) == [{"epochs": 9, "lr": 0.1}]
    blocks = [_row(0.9, overrides={"model.n_blocks": 0}), _row(0.8, overrides={"model.n_blocks": 1})]
    assert "0 or 1" in tune.edges("net:x", blocks, tune.choose(blocks, 1))["model.n_blocks"]["reason"]
    lo = [_row(0.9, overrides={"replay.samples": 1}), _row(0.8, overrides={"replay.samples": 2})]
    assert tune.edges("net:x", lo, tune.choose(lo, 1))["replay.samples"]["reason"] == "1 is the bound of replay.samples"



def test_tuning_with_merge_reads_back_the_points_it_holds_and_runs_only_the_new_ones(tmp_path, monkeypatch):
    import growmem.continual.runner as runner

    tune = _tune_module()
    calls = []

    def fake(stream, methods, seeds, budget, *, method_settings=None, **kw):
        settings = (method_settings or {}).get(methods[0], {})
        calls.append(settings)
        acc = 0.5 + 0.01 * settings["epochs"] - settings["lr"]        # more epochs and the smaller rate win
        return {"runs": [{"summary": {"acc_mean_over_experiences": acc, "bytes_in_use_peak": 1,
                                      "within_budget": True, "wall_seconds": 0.0}}]}

    monkeypatch.setattr(runner, "run_continual", fake)
    argv = ["--preset", "cpu", "--out", str(tmp_path), "--streams", "permuted_mnist", "--methods", "cumulative",
            "--no-progress", "--merge"]
    doc = tune.main(argv)
    entry = doc["streams"]["permuted_mnist"]["cumulative"]
    # the grid's 1 and 3 epochs, then past the top twice (9, 27): the 3-epoch top is no reason to stop; the
    # smaller rate, at the grid's low end, goes on down
    assert sorted({c["epochs"] for c in calls}) == [1, 3, 9, 27]
    assert entry["chosen"]["epochs"] == 27 and "extension limit" in entry["on_edge"]["epochs"]["reason"]
    n = len(calls)
    again = tune.main(argv)                                         # the same grid again: everything read back
    assert len(calls) == n
    assert again["streams"]["permuted_mnist"]["cumulative"]["results"] == entry["results"]
    # a point that ran on another version of the method's preset file is run again, not read back
    import json
    path = tmp_path / "continual_tune.json"
    doc = json.loads(path.read_text())
    for r in doc["streams"]["permuted_mnist"]["cumulative"]["results"]:
        r["preset_digest"] = "0" * 16
    path.write_text(json.dumps(doc))
    tune.main(argv)
    assert len(calls) == 2 * n


def test_combining_tuning_files_keeps_the_newest_points_and_the_reason_an_edge_stopped(tmp_path, monkeypatch):
    """``--combine``: a stale copy of a tuning file (a lane copied it before a grid ran again) cannot bring
    its older points back, and an edge whose extensions ran out keeps that reason in the combined file."""
    import copy
    import json

    import growmem.continual.runner as runner

    tune = _tune_module()

    def fake(stream, methods, seeds, budget, *, method_settings=None, **kw):
        settings = (method_settings or {}).get(methods[0], {})
        acc = 0.5 + 0.01 * settings["epochs"] - settings["lr"]
        return {"runs": [{"summary": {"acc_mean_over_experiences": acc, "bytes_in_use_peak": 1,
                                      "within_budget": True, "wall_seconds": 0.0}}]}

    monkeypatch.setattr(runner, "run_continual", fake)
    (tmp_path / "a").mkdir()
    doc = tune.main(["--preset", "cpu", "--out", str(tmp_path / "a"), "--streams", "permuted_mnist", "--methods",
                     "cumulative", "--no-progress"])
    fresh = doc["streams"]["permuted_mnist"]["cumulative"]
    assert all(r["ran_at"] for r in fresh["results"])
    stale = copy.deepcopy(doc)
    for r in stale["streams"]["permuted_mnist"]["cumulative"]["results"]:
        r.pop("ran_at")                                  # recorded before points said when they ran
        r["accuracy"] = 0.99 if r["settings"]["epochs"] == 1 else 0.1
    (tmp_path / "stale").mkdir()
    (tmp_path / "stale" / "continual_tune.json").write_text(json.dumps(stale))
    (tmp_path / "out").mkdir()
    out = tune.main(["--preset", "cpu", "--out", str(tmp_path / "out"), "--combine",
                     str(tmp_path / "a" / "continual_tune.json"), str(tmp_path / "stale" / "continual_tune.json")])
    got = out["streams"]["permuted_mnist"]["cumulative"]
    key = lambda r: json.dumps(r["settings"], sort_keys=True)     # noqa: E731
    assert {key(r): r["accuracy"] for r in got["results"]} == {key(r): r["accuracy"] for r in fresh["results"]}
    assert got["chosen"] == fresh["chosen"] and got["chosen"]["epochs"] == 27
    assert "extension limit" in got["on_edge"]["epochs"]["reason"]


def test_the_tuning_plot_draws_a_refused_point(tmp_path):
    tune = _tune_module()
    doc = {"streams": {"permuted_mnist": {"m": {"results": [_row(0.5, lr=0.1), _row(None, error="no", lr=1.0)],
                                                "chosen": {"lr": 0.1}}}}}
    tune.plot(doc, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tuning_chooses_on_the_validation_split_within_the_budget(tmp_path):
    tune = _tune_module()
    rows = [{"settings": {"a": 1}, "accuracy": 0.9, "within_budget": False},
            {"settings": {"a": 2}, "accuracy": 0.8, "within_budget": True},
            {"settings": {"a": 3}, "accuracy": 0.7, "within_budget": True}]
    assert tune.choose(rows, 1) == {"a": 2}                                # the best point within the budget
    assert tune.choose(rows[:1], 1) == {"a": 1}                          # nothing fits (joint): the best point
    assert tune.choose([], 1) is None
    doc = tune.main(["--preset", "smoke", "--out", str(tmp_path), "--streams", "split_mnist",
                     "--methods", "knn:dct,ewc", "--no-progress"])
    entry = doc["streams"]["split_mnist"]["knn:dct"]
    assert len(entry["results"]) == 2 and entry["chosen"] == max(entry["results"], key=lambda r: r["accuracy"])["settings"]
    assert "validation" in entry["metric"]
    assert doc["summary"]["split_mnist"]["ewc"] == doc["streams"]["split_mnist"]["ewc"]["chosen"]
    assert (tmp_path / "continual_tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the benchmark reads the chosen settings back
    from conftest import benchmark
    bench = benchmark("continual")
    assert bench.tuned_settings(tmp_path / "continual_tune.json", "split_mnist")["knn:dct"] == entry["chosen"]
    assert json.loads((tmp_path / "continual_tune.json").read_text())["seed"] == 0
