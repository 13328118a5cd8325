"""``growmem repro``: every experiment's smoke preset end to end (JSON summary + PNG), the
registry's errors, ``--list`` and ``--table``.

The smoke presets train on generated data: their numbers check the pipeline, not the paper's
claims, so only types, keys and ranges are asserted here (``claim_reproduced`` is a bool,
accuracies are finite fractions)."""
import json
import math
import shutil
from pathlib import Path

import pytest

import growmem.repro as repro
from growmem.cli import main
from growmem.repro import multi_epoch, single_pass

NAMES = repro.names()


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    """One folder gathering the smoke JSONs of this module's runs (for the ``--table`` test)."""
    return tmp_path_factory.mktemp("repro_smoke")


def _run_smoke(name, out, shared=None):
    doc = repro.run(name, "smoke", out=out, progress=False)
    if shared is not None:
        shutil.copy(Path(out) / f"{name}.json", Path(shared) / f"{name}.json")
    return doc


def _fraction(x, what):
    assert isinstance(x, (int, float)) and not isinstance(x, bool), f"{what}: {x!r} is not a number"
    assert math.isfinite(x) and 0.0 <= x <= 1.0, f"{what}: {x!r} is not a fraction in [0, 1]"


def _fractions(tree, what):
    """Every leaf of a nested dict of accuracies is a finite fraction; -> how many were checked."""
    if isinstance(tree, dict):
        assert tree, f"{what}: empty"
        return sum(_fractions(v, f"{what}.{k}") for k, v in tree.items())
    _fraction(tree, what)
    return 1


def _check_single_pass(s, cfg):
    assert set(s["accuracy"]) == set(single_pass.MODELS) == set(s["rows"])
    _fractions(s["accuracy"], "accuracy")
    for m, r in s["rows"].items():
        assert isinstance(r, int) and r >= 0, (m, r)
    for m in single_pass.GROWING:   # every growing net stored at least its D0 rows
        assert s["rows"][m] > 0, m
    for m in single_pass.MLPS:
        assert s["rows"][m] == 0, m
    assert s["rows"]["knn"] == cfg["n_train"]
    assert isinstance(s["claim_reproduced"], bool)


def _check_hybrid_capacity(s, cfg):
    _fraction(s["full_growth_accuracy"], "full_growth_accuracy")
    assert isinstance(s["points"], list) and len(s["points"]) == len(cfg["taus"])
    for p in s["points"]:
        assert set(p) == {"tau", "capacity_fraction", "accuracy"}
        _fraction(p["accuracy"], "points.accuracy")
        _fraction(p["capacity_fraction"], "points.capacity_fraction")
        assert p["capacity_fraction"] > 0
    assert [p["tau"] for p in s["points"]] == cfg["taus"]
    assert isinstance(s["claim_reproduced"], bool)


def _check_newton_steps(s, cfg):
    assert set(s["accuracy_by_steps"]) == {"1", "5", "10", "exact"}
    _fractions(s["accuracy_by_steps"], "accuracy_by_steps")
    # k Newton-Schulz steps approach the inverse: 10 steps nearer than 1
    r = s["residual_by_steps"]
    assert r["10"] < r["1"]
    assert isinstance(s["claim_reproduced"], bool)


def _check_depth_temperature(s, cfg):
    assert set(s["accuracy"]) == {str(L) for L in cfg["depths"]}
    assert _fractions(s["accuracy"], "accuracy") == len(cfg["depths"]) * len(cfg["temperatures"])
    _fractions(s["linearised_accuracy"], "linearised_accuracy")
    assert isinstance(s["claim_reproduced"], bool)


def _check_parametric_gap(s, cfg):
    for k in ("test_accuracy", "train_accuracy"):
        assert set(s[k]) == {"gws", "parametric_softmax"}
        _fractions(s[k], k)
    assert s["width"] > 0
    assert isinstance(s["claim_reproduced"], bool)


def _check_delta_decay(s, cfg):
    for k in ("test_accuracy", "train_accuracy"):
        assert set(s[k]) == {"plain", "delta", "weight_decay"}
        _fractions(s[k], k)
    assert isinstance(s["claim_reproduced"], bool)


def _check_teacher_student(s, cfg):
    loss = s["final_test_loss"]
    assert set(loss) == {"growing_weighted_softmax", "parametric_softmax", "reference_mlp"}
    assert all(math.isfinite(v) and v >= 0 for v in loss.values())
    assert isinstance(s["claim_reproduced"], bool)


def _check_learned_temperature(s, cfg):
    assert set(s["accuracy"]) == {"learned", "best_swept"}
    _fractions(s["accuracy"], "accuracy")
    _fractions(s["swept"], "swept")
    assert set(s["learned_temperatures"]) == {f"block_{i}" for i in range(cfg["n_blocks"])} | {"readout"}
    assert all(math.isfinite(t) and t > 0 for t in s["learned_temperatures"].values())
    assert isinstance(s["claim_reproduced"], bool)


