"""growmem.continual end to end: the CLI, the benchmark's smoke preset, and the offline MNIST
streams against Avalanche's own classic generators on the same files."""
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from growmem.app.continual import main  # noqa: E402

torch.set_num_threads(1)


def test_cli_runs_growmem_variants_against_a_baseline_and_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--n-experiences", "2", "--train-limit", "64", "--test-limit", "32", "--baselines", "naive",
                 "--out", str(out), "--no-progress"]) == 0
    doc = json.loads((out / "continual.json").read_text())
    assert doc["config"]["torch_threads"] == 1           # the default, as the README's main job runs it
    # no --policy on the drifting stream: the four growing networks (never forgets / a drift detector / decays /
    # a window), named by what they are
    assert list(doc["summary"]) == ["net:continual_growmem", "net:drift_discount", "net:continual_decay",
                                    "net:continual_window", "naive"]
    assert doc["methods"]["net:continual_growmem"]["alias"] == "growmem"
    assert doc["stream"]["name"] == "drifting_teacher" and doc["stream"]["train_sizes"] == [64, 64]
    for m, agg in doc["summary"].items():
        assert 0 <= agg["acc_mean_over_experiences"]["mean"] <= 1 and agg["bytes_in_use_peak"]["mean"] > 0, m
    for png in ("continual_accuracy_matrix.png", "continual_stream.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "acc_mean_over_exps" in table and "acc_stream_weighted" in table and "net:continual_decay" in table


def test_cli_errors_name_the_valid_choices(tmp_path):
    with pytest.raises(SystemExit, match="naive.*replay_4400"):
        main(["--baselines", "naive,replay", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="split_mnist.*drifting_teacher"):
        main(["--stream", "mnist", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="continual_growmem"):
        main(["--policy", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--checkpoint-dir"):
        main(["--resume", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="size"):
        main(["--memory-budget", "lots", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown method 'nope:dct'.*er_balanced:raw"):
        main(["--methods", "target:dct,nope:dct", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="'knn:dct' is listed twice"):
        main(["--methods", "knn:dct,knn:dct", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--methods names every method of the run: give it alone"):
        main(["--methods", "naive", "--baselines", "naive", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_a_run_that_cannot_work_as_asked_is_one_line_not_a_traceback(tmp_path):
    """Errors found when the run starts (the CLI no longer turns every ValueError into a usage line, so
    each must be growmem's own): a Split-MNIST test set that misses a class (Avalanche's class split
    raised a KeyError), a budget below the network's initial rows (it used to run past the budget)."""
    with pytest.raises(SystemExit, match=r"the 1 test images \(test_limit=1\) hold no image of class .*--test-limit"):
        main(["--stream", "split_mnist", "--test-limit", "1", "--methods", "knn:dct", "--out", str(tmp_path / "a"),
              "--no-progress"])
    with pytest.raises(SystemExit, match="initial rows .* raise the budget to at least"):
        main(["--methods", "net:continual_decay", "--memory-budget", "400", "--n-experiences", "2", "--train-limit",
              "64", "--test-limit", "32", "--out", str(tmp_path / "b"), "--no-progress"])


def test_cli_methods_are_the_apis_names_run_as_given(tmp_path):
    out = tmp_path / "out"
    assert main(["--methods", "net:continual_decay,naive", "--n-experiences", "2", "--train-limit", "64",
                 "--test-limit", "32", "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    doc = json.loads((out / "continual.json").read_text())
    assert list(doc["summary"]) == ["net:continual_decay", "naive"]


def _bench_module(name="continual"):
    from conftest import benchmark
    return benchmark(name)


def test_benchmark_smoke_writes_the_summary_of_every_stream_and_method(tmp_path):
    bench = _bench_module()
    # Rotated-MNIST runs Permuted-MNIST's methods on another transform of the same images: its stream with
    # one learner and one strategy is checked at the end (--merge)
    bench.main(["--preset", "smoke", "--out", str(tmp_path), "--no-progress", "--tuned", str(tmp_path / "none.json"),
                "--streams", "split_mnist,permuted_mnist"])
    doc = json.loads((tmp_path / "continual.json").read_text())
    for png in ("continual.png", "continual_stream.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    budget = doc["config"]["budget_bytes"]
    assert budget == 15_700_000
    runs = {(r["stream"], r["method"], r["seed"]): r for r in doc["runs"]}
    assert list(doc["summary"]) == ["split_mnist", "permuted_mnist"]
    for stream in ("split_mnist", "permuted_mnist"):
        s = doc["summary"][stream]
        assert list(s) == [m for m in bench.METHODS[stream] if m not in bench.ONE_SEED] + list(bench.ONE_SEED)
        for m, r in s.items():
            assert 0 <= r["accuracy_mean"] <= 1 and r["bytes"] > 0 and r["wall_s"] > 0 and r["seeds"] == 1, (stream, m)
            assert r["description"], m
            # the mean is the runs' own number, not a constant
            assert r["accuracy_mean"] == runs[stream, m, 1]["summary"]["acc_mean_over_experiences"]
        ref = bench.METHODS[stream][0]
        assert s[ref]["bytes"] <= budget and s[ref]["within_budget"] is True
        # stored samples are counted as uint8 images + a one-byte label: replay's buffer is what the budget holds
        rb = runs[stream, "replay_bytes", 1]
        per = rb["config"]["sample_bytes"]
        assert per == 784 + 1
        assert rb["config"]["mem_size"] == (budget - 2 * 4 * 478_410) // per
        assert s["replay_4400"]["bytes"] <= s["replay_bytes"]["bytes"] <= budget   # equal when the data fit both
    # accuracy against bytes: the sweep's methods at a smaller budget, within it
    pts = doc["sweep"]["split_mnist"]["target:dct"]
    assert sorted(p["budget"] for p in pts) == [5_000_000, budget] and all(p["bytes"] <= p["budget"] for p in pts)
    # the shuffled stream (one experience of every class) for growmem's methods
    assert doc["iid"]["split_mnist"]["target:dct"]["seeds"] == 1
    # with one seed nothing is called better or worse
    assert all(r["vs_reference"] is None for r in doc["summary"]["split_mnist"].values())
    assert doc["invocations"][-1]["command"].startswith("python benchmarks/continual.py --preset smoke")
    bench.main(["--preset", "smoke", "--out", str(tmp_path), "--no-progress", "--tuned", str(tmp_path / "none.json"),
                "--streams", "rotated_mnist", "--methods", "knn:raw,naive", "--no-sweep", "--merge"])
    rot = json.loads((tmp_path / "continual.json").read_text())["summary"]
    assert list(rot) == ["split_mnist", "permuted_mnist", "rotated_mnist"] and list(rot["rotated_mnist"]) == ["knn:raw", "naive"]
    assert all(0 < r["accuracy_mean"] <= 1 and r["seeds"] == 1 for r in rot["rotated_mnist"].values())


def test_benchmark_merge_adds_runs_and_keeps_the_others(tmp_path):
    bench = _bench_module()
    common = ["--preset", "smoke", "--out", str(tmp_path), "--no-progress", "--no-sweep", "--no-iid",
              "--streams", "split_mnist", "--tuned", str(tmp_path / "none.json")]
    bench.main(common + ["--methods", "ncm:dct"])
    bench.main(common + ["--methods", "knn:dct,ncm:dct", "--seeds", "1,2", "--merge"])
    doc = json.loads((tmp_path / "continual.json").read_text())
    keys = sorted((r["method"], r["seed"]) for r in doc["runs"])
    assert keys == [("knn:dct", 1), ("knn:dct", 2), ("ncm:dct", 1), ("ncm:dct", 2)]
    s = doc["summary"]["split_mnist"]
    assert s["knn:dct"]["seeds"] == 2 and len(doc["invocations"]) == 2
    vals = s["knn:dct"]["accuracy_values"]
    assert s["knn:dct"]["accuracy_std"] == pytest.approx(float(np.std(vals, ddof=1)))
    # --combine: runs made apart (here: another folder, ncm:dct seed 3) summarised together, nothing rerun
    other = tmp_path / "other"
    bench.main([*common[:3], str(other), *common[4:], "--methods", "ncm:dct", "--seeds", "3"])
    both = tmp_path / "both"
    bench.main(["--preset", "smoke", "--out", str(both), "--combine", str(tmp_path / "continual.json"),
                str(other / "continual.json")])
    doc2 = json.loads((both / "continual.json").read_text())
    assert sorted((r["method"], r["seed"]) for r in doc2["runs"]) == sorted(keys + [("ncm:dct", 3)])
    assert doc2["summary"]["split_mnist"]["ncm:dct"]["seeds"] == 3
    assert doc2["summary"]["split_mnist"]["knn:dct"] == s["knn:dct"]
    assert len(doc2["invocations"]) == 4 and "--combine" in doc2["invocations"][-1]["command"]


def _scipy_verdict(a, b):
    """The paired two-sided t-test at 95 % by scipy: better / worse / tie (equal values: a tie)."""
    from scipy import stats

    d = np.asarray(a, float) - np.asarray(b, float)
    if not d.any():
        return "tie"
    if d.std() == 0:                          # no spread: the means tell them apart
        return "better" if d.mean() > 0 else "worse"
    p = stats.ttest_rel(a, b).pvalue
    return "tie" if p >= 0.05 else "better" if d.mean() > 0 else "worse"


def test_ablation_smoke_compares_each_variant_with_the_full_recipe_and_merges_reruns(tmp_path):
    abl = _bench_module("continual_ablation")
    common = ["--preset", "smoke", "--out", str(tmp_path), "--no-progress", "--tuned", str(tmp_path / "none.json")]
    doc = abl.main(common + ["--parts", "split_mnist,drifting_teacher"])
    s = doc["summary"]
    assert list(s["split_mnist"]) == [v for v, _, _ in abl.SPLIT[:2]]
    assert list(s["drifting_teacher"]) == [v for v, _, _ in abl.DRIFT[:2]]
    second = s["split_mnist"][abl.SPLIT[1][0]]
    assert second["seeds"] == [1, 2] and second["overrides"] == abl.SPLIT[1][2]
    # each verdict is the paired t-test's at 95 % on the per-seed values, recomputed here with scipy
    for part, table, key, field in (("split_mnist", abl.SPLIT, "acc_mean_over_experiences", "accuracy"),
                                    ("drifting_teacher", abl.DRIFT, "acc_current_mean", "acc_current")):
        full, variant = table[0][0], table[1][0]
        per = {v: [r["summary"][key] for r in sorted(doc["runs"], key=lambda r: r["seed"])
                   if r["part"] == part and r["variant"] == v] for v in (variant, full)}
        assert len(per[variant]) == len(per[full]) == 2
        assert s[part][variant][f"{field}_vs_full"] == _scipy_verdict(per[variant], per[full]), (part, per)
    assert (tmp_path / "continual_ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one variant rerun and merged: its runs are replaced, the others kept, the summary covers all of them
    doc2 = abl.main(common + ["--parts", "split_mnist", "--variants", abl.SPLIT[1][0], "--merge"])
    assert len(doc2["runs"]) == len(doc["runs"]) and len(doc2["commands"]) == 2
    assert set(doc2["summary"]) == {"split_mnist", "drifting_teacher"}
    for part in doc2["summary"]:
        for v, r in doc2["summary"][part].items():
            assert r["seeds"] == s[part][v]["seeds"], (part, v)
    with pytest.raises(SystemExit, match="unknown variant"):
        abl.main(common + ["--variants", "no such variant"])


# ----------------------------------------------------------------------------- offline streams = Avalanche's

@pytest.fixture(scope="module")
def avalanche_mnist_root(tmp_path_factory):
    """The local MNIST files laid out where Avalanche's TensorMNIST reads them (no download)."""
    from growmem.data import mnist

    src = None
    for d in mnist.candidate_dirs(None):
        if all((Path(d) / f).is_file() for pair in mnist.FILES.values() for f in pair):
            src = Path(d)
            break
    assert src is not None, "the MNIST-format files are needed (conftest.py generates them into $GROWMEM_DATA)"
    root = tmp_path_factory.mktemp("avalanche_mnist")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for pair in mnist.FILES.values():
        for f in pair:
            with gzip.open(src / f, "rb") as fi, open(raw / f[:-3], "wb") as fo:
                shutil.copyfileobj(fi, fo)
    return root


def _same_items(a, b, idx):
    for i in idx:
        xa, ya, *_ = a[i]
        xb, yb, *_ = b[i]
        assert torch.equal(xa, xb) and int(ya) == int(yb), i


def test_offline_split_mnist_equals_avalanches_split_mnist_on_the_same_files(avalanche_mnist_root):
    from avalanche.benchmarks.classic import SplitMNIST

    from growmem.continual.streams import make_stream

    ours = make_stream("split_mnist", seed=7)
    theirs = SplitMNIST(5, seed=7, dataset_root=avalanche_mnist_root)
    assert ours.info["classes_order"] == list(theirs.classes_order)
    for e in (0, 3):
        a, b = ours.train_stream[e].dataset, theirs.train_stream[e].dataset
        assert len(a) == len(b)
        _same_items(a, b, [0, 1, len(a) // 2, len(a) - 1])
        _same_items(ours.test_stream[e].dataset, theirs.test_stream[e].dataset, [0, 5])


def test_offline_permuted_mnist_equals_avalanches_permuted_mnist_on_the_same_files(avalanche_mnist_root):
    from avalanche.benchmarks.classic import PermutedMNIST

    from growmem.continual.streams import make_stream

    ours = make_stream("permuted_mnist", seed=3, n_experiences=2)
    theirs = PermutedMNIST(2, seed=3, dataset_root=avalanche_mnist_root)
    for e in range(2):
        a, b = ours.train_stream[e].dataset, theirs.train_stream[e].dataset
        assert len(a) == len(b)
        _same_items(a, b, [0, 123, len(a) - 1])
        a, b = ours.test_stream[e].dataset, theirs.test_stream[e].dataset
        assert len(a) == len(b)
        _same_items(a, b, [len(a) - 1])
    x0, x1 = ours.train_stream[0].dataset[0][0], ours.train_stream[1].dataset[0][0]
    assert not torch.equal(x0, x1) and torch.equal(x0.flatten().sort().values, x1.flatten().sort().values)


def test_offline_rotated_mnist_equals_avalanches_rotated_mnist_on_the_same_files(avalanche_mnist_root):
    """Rotated-MNIST rotates each experience's images once as a tensor (not per item, as Avalanche's
    frozen transform does): the items must still be Avalanche's own, bitwise."""
    from avalanche.benchmarks.classic import RotatedMNIST

    from growmem.continual.streams import make_stream

    ours = make_stream("rotated_mnist", seed=4, n_experiences=2)
    theirs = RotatedMNIST(2, seed=4, dataset_root=avalanche_mnist_root)
    for e in range(2):
        a, b = ours.train_stream[e].dataset, theirs.train_stream[e].dataset
        assert len(a) == len(b)
        _same_items(a, b, [0, 77, len(a) - 1])
        _same_items(ours.test_stream[e].dataset, theirs.test_stream[e].dataset, [0, 9])
