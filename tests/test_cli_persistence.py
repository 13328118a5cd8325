"""``growmem train --checkpoint-dir/--resume``, ``growmem inspect`` and ``growmem export``."""
import json
import re

import numpy as np

from growmem.app import cli

SMALL = ["--batch-size", "8", "--test-size", "32", "--eval-every", "2", "--blocks", "1"]


def _fails(capsys, command, match):
    """``command()`` exits 2 with one line on stderr matching ``match``."""
    capsys.readouterr()
    code = command()
    err = capsys.readouterr().err
    assert code in (1, 2) and re.search(match, err) and len(err.strip().splitlines()) == 1, (code, err)


def _train(tmp_path, name, steps, *extra):
    return cli.main(["train", "--steps", str(steps), "--out", str(tmp_path / f"out-{name}"), *SMALL, *extra])


def test_train_resume_matches_an_uninterrupted_run_and_inspect_export_read_it(tmp_path, capsys):
    a, b = tmp_path / "ck-a", tmp_path / "ck-b"
    assert _train(tmp_path, "a", 6, "--checkpoint-dir", str(a)) == 0
    assert _train(tmp_path, "b", 4, "--checkpoint-dir", str(b)) == 0          # "interrupted" at step 4
    _fails(capsys, lambda: _train(tmp_path, "b", 6, "--checkpoint-dir", str(b)), "--resume")   # no silent overwrite
    assert _train(tmp_path, "b", 6, "--checkpoint-dir", str(b), "--resume") == 0
    assert "resumed from step 4" in capsys.readouterr().out
    ma = json.loads((tmp_path / "out-a" / "metrics.json").read_text())
    mb = json.loads((tmp_path / "out-b" / "metrics.json").read_text())
    assert ma["final_test_loss"] == mb["final_test_loss"] and ma["rows"] == mb["rows"]
    assert ma["test_curve"] == mb["test_curve"]

    assert cli.main(["inspect", str(b)]) == 0
    text = capsys.readouterr().out
    for word in ("step         6", "readout", "block_0", "format       version 3", "checksums    verified", "created at"):
        assert word in text, text
    assert cli.main(["inspect", str(b), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 6 and {l["layer"] for l in info["layers"]} == {"block_0", "readout"}

    for d, f in ((a, "a.npz"), (b, "b.npz")):
        assert cli.main(["export", str(d), "--npz", str(tmp_path / f)]) == 0
    za, zb = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert set(za.files) == set(zb.files) and "readout/k" in za.files
    for key in za.files:
        if key != "__description__":
            assert za[key].tobytes() == zb[key].tobytes(), key
    desc = json.loads(str(za["__description__"]))
    assert desc["layers"]["readout"]["kernel"] == "weighted_softmax"


def test_resume_with_a_different_model_config_names_the_difference(tmp_path, capsys):
    d = tmp_path / "ck"
    assert _train(tmp_path, "a", 2, "--checkpoint-dir", str(d)) == 0
    _fails(capsys, lambda: _train(tmp_path, "a", 4, "--checkpoint-dir", str(d), "--resume", "--temperature", "2.0"),
           r"temperature: checkpoint 1.0, current 2.0")


def test_resume_with_a_ram_budget_the_run_never_had_says_so(tmp_path, capsys):
    d = tmp_path / "ck"
    assert _train(tmp_path, "a", 2, "--checkpoint-dir", str(d)) == 0
    _fails(capsys, lambda: _train(tmp_path, "a", 4, "--checkpoint-dir", str(d), "--resume", "--ram-budget", "1MB"),
           r"checkpointed with its rows in RAM \(no --ram-budget\); resume it without --ram-budget")
    assert not (d / "cold").exists()
    assert _train(tmp_path, "a", 4, "--checkpoint-dir", str(d), "--resume") == 0


def test_inspect_of_a_directory_without_checkpoints_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _fails(capsys, lambda: cli.main(["inspect", str(tmp_path / "empty")]), "no complete checkpoint")
    # a folder of run folders (growmem continual keeps METHOD/seedN/ckpt): the error names where they are
    for seed in (1, 2):
        assert _train(tmp_path, f"s{seed}", 2, "--checkpoint-dir", str(tmp_path / "runs" / "m" / f"seed{seed}" /
                                                                       "ckpt")) == 0
    capsys.readouterr()
    _fails(capsys, lambda: cli.main(["inspect", str(tmp_path / "runs")]),
           re.escape(f"it holds run folders whose checkpoints are in {tmp_path / 'runs' / 'm' / 'seed1' / 'ckpt'}, "
                     f"{tmp_path / 'runs' / 'm' / 'seed2' / 'ckpt'}: name one of them"))


def test_train_with_a_ram_budget_spills_and_resumes_exactly(tmp_path, capsys):
    """--ram-budget: rows past the budget go to disk; an interrupted spilling run resumed from its
    checkpoint ends bitwise where an uninterrupted spilling run ends, and holds the same rows as a
    run without a budget (up to float rounding)."""
    small = ["--batch-size", "32", "--test-size", "64", "--eval-every", "10", "--blocks", "1", "--momentum", "0.0"]
    budget = ["--ram-budget", "1.25MB"]    # about 1070 rows per layer in RAM (of 1952)

    def train(name, steps, *extra):
        return cli.main(["train", "--steps", str(steps), "--out", str(tmp_path / f"out-{name}"), *small, *extra])

    assert train("ram", 60) == 0
    assert train("a", 60, *budget, "--checkpoint-dir", str(tmp_path / "ck-a")) == 0
    assert "spill to" in capsys.readouterr().out
    assert train("b", 45, *budget, "--checkpoint-dir", str(tmp_path / "ck-b"), "--checkpoint-every", "10") == 0
    assert train("b", 60, *budget, "--checkpoint-dir", str(tmp_path / "ck-b"), "--checkpoint-every", "10",
                 "--resume") == 0
    assert "resumed from step 45" in capsys.readouterr().out
    m = {k: json.loads((tmp_path / f"out-{k}" / "metrics.json").read_text()) for k in ("ram", "a", "b")}
    # (the interrupted run also evaluated at its last step, 45: compare the points both runs have)
    assert m["a"]["final_test_loss"] == m["b"]["final_test_loss"] and m["a"]["rows"] == m["b"]["rows"]
    assert [p for p in m["b"]["test_curve"] if p[0] != 45 * 32] == m["a"]["test_curve"]
    np.testing.assert_allclose(m["a"]["final_test_loss"], m["ram"]["final_test_loss"], rtol=1e-3)
    assert cli.main(["inspect", str(tmp_path / "ck-a"), "--json"]) == 0
    layers = {l["layer"]: l for l in json.loads(capsys.readouterr().out)["layers"]}
    assert all(l["cold"] > 0 and l["rows"] == l["hot"] + l["cold"] for l in layers.values()), layers
    assert {k: l["rows"] for k, l in layers.items()} == m["ram"]["rows"] == m["a"]["rows"]
    _fails(capsys, lambda: train("c", 2, "--ram-budget", "lots"), "cannot read")


def test_a_copied_or_moved_run_folder_is_inspected_and_exported_with_its_own_cold_tier(tmp_path, capsys):
    """The default spill folder lies inside the checkpoint folder: a copy is checked against the copy's cold
    rows (a damaged copy is reported damaged while the original is intact), and a moved folder reads where
    it is now."""
    import shutil

    small = ["--batch-size", "32", "--test-size", "64", "--eval-every", "10", "--blocks", "1"]
    assert cli.main(["train", "--steps", "30", "--out", str(tmp_path / "o"), *small, "--ram-budget", "1MB",
                     "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    shutil.copytree(tmp_path / "ck", tmp_path / "copy")
    capsys.readouterr()
    assert cli.main(["inspect", str(tmp_path / "copy"), "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert all(l["cold"] > 0 and str(tmp_path / "copy" / "cold") in l["cold_url"] for l in layers), layers
    chunk = sorted(p for p in (tmp_path / "copy" / "cold").rglob("*") if p.is_file() and "/c/" in str(p))[0]
    chunk.write_bytes(bytes(b ^ 0xFF for b in chunk.read_bytes()))       # the copy's cold rows damaged
    _fails(capsys, lambda: cli.main(["inspect", str(tmp_path / "copy")]), str(tmp_path / "copy"))
    assert cli.main(["inspect", str(tmp_path / "ck")]) == 0                # the original is intact
    assert cli.main(["export", str(tmp_path / "ck"), "--npz", str(tmp_path / "a.npz")]) == 0
    shutil.move(str(tmp_path / "ck"), str(tmp_path / "moved"))
    capsys.readouterr()
    assert cli.main(["inspect", str(tmp_path / "moved")]) == 0 and "verified" in capsys.readouterr().out
    assert cli.main(["export", str(tmp_path / "moved"), "--npz", str(tmp_path / "b.npz")]) == 0
    za, zb = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert all(za[k].tobytes() == zb[k].tobytes() for k in za.files if k != "__description__")


def test_resume_of_a_spilling_run_stopped_before_its_first_checkpoint_starts_again(tmp_path, capsys):
    """Killed after spilling but before its first checkpoint (the step folders removed stand for that): the
    rows in its own checkpoint folder's cold tier are referred to by nothing and are replaced; a spill folder
    outside the checkpoint folder may be another run's and is still refused."""
    import shutil

    small = ["--batch-size", "32", "--test-size", "64", "--eval-every", "10", "--blocks", "1", "--ram-budget", "1MB"]

    def train(ck, *extra):
        return cli.main(["train", "--steps", "30", "--out", str(tmp_path / "o"), *small, "--checkpoint-dir", str(ck),
                         *extra])

    assert train(tmp_path / "ref") == 0
    ref = json.loads((tmp_path / "o" / "metrics.json").read_text())
    for name, extra in (("ck", []), ("ck2", ["--spill-dir", str(tmp_path / "elsewhere")])):
        assert train(tmp_path / name, *extra) == 0
        for step in (p for p in (tmp_path / name).iterdir() if p.name.isdigit()):
            shutil.rmtree(step)
    capsys.readouterr()
    assert train(tmp_path / "ck", "--resume") == 0
    assert "starting from step 0" in capsys.readouterr().out
    again = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert (again["final_test_loss"], again["rows"]) == (ref["final_test_loss"], ref["rows"])
    _fails(capsys, lambda: train(tmp_path / "ck2", "--resume", "--spill-dir", str(tmp_path / "elsewhere")),
           "a tier already exists at")
