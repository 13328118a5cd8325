"""The ``paper`` presets of ``growmem repro`` against the paper's own tables (App. F/G), and each CIFAR
``paper`` preset end to end on a generated CIFAR-format fixture (its code path — CIFAR loading and
normalisation, the F.1.1 augmentation, d = 3072, CIFAR-100's 100 classes — at tiny sizes), so a GPU
owner's first run does not fail on a path nobody exercised.

``TABLES`` transcribes the tables; where the paper's text is on this machine
(``/work/shared/reference``) the transcription itself is checked against it."""
import json
import math
import re
from pathlib import Path

import pytest

import fixture_data
import growmem.repro as repro
from growmem import classical, config

PAPER_TEXT = Path(__file__).resolve().parents[2] / "shared" / "reference" / "000_9818808a45fc1a21.txt"
#: the paper's lines the transcription is checked against, shipped with the tests (so the check runs everywhere)
EXCERPT = Path(__file__).resolve().parent / "data" / "paper_tables.txt"
LR = [0.0001, 0.0003, 0.001, 0.003, 0.01]

#: App. F's hyperparameter tables as printed: {table: {row label (its start): values}}
TABLES = {
    2: {"Value learning rate": [0.1, 0.3, 1.0], "Weight learning rate": [10.0, 30.0, 100.0],
        "Softmax temperature": [0.1, 1.0, 3.0, 10.0], "Momentum": [0.6, 0.9], "Batch size": [64],
        "Epochs": [200000]},
    3: {"# residual blocks": [0, 1, 2], "Weight learning rate": [0.3, 1.0, 1.5, 3.0],
        "Value learning rate": [20.0, 30.0, 40.0, 60.0], "Softmax temperature": [1.0, 3.0, 10.0, 15.0, 30.0],
        "Batch size": [64], "Epochs": [50]},
    4: {"Maximal width per layer": [50016], "Growth threshold": [35, 40, 45, 50, 55, 60],
        "Value learning rate": [10, 30, 60], "Weight learning rate": [1.0], "Softmax temperature": [1.0, 5.0, 10.0],
        "Adam learning rate": [0.0003, 0.001, 0.003], "Batch size": [16], "Epochs": [1]},
    5: {"$W_{\\text{Key}}$ shape": [2560000, 3072], "Learning rate": [0.003, 0.01, 0.03, 0.1],
        "Softmax temperature": [0.001, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0], "Batch size": [64], "Epochs": [2000]},
    6: {"Hidden size": [10240000], "Learning rate": [0.0003, 0.001, 0.003, 0.01, 0.03],
        "Temperature": [0.001, 0.01, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0], "Momentum": [0.85], "Batch size": [64],
        "Training steps": [200000]},
    9: {"Mesa-$\\gamma$": [0.9, 0.99, 1.0], "Mesa-$\\lambda$": [0.001, 0.01, 0.1], "Learning rate": LR,
        "Momentum": [0.85], "Batch size": [64], "Epochs": [50]},
    10: {"Decay rate": [0.0000003, 0.000001, 0.000003, 0.00001, 0.0001, 0.0003], "Learning rate": LR,
         "Batch size": [64], "Epochs": [50]},
    11: {"Residual stream size": [512], "# residual blocks": [10], "MLP hidden dimension": [2048], "Dropout": [0.1],
         "Batch size": [64], "Epochs": [2000]},
    12: {"Learning rate": LR, "Weight decay (for AdamW)": [0.0001, 0.01], "Batch size": [16, 64], "Epochs": [50]},
    13: {"Residual stream size": [256, 512, 1024, 4096, 8192],
         "Learning rate": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0], "Momentum": [0.0, 0.9, 0.999],
         "Training steps": [200000]},
    14: {"Bandwidth": [0.25, 0.5, 1.0, 2.0, 3.0, 5.0], "Ridge regulariser": [0.001, 0.01, 0.1, 0.3, 1.0]},
    15: {"Embedding dimension": [128], "Attention heads": [8], "FFN blowup factor": [1, 2, 4, 8, 16, 32],
         "Learning rate": [0.0003, 0.001, 0.003], "Batch size": [64], "Epochs": [1], "Seeds": [5]},
    16: {"Embedding dimension": [128], "Attention heads": [8], "Learning rate (Adam)": [0.0003, 0.001, 0.003],
         "Weight learning rate": [0.1, 0.3, 1.0], "Value learning rate": [10, 30],
         "Softmax temperature": [0.1, 0.3, 1.0, 3.0], "Value momentum": [0.0, 0.999], "Batch size": [64],
         "Epochs": [1], "Seeds": [5]},
}
#: Table 8 (best average accuracy) and App. G.2 (mean over seeds), F.8.1 (74 % vs 67 %), F.11 (54.4 % vs 48.4 %)
TABLE_8 = {"cifar10": {"5": 0.6914, "10": 0.7130, "exact": 0.7124}, "cifar100": {"5": 0.4149, "10": 0.4323, "exact": 0.4319}}
G2 = {"weighted_softmax": dict(temperature=6.0, eta=0.003, beta=3.0), "rbf": dict(temperature=20.0, eta=10.0),
      "gauge": dict(temperature=5.0, alpha=10.0, eta=0.03, beta=100.0)}
