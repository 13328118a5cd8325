"""TOML presets: every shipped preset loads and builds; bad files fail with clear errors."""
import dataclasses
import textwrap

import numpy as np
import pytest

from growmem import config, policies as P

SHIPPED = ["weighted_softmax", "rbf", "gauge", "hybrid", "capped", "decaying"]


def test_every_required_preset_is_shipped_with_a_description():
    listed = {name: desc for name, _, desc in config.available()}
    assert set(SHIPPED) <= set(listed)
    assert all(listed[n] and "\n" not in listed[n] for n in SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_presets_load_into_specs_and_models(name):
    pre = config.load(name)
    model = pre.model(d_out=10)
    assert model.n_blocks == pre.n_blocks and model.readout == pre.readout
    assert pre.name == name


def test_hybrid_preset_has_the_table4_settings():
    pre = config.load("hybrid")
    s = pre.readout
    assert (s.kernel, s.temperature, pre.hybrid_layers, s.init, s.init_rows) == (
        "weighted_softmax", 5.0, ("block", "readout"), "random", 16)
    assert s.hyperparameters == {"eta": 1.0, "beta": 30.0}
    assert pre.policy_entries == (("novelty", (("relative", True), ("tau", 0.72))),
                                  ("capacity", (("max_rows", 50016), ("on_full", "reject"))))
    assert repr(pre.policies()) == repr(P.chain(P.chain(P.novelty(0.72, relative=True), P.capacity(50016, "reject")),
                                                 P.hybrid()))
    assert pre.policies().trains_rows and pre.policies().max_rows == 50016
    assert pre.n_blocks == 3 and pre.settings["batch_size"] == 16
    assert pre.hybrid_tx() is not None


def test_decaying_and_capped_presets_build_their_chains():
    assert repr(config.load("decaying").policies()) == repr(P.chain(P.weight_decay(0.003, prune_below=0.001)))
    assert config.load("decaying").policies().retention == 1 - 0.003
    assert repr(config.load("capped").policies()) == repr(P.chain(P.capacity(20000, "evict_oldest")))
    assert config.load("capped").policies().max_rows == 20000
    # a policy is built anew for every trainer, like an optax tx: nothing is shared through a cache
    assert config.load("capped").policies() is not config.load("capped").policies()


def test_a_preset_trains_a_few_steps(tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text(textwrap.dedent("""
        description = "tiny"
        [model]
        n_blocks = 0
        [layer]
        kernel = "weighted_softmax"
        eta = 1.0
        beta = 3.0
        init = "zeros"
        hybrid = true
        [[policy]]
        name = "novelty"
        tau = 0.5
        relative = true
        [[policy]]
        name = "capacity"
        max_rows = 30
        [[policy]]
        name = "momentum"
        mu = 0.5
        [hybrid]
        optimizer = "adamw"
        learning_rate = 0.01
        [train]
        batch_size = 4
    """))
    pre = config.load(f)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    tr = pre.trainer(x[:4], d_out=3)
    for i in range(0, 40, 4):
        tr.step(x[i:i + 4], y[i:i + 4])
    assert max(tr.rows_in_use().values()) <= 30
    assert np.isfinite(np.asarray(tr.predict(x))).all()


def test_policy_entries_naming_a_layer_apply_to_that_layer_only():
    """replay_dct_evict_smallest: the block evicts its least significant rows, the readout stays
    class-balanced; under a cap both layers hold at most the cap, each by its own rule."""
    from growmem.continual.learner import with_row_cap

    pre = config.load("replay_dct_evict_smallest")
    chains = pre.policies()
    assert repr(chains("block_0")) == repr(P.chain(P.labels(), P.capacity(1000000, "evict_smallest")))
    assert repr(chains("readout")) == repr(P.chain(P.capacity(1000000, "evict_balanced")))
    capped = with_row_cap(pre, 24)
    assert [dict(p).get("max_rows") for n, p in capped.policy_entries if n == "capacity"] == [24, 24]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 100)).astype(np.float32)
    y = rng.integers(0, 4, 160)
    tr = capped.trainer(x[:16], d_out=4)
    for i in range(0, 160, 16):
        tr.step(x[i:i + 16], y[i:i + 16])
    mems = tr.memories()
    assert tr.rows_in_use() == {"block_0": 24, "readout": 24}
    block = mems[("block_0",)]
    born, last = np.asarray(block.born[:24]), int(block.t)
    # each step brings 32 rows (16 + 16 replayed) to a cap of 24: evicting by age would keep the last step's rows
    # only; evicting the least significant keeps early rows (their errors were large) and drops later ones
    assert born.max() < last - 2, (born, last)
    # the readout evicts the oldest rows of its largest class: it holds the newest step's rows
    assert int(np.asarray(mems[("readout",)].born[:24]).max()) == last
    # replay_dct_freeze_block: the same block rejects rows once full; its rows stay those of the first steps,
    # bit for bit, while the readout goes on turning over
    frozen = with_row_cap(config.load("replay_dct_freeze_block"), 24)
    assert repr(frozen.policies()("block_0")) == repr(P.chain(P.labels(), P.capacity(24, "reject")))
    tr = frozen.trainer(x[:16], d_out=4)
    tr.step(x[:16], y[:16])
    tr.step(x[16:32], y[16:32])
    full = np.asarray(tr.memories()[("block_0",)].k[:24]).copy()
    for i in range(32, 160, 16):
        tr.step(x[i:i + 16], y[i:i + 16])
    mems = tr.memories()
    assert tr.rows_in_use() == {"block_0": 24, "readout": 24}
    assert np.array_equal(np.asarray(mems[("block_0",)].k[:24]), full)
    assert int(np.asarray(mems[("block_0",)].born[:24]).max()) <= 2
    assert int(np.asarray(mems[("readout",)].born[:24]).max()) == int(mems[("readout",)].t)
    # a cap for one layer only: the other layer gets one of its own under a budget
    only_block = dataclasses.replace(pre, policy_entries=pre.policy_entries[:2])
    added = with_row_cap(only_block, 24, "evict_oldest").policy_entries[-1]
    assert added == ("capacity", (("layer", "readout"), ("max_rows", 24), ("on_full", "evict_oldest")))