def _check_multi_epoch(s, cfg):
    models = set(multi_epoch.MODELS)
    assert set(s["accuracy"]) == set(s["test_accuracy_by_epoch"]) == set(s["train_loss_by_epoch"]) == models
    _fractions(s["accuracy"], "accuracy")
    for m in models:
        by_epoch = s["test_accuracy_by_epoch"][m]
        assert len(by_epoch) == cfg["epochs"] == len(s["train_loss_by_epoch"][m]), m
        for a in by_epoch:
            _fraction(a, f"test_accuracy_by_epoch.{m}")
        assert by_epoch[-1] == s["accuracy"][m]    # the last epoch's evaluation is the whole test set
        assert all(math.isfinite(v) and v >= 0 for v in s["train_loss_by_epoch"][m]), m
    # a growing net stores every sample once per epoch in each of its L + 1 layers, after its D0 rows
    # (GWS: B random rows, F.3; RBF: none)
    seen = cfg["epochs"] * (cfg["n_train"] // cfg["batch"]) * cfg["batch"]
    d0 = {"weighted_softmax": cfg["batch"], "rbf": 0}
    assert s["rows"] == {m: (cfg["growing_n_blocks"] + 1) * (d0[m] + seen) for m in multi_epoch.GROWING}
    for k in ("accuracy_claim", "loss_claim", "claim_reproduced"):
        assert isinstance(s[k], bool), k


def _check_vit_ffn(s, cfg):
    assert set(s["accuracy"]) == {"vit", "gws_vit"}
    _fractions(s["accuracy"], "accuracy")
    # every block stores its D0 (B random rows) and one row per token of every image it saw
    h, w, _ = cfg["image_shape"]
    tokens = (h // cfg["patch"]) * (w // cfg["patch"]) + 1
    assert s["tokens"] == tokens
    seen = (cfg["n_train"] // cfg["batch"]) * cfg["batch"]
    assert s["rows"] == {f"ffn_{i}": cfg["batch"] + seen * tokens for i in range(cfg["n_blocks"])}
    assert s["params"]["gws_vit"] < s["params"]["vit"]       # the FFNs hold no parameters
    assert isinstance(s["claim_reproduced"], bool)


CHECKS = {"single-pass": _check_single_pass, "multi-epoch": _check_multi_epoch, "hybrid-capacity": _check_hybrid_capacity,
          "newton-steps": _check_newton_steps, "depth-temperature": _check_depth_temperature,
          "parametric-gap": _check_parametric_gap, "delta-decay": _check_delta_decay,
          "teacher-student": _check_teacher_student, "learned-temperature": _check_learned_temperature,
          "vit-ffn": _check_vit_ffn}


def test_every_experiment_has_a_check():
    assert set(CHECKS) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_smoke_preset_writes_summary_and_plot(name, tmp_path, smoke_dir):
    doc = _run_smoke(name, tmp_path, smoke_dir)
    json_path, png = tmp_path / f"{name}.json", tmp_path / f"{name}.png"
    assert doc["paths"] == {"json": str(json_path), "png": str(png)}
    assert png.stat().st_size > 1000
    data = json.loads(json_path.read_text())
    assert list(data)[0] == "experiment" and data["experiment"] == name and data["preset"] == "smoke"
    assert data["command"] == f"growmem repro {name} --preset smoke"
    assert data["summary"] == doc["summary"]
    assert not (tmp_path / f"{name}.partial.jsonl").exists()   # the resume cache is removed when done
    CHECKS[name](data["summary"], data["config"])


def test_unknown_experiment_and_preset_are_explained(tmp_path):
    with pytest.raises(repro.UnknownExperimentError) as e:
        repro.run("no-such-experiment", "smoke", out=tmp_path, progress=False)
    msg = str(e.value)
    assert "'no-such-experiment'" in msg and all(n in msg for n in NAMES)
    assert isinstance(e.value, repro.ReproError)

    with pytest.raises(repro.UnknownPresetError) as e:
        repro.run("single-pass", "fast", out=tmp_path, progress=False)
    assert "'fast'" in str(e.value) and "smoke, cpu, paper" in str(e.value)

    with pytest.raises(repro.ReproError, match="not a setting of this preset.*n_train"):
        repro.run("newton-steps", "smoke", out=tmp_path, progress=False, overrides={"n_trian": 64})
    assert not any(tmp_path.iterdir())   # refused before any work


def test_cli_list_names_every_experiment(capsys):
    assert main(["repro", "--list"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert listed == NAMES


def test_cli_unknown_experiment_is_one_line_and_the_listing(capsys):
    assert main(["repro", "no-such-experiment", "--preset", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("growmem repro: unknown experiment 'no-such-experiment'")
    assert all(n in err for n in NAMES)
    assert main(["repro", "single-pass", "--preset", "fast"]) == 2
    assert "valid presets: smoke, cpu, paper" in capsys.readouterr().err


def test_cli_table_from_the_smoke_jsons(smoke_dir, capsys):
    for name in NAMES:   # when run alone: the smoke runs the parametrized test would have left
        if not (smoke_dir / f"{name}.json").exists():
            _run_smoke(name, smoke_dir)
    capsys.readouterr()
    assert main(["repro", "--table", "--out", str(smoke_dir)]) == 0
    printed = capsys.readouterr().out
    text = (smoke_dir / "README_TABLE.md").read_text()
    assert text.rstrip() in printed
    lines = text.splitlines()
    head = lines.index("| experiment | claim | paper | measured here | command |")
    assert lines[head + 1] == "|---|---|---|---|---|"
    rows = [line for line in lines[head + 2:] if line.startswith("| ")]
    assert "Not run here" not in text
    seen = set()
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        assert len(cells) == 5, row
        name, claim, paper, measured, command = cells
        seen.add(name)
        assert claim and paper and measured.startswith("(smoke preset: a pipeline check")
        assert command == f"`growmem repro {name} --preset smoke`"
    assert seen == set(NAMES)