SEEDS = 5   # App. F: "we report the mean and standard deviation over 5 seeds"


def T(table, label):
    return TABLES[table][label]


def paper(name):
    return repro.get(name).preset("paper")


# ---- the transcription, against the paper's text ------------------------------------------------

def _numbers(cell: str):
    cell = cell.replace(r"\times 10^{", "e").replace("}", "")
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", cell)]


def _table_rows(text: str, n: int):
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(f"Table {n}:"))
    rows = {}
    for line in lines[start + 1:]:
        if "\t" not in line:
            if rows:
                break
            continue
        label, _, cell = line.partition("\t")
        rows[label] = cell
    return rows


def test_the_transcribed_tables_are_the_papers():
    """Against the shipped excerpt of the paper; where the paper's text is on the machine, every line of the
    excerpt is also checked to be one of the paper's lines (so the excerpt is the paper's, verbatim)."""
    text = EXCERPT.read_text()
    if PAPER_TEXT.exists():
        paper_lines = set(PAPER_TEXT.read_text().splitlines())
        copied = [line for line in text.splitlines() if line.strip() and not line.startswith("# ")]
        assert len(copied) > 100
        assert [line for line in copied if line not in paper_lines] == []
    for n, expect in TABLES.items():
        rows = _table_rows(text, n)
        for label, values in expect.items():
            match = [c for l, c in rows.items() if l.startswith(label)]
            assert match, f"Table {n} has no row {label!r}: {sorted(rows)}"
            got = _numbers(match[0])
            assert got == pytest.approx([float(v) for v in values]), (n, label, match[0])
    t8 = _table_rows(text, 8)
    assert _numbers(t8["CIFAR-10"]) == pytest.approx([TABLE_8["cifar10"][k] for k in ("5", "10", "exact")])
    assert _numbers(t8["CIFAR-100"]) == pytest.approx([TABLE_8["cifar100"][k] for k in ("5", "10", "exact")])
    assert "Weighted Softmax with $T=6$, $\\eta=0.003$, $\\beta=3$; RBF with temperature $20$ and learning rate $10$" in text
    assert "$T=5$, $\\alpha=10$, $\\eta=0.03$, $\\beta=100$" in text
    assert "Weighted Softmax $59.4\\pm 0.4\\%$, RBF $58.8\\pm 0.2\\%$, Gauge-Invariant $58.4\\pm 0.4\\%$" in text
    assert "(74% vs. 67%)" in text and "we report the mean and standard deviation over 5 seeds" in text


# ---- each paper preset, against the tables --------------------------------------------------------

def test_every_paper_preset_runs_five_seeds_and_every_cpu_preset_at_least_three():
    for name in repro.names():
        exp = repro.get(name)
        assert len(exp.preset("paper")["seeds"]) == SEEDS, name
        assert len(exp.preset("cpu")["seeds"]) >= repro.core.MIN_SEEDS, name