BASE = 'description = "x"\n'


@pytest.mark.parametrize("body, key, allowed", [
    ('[layer]\ntemprature = 1.0\n', "layer.temprature", "temperature"),
    ('colour = 1\n', "colour", "allowed top-level keys"),
    ('[layer]\ntemperature = "hot"\n', "layer.temperature", "a finite number >= 1e-06"),
    ('[model]\nn_blocks = 1.5\n', "model.n_blocks", "an integer >= 0"),
    ('[layer]\nhybrid = 1\n', "layer.hybrid", "true or false"),
    ('[layer]\nkernel = "cosine"\n', "layer.kernel", "'weighted_softmax'"),
    ('[[policy]]\nname = "novelty"\ntau = -1.0\n', "policy[0].tau", "a number >= 0"),
    ('[[policy]]\nname = "weight_decay"\ngamma = 1.0\n', "policy[0].gamma", "a number in [0, 1)"),
    ('[[policy]]\nname = "weight_decay"\ngamma = -0.5\n', "policy[0].gamma", "a number in [0, 1)"),
    ('[[policy]]\nname = "momentum"\nmu = 1.0\n', "policy[0].mu", "a number in [0, 1)"),
    ('[layer]\nmomentum = 1.5\n', "layer.momentum", "a number in [0, 1)"),
    ('[[policy]]\nname = "capacity"\nmax_rows = 10\non_full = "drop"\n', "policy[0].on_full", "'evict_oldest'"),
    ('[[policy]]\nname = "capacity"\n', "policy[0].max_rows", "an integer >= 1"),
    ('[[policy]]\nname = "forget"\n', "policy[0].name", "'novelty'"),
    ('[[policy]]\nname = "novelty"\ntau = 1.0\nradius = 2\n', "policy[0].radius", "tau"),
    ('[layer]\nkernel = "rbf"\nbeta = 1.0\n', "layer.beta", "eta"),
    ('[hybrid]\nlearning_rate = 0.1\n', "hybrid", "hybrid = true"),
    ('[train]\nloss = "hinge"\n', "train.loss", "'cross_entropy'"),
    ('[[policy]]\nname = "labels"\nlayer = "blocks"\n', "policy[0].layer", "'block', 'readout'"),
])
def test_bad_presets_name_the_file_the_key_and_the_allowed_values(tmp_path, body, key, allowed):
    f = tmp_path / "bad.toml"
    f.write_text(BASE + body)
    with pytest.raises(config.ConfigError) as e:
        config.load(f)
    msg = str(e.value)
    assert str(f) in msg and f"'{key}" in msg and allowed in msg, msg


def test_missing_description_and_invalid_toml_and_unknown_preset(tmp_path):
    f = tmp_path / "a.toml"
    f.write_text("[layer]\n")
    with pytest.raises(config.ConfigError, match="description"):
        config.load(f)
    f.write_text("description = \n")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(f)
    with pytest.raises(config.ConfigError, match="hybrid"):
        config.load("no_such_preset")


def test_cli_lists_the_presets_with_their_descriptions(capsys):
    from growmem.app.cli import main
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    for name, _, desc in config.available():
        assert f"{name}" in out and desc in out


def test_cli_train_runs_a_preset_and_names_a_bad_one(tmp_path, capsys):
    import json
    from growmem.app.cli import main
    assert main(["train", "--policy", str(config.PRESET_DIR / "capped.toml"), "--task", "teacher-student",
                 "--steps", "2", "--eval-every", "1", "--test-size", "32", "--batch-size", "8",
                 "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert "capacity(max_rows=20000" in metrics["policy"]["policy"]
    assert metrics["task"] == "teacher-student" and "final_test_loss" in metrics
    capsys.readouterr()
    assert main(["train", "--policy", "no_such_preset", "--steps", "1"]) == 2
    assert "no shipped preset" in capsys.readouterr().err


def test_cli_train_with_a_preset_defaults_to_mnist_with_the_preset_batch(tmp_path):
    import json
    from growmem.app.cli import main
    assert main(["train", "--policy", "weighted_softmax", "--steps", "3", "--eval-every", "3",
                 "--test-size", "64", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["task"] == "mnist" and m["config"]["batch_size"] == 16 and m["test_samples"] == 64
    # D0 (16 rows) + 3 steps x 16 rows per layer; accuracy is a fraction of the 64 test images
    assert m["rows"] == {"block_0": 64, "block_1": 64, "readout": 64}
    assert 0.0 <= m["final_test_accuracy"] <= 1.0 and m["final_test_accuracy"] * 64 == round(m["final_test_accuracy"] * 64)


def test_cli_train_names_the_paths_searched_when_mnist_is_missing(tmp_path, monkeypatch, capsys):
    from growmem.app.cli import main
    monkeypatch.setenv("GROWMEM_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["train", "--task", "mnist", "--steps", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and len(err.strip().splitlines()) == 1
