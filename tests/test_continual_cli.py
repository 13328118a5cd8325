"""growmem.continual end to end: the CLI, the benchmark's smoke preset, and the offline MNIST
streams against Avalanche's own classic generators on the same files."""
import gzip
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from growmem.continual.cli import main  # noqa: E402

torch.set_num_threads(1)


def test_cli_runs_growmem_variants_against_a_baseline_and_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--n-experiences", "2", "--train-limit", "64", "--test-limit", "32", "--baselines", "naive",
                 "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    doc = json.loads((out / "continual.json").read_text())
    # no --policy on the drifting stream: the three growmem memories (never forgets / decays / a window)
    assert list(doc["summary"]) == ["growmem", "growmem:continual_decay", "growmem:continual_window", "naive"]
    assert doc["stream"]["name"] == "drifting_teacher" and doc["stream"]["train_sizes"] == [64, 64]
    for m, agg in doc["summary"].items():
        assert 0 <= agg["acc_mean_over_experiences"]["mean"] <= 1 and agg["bytes_in_use_peak"]["mean"] > 0, m
    for png in ("continual_accuracy_matrix.png", "continual_stream.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "acc_mean_over_exps" in table and "acc_stream_weighted" in table and "growmem:continual_decay" in table


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


def _bench_main():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_continual", ROOT / "benchmarks" / "continual.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def test_benchmark_smoke_writes_the_summary_of_every_stream_and_method(tmp_path):
    _bench_main()(["--preset", "smoke", "--out", str(tmp_path), "--no-progress"])
    doc = json.loads((tmp_path / "continual.json").read_text())
    assert (tmp_path / "continual.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    methods = ["growmem", "naive", "ewc", "lwf", "gdumb", "replay_1000", "replay_4400", "cumulative", "joint"]
    budget = doc["config"]["budget_bytes"]
    assert budget == 4400 * 784 * 4 + 478410 * 4
    for stream in ("split_mnist", "permuted_mnist"):
        s = doc["summary"][stream]
        # Split-MNIST also holds growmem on the shuffled stream (one experience of every class)
        assert list(s) == methods + (["growmem_iid"] if stream == "split_mnist" else [])
        # accuracy against bytes: growmem at a smaller budget (within it) and at the main one
        pts = doc["curve"][stream]
        assert [p["budget"] for p in pts] == [2_000_000, budget]
        assert all(p["bytes"] <= p["budget"] and 0 <= p["accuracy"] <= 1 for p in pts)
        for m in methods:
            assert 0 <= s[m]["accuracy"] <= 1 and s[m]["bytes"] > 0, (stream, m)
        # growmem is capped to the budget, rows in use and allocated
        assert s["growmem"]["bytes"] <= budget and s["growmem"]["bytes_allocated"] <= budget
        assert s["growmem"]["within_budget"] is True
        # what each method keeps besides its model: EWC its Fisher and old parameters, LwF the old model
        assert s["ewc"]["bytes"] > s["lwf"]["bytes"] > s["naive"]["bytes"]
        assert s["replay_4400"]["bytes"] >= s["replay_1000"]["bytes"] > s["naive"]["bytes"]
    # Split-MNIST: 5 experiences; Permuted-MNIST smoke: 3; joint is evaluated once at the end
    runs = {(st, r["method"]): r for st, d in doc["streams"].items() for r in d["runs"]}
    assert len(runs["split_mnist", "naive"]["accuracy_matrix"]) == 5
    assert len(runs["permuted_mnist", "naive"]["accuracy_matrix"]) == 3
    assert len(runs["split_mnist", "joint"]["accuracy_matrix"]) == 1
    assert runs["split_mnist", "naive"]["config"]["epochs"] == 2 and runs["permuted_mnist", "naive"]["config"]["epochs"] == 1


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