def test_single_pass_paper_preset_is_fig2_right_and_g2():
    p = paper("single-pass")
    assert p["dataset"] == "cifar10" and p["n_train"] is None and p["batch"] == 16
    assert p["growing_n_blocks"] is None and p["mlp"] == {"n_blocks": 2, "hidden": None}   # L = 2, d_e = 3072
    for name, hyper in G2.items():   # the shipped presets are G.2's configurations, L = 2
        pre = config.load(name)
        assert pre.n_blocks == 2 and pre.block.temperature == hyper["temperature"]
        assert {k: v for k, v in dict(pre.block.hyper).items() if k in hyper} == \
            {k: v for k, v in hyper.items() if k != "temperature"}
    for opt in ("sgd", "adam", "rmsprop", "muon"):
        assert p["grids"][opt] == {"lr": T(12, "Learning rate")}
    assert p["grids"]["adamw"] == {"lr": T(12, "Learning rate"), "wd": T(12, "Weight decay (for AdamW)")}
    assert p["grids"]["mesa"] == {"lr": T(9, "Learning rate"), "lam": T(9, "Mesa-$\\lambda$"),
                                  "gamma": T(9, "Mesa-$\\gamma$")}
    assert p["grids"]["delta"] == {"lr": T(10, "Learning rate"), "lam": T(10, "Decay rate")}
    assert p["extend"] == {}
    assert list(p["knn"]["ks"]) == [5, 10, 15, 20, 25] == list(classical.KNN_K_GRID)   # F.10.2
    assert p["kernel_ridge"]["gamma_mult"] == T(14, "Bandwidth") and p["kernel_ridge"]["lam"] == T(14, "Ridge regulariser")
    assert p["kernel_ridge"]["n_train"] is None
    assert p["paper"] == {"weighted_softmax": 0.594, "rbf": 0.588, "gauge": 0.584}


def test_multi_epoch_paper_preset_is_fig2_left():
    p = paper("multi-epoch")
    assert p["dataset"] == "cifar10" and p["augment"] and p["epochs"] == T(12, "Epochs")[0] == T(3, "Epochs")[0]
    assert p["batch"] in T(12, "Batch size") and p["batch"] == T(3, "Batch size")[0]
    assert p["mlp"]["hidden"] is None and p["mlp"]["n_blocks"] == 2
    for opt in ("sgd", "adam", "rmsprop", "muon"):
        assert p["grids"][opt] == {"lr": T(12, "Learning rate")}
    assert p["grids"]["mesa"] == {"lr": T(9, "Learning rate"), "lam": T(9, "Mesa-$\\lambda$"),
                                  "gamma": T(9, "Mesa-$\\gamma$")}
    assert p["grids"]["delta"] == {"lr": T(10, "Learning rate"), "lam": T(10, "Decay rate")}


def test_depth_temperature_paper_preset_is_table_3():
    p = paper("depth-temperature")
    assert p["dataset"] == "cifar10" and p["augment"] and p["epochs"] == T(3, "Epochs")[0]
    assert p["batch"] == T(3, "Batch size")[0]
    assert p["depths"] == T(3, "# residual blocks") and p["temperatures"] == T(3, "Softmax temperature")
    assert p["eta"] in T(3, "Weight learning rate") and p["beta"] in T(3, "Value learning rate")
    assert p["paper"]["best_T"] == 10.0
    assert p["paper"]["score_bound"] == pytest.approx(math.sqrt(3072) / 10, abs=0.005)   # Fig. 3's caption


def test_parametric_gap_paper_preset_is_tables_3_and_5():
    p = paper("parametric-gap")
    assert p["dataset"] == "cifar10" and p["augment"]
    assert p["psm_width"] == T(5, "$W_{\\text{Key}}$ shape")[0] and p["psm_epochs"] == T(5, "Epochs")[0]
    assert p["psm_grid"] == {"lr": T(5, "Learning rate"), "temperature": T(5, "Softmax temperature")}
    assert p["gws_epochs"] == T(3, "Epochs")[0] and p["batch"] == T(5, "Batch size")[0]
    assert p["temperature"] in T(3, "Softmax temperature")
    assert p["eta"] in T(3, "Weight learning rate") and p["beta"] in T(3, "Value learning rate")


def test_hybrid_capacity_paper_preset_is_table_4():
    p = paper("hybrid-capacity")
    assert p["dataset"] == "cifar10" and not p["augment"] and p["batch"] == T(4, "Batch size")[0]
    assert p["n_blocks"] == 3
    assert [t * math.sqrt(3072) for t in p["taus"]] == pytest.approx(T(4, "Growth threshold"))
    assert p["adam_lr"] in T(4, "Adam learning rate")
    pre = config.load("hybrid")
    assert pre.block.temperature in T(4, "Softmax temperature")
    assert dict(pre.block.hyper)["beta"] in T(4, "Value learning rate")
    assert dict(pre.block.hyper)["eta"] == T(4, "Weight learning rate")[0]
    assert 50_000 + p["batch"] == T(4, "Maximal width per layer")[0]   # N = n + B (hybrid_capacity._trainer)


def test_newton_steps_paper_preset_is_tables_8_and_9():
    p = paper("newton-steps")
    assert p["datasets"] == ["cifar10", "cifar100"] and p["augment"] and p["epochs"] == T(9, "Epochs")[0]
    assert p["batch"] == T(9, "Batch size")[0] and p["steps"] == ["5", "10", "exact"]
    assert p["grid"] == {"lr": T(9, "Learning rate"), "lam": T(9, "Mesa-$\\lambda$"), "gamma": T(9, "Mesa-$\\gamma$")}
    assert p["paper"] == TABLE_8
    assert p["mlp"] == {"n_blocks": 2, "hidden": None}


def test_delta_decay_paper_preset_is_table_11():
    p = paper("delta-decay")
    assert p["dataset"] == "cifar10" and p["augment"] and p["epochs"] == T(11, "Epochs")[0]
    assert p["batch"] == T(11, "Batch size")[0] and p["lr"] == 1e-2 and p["warmup_epochs"] == 5
    m = p["model"]
    assert m["width"] == T(11, "Residual stream size")[0] and m["n_blocks"] == T(11, "# residual blocks")[0]
    assert m["width"] * m["expansion"] == T(11, "MLP hidden dimension")[0] and m["dropout"] == T(11, "Dropout")[0]
    assert p["paper"] == {"test_accuracy": {"plain": 0.67, "delta": 0.74}}


def test_learned_temperature_paper_preset_is_g2s_single_pass():
    p = paper("learned-temperature")
    assert p["dataset"] == "cifar10" and not p["augment"] and p["batch"] == 16 and p["n_blocks"] == 2
    assert set(T(3, "Softmax temperature")) <= set(p["temperatures"]) and 6.0 in p["temperatures"]   # G.2's T
    assert {1.0, 6.0, 30.0} <= set(p["inits"])


def test_vit_ffn_paper_preset_is_tables_15_and_16():
    p = paper("vit-ffn")
    assert p["dataset"] == "cifar10" and p["augment"] and p["image_shape"] == [32, 32, 3] and p["patch"] == 4
    assert (32 // p["patch"]) ** 2 == 64                     # 64 patch tokens + CLS
    assert p["d_e"] == T(15, "Embedding dimension")[0] == T(16, "Embedding dimension")[0]
    assert p["heads"] == T(15, "Attention heads")[0] and p["n_blocks"] == 2 and p["batch"] == T(15, "Batch size")[0]
    assert len(p["seeds"]) == T(15, "Seeds")[0]
    assert p["vit_grid"] == {"lr": T(15, "Learning rate"), "blowup": T(15, "FFN blowup factor")}
    assert p["gws_grid"] == {"lr": T(16, "Learning rate (Adam)"), "eta": T(16, "Weight learning rate"),
                             "beta": T(16, "Value learning rate"), "temperature": T(16, "Softmax temperature"),
                             "momentum": T(16, "Value momentum")}
    assert p["paper"] == {"vit": 0.484, "gws_vit": 0.544}


def test_teacher_student_paper_preset_is_tables_2_6_13():
    p = paper("teacher-student")
    assert p["steps"] == T(2, "Epochs")[0] == T(6, "Training steps")[0] == T(13, "Training steps")[0]
    assert p["batch"] == T(2, "Batch size")[0] == T(6, "Batch size")[0]
    assert p["gws"] == {"beta": T(2, "Value learning rate"), "eta": T(2, "Weight learning rate"),
                        "temperature": T(2, "Softmax temperature"), "momentum": T(2, "Momentum")}
    assert p["psm"] == {"lr": T(6, "Learning rate"), "temperature": T(6, "Temperature")}
    assert p["psm_width"] == T(6, "Hidden size")[0]
    assert p["mlp"] == {"width": T(13, "Residual stream size"), "lr": T(13, "Learning rate"),
                        "momentum": T(13, "Momentum")}
    assert p["select_steps"] == p["steps"] and p["extend"] == {}


# ---- each CIFAR paper preset end to end on generated CIFAR files ----------------------------------

@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory):
    """CIFAR-10 and CIFAR-100 in the authors' pickle format (200 training and 40 test images each) and a
    checksums file naming them next to the suite's MNIST ones."""
    import os
    root = tmp_path_factory.mktemp("cifar")
    sums = json.loads(Path(os.environ["GROWMEM_DATA_CHECKSUMS"]).read_text())
    sums["cifar10"] = fixture_data.write_cifar(root / "cifar10", "cifar10", n_per_batch=40, n_test=40)
    sums["cifar100"] = fixture_data.write_cifar(root / "cifar100", "cifar100", n_per_batch=40, n_test=40)
    (root / "checksums.json").write_text(json.dumps(sums))
    return root


#: one seed: the seeds and verdicts are the smoke presets' tests (tests/test_repro.py); these are the CIFAR paths
ONE = {"seeds": [0], "n_test": 32}
_MLP_GRIDS = {"sgd": {"lr": [1e-3]}, "adam": {"lr": [1e-3]}, "rmsprop": {"lr": [1e-3]}, "muon": {"lr": [1e-3]},
              "adamw": {"lr": [1e-3], "wd": [1e-4]}, "mesa": {"lr": [1e-3], "lam": [0.1], "gamma": [0.99]},
              "delta": {"lr": [1e-3], "lam": [1e-5]}}
#: the paper preset of each CIFAR experiment at tiny sizes: a few images, one or two epochs, one value per
#: grid axis, narrow hidden layers (the residual stream stays d = 3072)
TINY = {
    "single-pass": {"n_train": 32, "mlp": {"hidden": 16}, "grids": _MLP_GRIDS, "knn": {"ks": [5]},
                    "kernel_ridge": {"gamma_mult": [1.0], "lam": [0.1]}},
    "multi-epoch": {"n_train": 128, "epochs": 2, "mlp": {"hidden": 16},
                    "grids": {k: v for k, v in _MLP_GRIDS.items() if k != "adamw"}},
    "depth-temperature": {"n_train": 128, "epochs": 1, "depths": [0, 1], "temperatures": [1.0, 10.0, 30.0]},
    "parametric-gap": {"n_train": 128, "gws_epochs": 2, "psm_epochs": 2, "psm_width": 256, "train_eval": 64,
                       "psm_grid": {"lr": [0.01], "temperature": [1.0]}},
    "hybrid-capacity": {"n_train": 32, "taus": [0.7, 0.9]},
    "newton-steps": {"n_train": 64, "epochs": 1, "mlp": {"n_blocks": 1, "hidden": 16}, "steps": ["5", "10", "exact"],
                     "grid": {"lr": [1e-3], "lam": [0.1], "gamma": [0.99]}},
    "delta-decay": {"n_train": 128, "epochs": 2, "warmup_epochs": 1, "train_eval": 64, "delta_lams": [1e-5],
                    "wd_betas": [1e-3], "extend": {}, "model": {"width": 32, "n_blocks": 2}},
    "learned-temperature": {"n_train": 32, "temperatures": [1.0, 6.0, 30.0], "inits": [1.0, 30.0]},
    "vit-ffn": {"n_train": 128, "vit_grid": {"lr": [1e-3], "blowup": [1]},
                "gws_grid": {"lr": [1e-3], "eta": [1.0], "beta": [10.0], "temperature": [1.0], "momentum": [0.0]}},
}


def test_a_training_set_smaller_than_one_batch_is_refused(cifar_root, tmp_path, monkeypatch):
    monkeypatch.setenv("GROWMEM_DATA_CHECKSUMS", str(cifar_root / "checksums.json"))
    with pytest.raises(repro.core.ReproError, match="no whole batch"):
        repro.run("newton-steps", "paper", out=tmp_path, data_dir=cifar_root, progress=False,
                  overrides={**ONE, **TINY["newton-steps"], "n_train": 32, "batch": 64})


def test_every_cifar_paper_preset_has_a_tiny_run():
    cifar = [n for n in repro.names() if repro.get(n).preset("paper").get("dataset", "").startswith("cifar")]
    assert sorted(cifar) == sorted(TINY)


@pytest.mark.parametrize("name", sorted(TINY))
def test_cifar_paper_preset_end_to_end(name, cifar_root, tmp_path, monkeypatch):
    monkeypatch.setenv("GROWMEM_DATA_CHECKSUMS", str(cifar_root / "checksums.json"))
    doc = repro.run(name, "paper", out=tmp_path, data_dir=cifar_root, progress=False, overrides={**ONE, **TINY[name]})
    s = doc["summary"]
    assert doc["preset"] == "paper" and s["seeds"] == [0]
    assert s["verdict"] in repro.core.VERDICTS and s["claims"]
    for k, m in s["metrics"].items():
        assert m["n"] == 1 and all(math.isfinite(v) for v in m["values"]), k
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    cfg = doc["config"]
    assert cfg["dataset"] == "cifar10" and cfg["n_train"] == TINY[name]["n_train"]
    if name == "newton-steps":   # CIFAR-100 too, with its 100 classes
        assert set(s["accuracy_by_dataset"]) == {"cifar10", "cifar100"}
    if name == "vit-ffn":        # 4 x 4 patches of 32 x 32 x 3 images: 64 tokens + CLS
        assert s["tokens"] == 65
