"""Per-row labels (policies.labels, capacity(on_full="evict_balanced")), the labels-trick loss and
SelfReplay: a growing network rehearses the inputs its first layer stores."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import growmem as gm
from growmem import policies
from growmem.train import SelfReplay, cross_entropy_present


def _net(n_blocks=1, d_out=3):
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=0.003, beta=3.0)
    return gm.ResidualGrowingNet(d_out=d_out, n_blocks=n_blocks, readout=spec)


def _data(n=64, d=8, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), (np.arange(n) % classes).astype(np.int32)


def test_labels_follow_their_rows_through_appends_and_balanced_eviction():
    x, y = _data(96)
    cap = 20
    tr = gm.Trainer(_net(0), sample_input=x[:4], policy=policies.capacity(cap, on_full="evict_balanced"))
    seen = {}
    for i in range(12):
        xb, yb = x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]
        tr.step(xb, yb)
        for xi, yi in zip(xb, yb):
            seen[tuple(np.round(xi, 5))] = int(yi)
        rows = tr.memories()[("readout",)].rows()
        lab = np.asarray(policies.stored_labels(tr.state.policy_state["readout"]))[:len(rows["k"])]
        assert len(rows["k"]) <= cap
        # every stored row's label is its sample's class (the keys are the normalised inputs: match by class of
        # the input with the same direction)
        xs = np.asarray(x) / np.linalg.norm(x, axis=1, keepdims=True)
        ks = rows["k"] / np.linalg.norm(rows["k"], axis=1, keepdims=True)
        src = np.argmax(ks @ xs.T, axis=1)
        np.testing.assert_array_equal(lab, y[src])
    # balanced: at the cap the classes hold (almost) equal shares, although the stream is not ordered by class
    counts = np.bincount(lab, minlength=3)
    assert counts.max() - counts.min() <= 1, counts


def test_balanced_eviction_keeps_old_classes_that_oldest_first_drops():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 6)).astype(np.float32)
    y = np.repeat(np.arange(5), 16).astype(np.int32)            # class-incremental: 16 samples of each class
    out = {}
    for mode in ("evict_balanced", "evict_oldest"):
        tr = gm.Trainer(_net(0, 5), sample_input=x[:4], policy=policies.capacity(30, on_full=mode))
        for i in range(10):
            tr.step(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8])
        rows = tr.memories()[("readout",)].rows()
        src = np.argmax((rows["k"] / np.linalg.norm(rows["k"], axis=1, keepdims=True)) @
                        (x / np.linalg.norm(x, axis=1, keepdims=True)).T, axis=1)
        out[mode] = y[src]
    counts = np.bincount(out["evict_balanced"], minlength=5)
    # 30 rows over 5 classes; the newest class holds its whole last batch of 8 (candidates are never evicted)
    assert counts.min() >= 5 and counts.max() <= 8, counts
    assert 0 not in set(out["evict_oldest"].tolist())                     # a FIFO window lost the first class


def test_labels_need_integer_targets_and_one_row_per_input():
    x = np.zeros((4, 3), np.float32)
    tr = gm.Trainer(_net(0, 2), loss="squared_error", sample_input=x, policy=policies.labels())
    with pytest.raises(ValueError, match="integer class targets"):
        tr.step(x, np.zeros((4, 2), np.float32))


def test_cross_entropy_present_ignores_the_absent_classes():
    logits = jnp.asarray([[2.0, 1.0, 5.0, -1.0], [0.5, 3.0, 9.0, 0.0]])
    labels = jnp.asarray([0, 1])
    # an independent computation: the softmax over columns 0 and 1 only
    sub = np.asarray(logits)[:, :2]
    want = np.mean([-(sub[i, labels[i]] - np.log(np.exp(sub[i]).sum())) for i in range(2)])
    assert float(cross_entropy_present(logits, labels)) == pytest.approx(want, rel=1e-6)
    g = jax.grad(lambda z: cross_entropy_present(z, labels))(logits)
    np.testing.assert_array_equal(np.asarray(g)[:, 2:], 0.0)      # no gradient onto absent classes
    g_all = jax.grad(lambda z: optax.softmax_cross_entropy_with_integer_labels(z, labels).mean())(logits)
    assert np.all(np.asarray(g_all)[:, 2] > 0)                    # while plain cross-entropy pushes them down


def test_self_replay_rehearses_stored_inputs_with_their_labels():
    x, y = _data(64)
    tr = gm.Trainer(_net(1), sample_input=x[:4], policy=lambda key: policies.labels(), replay=SelfReplay(4, seed=3))
    tr.step(x[:8], y[:8])
    assert tr.rows_in_use() == {"block_0": 8, "readout": 8}       # nothing stored before: no replay
    state_before = jax.tree.map(jnp.copy, tr.state)
    mem = tr.memories()[("block_0",)]
    labels = np.asarray(policies.stored_labels(tr.state.policy_state["block_0"]))
    xr, yr = tr._with_replay(jnp.asarray(x[8:16]), jnp.asarray(y[8:16]))
    assert xr.shape == (12, 8) and yr.shape == (12,)
    keys = np.asarray(mem.k)[:8]
    for xi, yi in zip(np.asarray(xr)[8:], np.asarray(yr)[8:]):
        j = int(np.argmin(np.linalg.norm(keys - xi, axis=1)))
        np.testing.assert_allclose(xi, keys[j], rtol=0, atol=0)    # a stored row's key, exactly
        assert yi == labels[j] == y[j]                             # with its sample's class
    # a replayed key is its sample's input: the network sees the same query (RMSNorm is idempotent)
    q = np.asarray(gm.rms_norm(jnp.asarray(x[:8])))
    np.testing.assert_allclose(np.asarray(gm.rms_norm(jnp.asarray(keys))), q, rtol=1e-5, atol=1e-5)
    tr.state = state_before
    tr.step(x[8:16], y[8:16])
    assert tr.rows_in_use() == {"block_0": 20, "readout": 20}     # 8 new samples + 4 replayed
    # the draws are a function of the seed and the step: the same on another trainer at the same step
    other = gm.Trainer(_net(1), sample_input=x[:4], policy=lambda key: policies.labels(), replay=SelfReplay(4, seed=3))
    other.step(x[:8], y[:8])
    a = tr._with_replay(jnp.asarray(x[:1]), jnp.asarray(y[:1]))[1]
    other.step(x[8:16], y[8:16])
    b = other._with_replay(jnp.asarray(x[:1]), jnp.asarray(y[:1]))[1]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("admit_replayed", [False, True])
def test_the_trainer_marks_replayed_samples_for_the_novelty_test(admit_replayed):
    x, y = _data(64)
    # τ so large that no stream sample is novel after the first step: only rehearsals can enter
    pol = policies.chain(policies.novelty(1e6, admit_replayed=admit_replayed), policies.labels())
    tr = gm.Trainer(_net(0), sample_input=x[:4], policy=pol, replay=SelfReplay(4, seed=1))
    tr.step(x[:8], y[:8])
    assert tr.rows_in_use() == {"readout": 8}                   # an empty memory: every candidate is novel
    tr.step(x[8:16], y[8:16])
    tr.step(x[16:24], y[16:24])
    assert tr.rows_in_use() == {"readout": 16 if admit_replayed else 8}   # 4 rehearsals a step, or nothing
    rows = tr.memories()[("readout",)].rows()
    # what entered are copies of the first 8 rows' keys (rehearsals: RMSNorm of a normalised key, equal to
    # rounding), never a stream sample of steps 2 and 3
    first = rows["k"][:8]
    for k in rows["k"][8:]:
        assert np.min(np.abs(first - k).max(axis=1)) < 1e-5


def test_self_replay_needs_labels_on_the_first_layer():
    x, y = _data(16)
    tr = gm.Trainer(_net(1), sample_input=x[:4], replay=SelfReplay(4))
    with pytest.raises(ValueError, match="labels"):
        tr.step(x[:8], y[:8])
    tr = gm.Trainer(_net(1), sample_input=x[:4], policy=lambda key: policies.labels(), replay=SelfReplay(4, "readout"))
    with pytest.raises(ValueError, match="first growing layer"):
        tr.step(x[:8], y[:8])
    with pytest.raises(ValueError, match="integer >= 1"):
        SelfReplay(0)


# ---- capacity(on_full="merge"): evicted rows folded into their nearest row of the same class ----------------

def _memory(w, k, v, capacity=256):
    from growmem import memory as memlib
    mem = memlib.empty(k.shape[1], v.shape[1], capacity)
    return memlib.append(mem, jnp.asarray(w), jnp.asarray(k), jnp.asarray(v), jnp.arange(len(w), dtype=jnp.int32))


def test_absorb_folds_each_row_into_its_nearest_row_of_its_class_by_weighted_means():
    rng = np.random.default_rng(3)
    n, d, o = 12, 5, 3
    w, k, v = rng.uniform(0.1, 2.0, n).astype(np.float32), rng.normal(size=(n, d)).astype(np.float32), \
        rng.normal(size=(n, o)).astype(np.float32)
    lab = np.array([0, 0, 1, 1, 1, 2, 0, 1, 3, 0, 2, 2], np.int32)   # class 3 has one row only
    gone = np.zeros(256, bool)
    gone[[0, 4, 8, 9]] = True
    stay = np.zeros(256, bool)
    stay[:n] = ~gone[:n]
    mem = _memory(w, k, v)
    labels = np.full(256, -1, np.int32)
    labels[:n] = lab
    out = policies.absorb(mem, jnp.asarray(gone), jnp.asarray(stay), jnp.asarray(labels), 8)
    # the same by hand, in float64
    W, K, V = w.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    sw, sk, sv = W.copy(), (W[:, None] * K), (W[:, None] * V)
    for e in np.flatnonzero(gone[:n]):
        cand = [j for j in range(n) if stay[j] and lab[j] == lab[e]]
        if not cand:
            continue                                                   # class 3: no partner, it just leaves
        j = min(cand, key=lambda j: np.sum((K[j] - K[e]) ** 2))
        sw[j] += W[e]
        sk[j] += W[e] * K[e]
        sv[j] += W[e] * V[e]
    np.testing.assert_allclose(np.asarray(out.w)[:n], sw, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.k)[:n], sk / sw[:, None], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.v)[:n], sv / sw[:, None], rtol=1e-5, atol=1e-6)
    untouched = np.isclose(sw, W)
    assert untouched.sum() >= n - 4 and untouched[8]                  # only absorbing rows (and none for class 3)
    np.testing.assert_array_equal(np.asarray(out.k)[:n][untouched], k[untouched])   # bitwise


def test_absorbing_a_row_with_the_same_key_leaves_the_weighted_softmax_unchanged():
    """Two rows with one key are one row of summed weight and w-averaged value: the layer's output (an
    independent numpy formula, Σ w e^{q·k/T} ṽ / Σ w e^{q·k/T}) is the same before and after the fold."""
    rng = np.random.default_rng(4)
    k = rng.normal(size=(6, 4)).astype(np.float32)
    k[5] = k[2]
    w, v = rng.uniform(0.5, 1.5, 6).astype(np.float32), rng.normal(size=(6, 3)).astype(np.float32)
    labels = np.full(256, -1, np.int32)
    labels[:6] = [0, 1, 2, 0, 1, 2]
    gone = np.zeros(256, bool)
    gone[5] = True
    stay = np.zeros(256, bool)
    stay[:5] = True
    out = policies.absorb(_memory(w, k, v), jnp.asarray(gone), jnp.asarray(stay), jnp.asarray(labels), 4)
    q = rng.normal(size=(7, 4))

    def layer(w, k, v):
        a = np.exp(q @ k.T / 2.0) * w
        return a @ v / a.sum(1, keepdims=True)

    before = layer(w.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    after = layer(np.asarray(out.w)[:5].astype(np.float64), np.asarray(out.k)[:5].astype(np.float64),
                  np.asarray(out.v)[:5].astype(np.float64))
    np.testing.assert_allclose(after, before, rtol=1e-5)


def test_merge_at_the_cap_keeps_the_total_weight_and_the_class_balance():
    rng = np.random.default_rng(5)
    cap, d = 12, 4
    pol = policies.capacity(cap, on_full="merge", n_classes=3)
    mem = _memory(rng.uniform(0.1, 1, cap).astype(np.float32), rng.normal(size=(cap, d)).astype(np.float32),
                  rng.normal(size=(cap, 3)).astype(np.float32), capacity=256)
    state = pol.init(mem)
    state = policies.replace_row_state_leaves(
        state, 256, [jnp.asarray(np.r_[np.repeat([0, 1, 2], 4), -np.ones(256 - cap)].astype(np.int8))])
    rows = gm.rules.Rows(w=jnp.asarray(rng.uniform(0.1, 1, 4), jnp.float32),
                         k=jnp.asarray(rng.normal(size=(4, d)), jnp.float32),
                         v=jnp.asarray(rng.normal(size=(4, 3)), jnp.float32))
    targets = jnp.asarray([0, 0, 0, 1], jnp.int32)
    res = policies.step(pol, mem, rows, state, targets=targets)
    assert int(res.mem.size) == cap
    assert float(jnp.sum(res.mem.w[:cap])) == pytest.approx(float(jnp.sum(mem.w) + jnp.sum(rows.w)), rel=1e-6)
    lab = np.asarray(policies.stored_labels(res.state))[:cap]
    assert np.bincount(lab, minlength=3).tolist() == [4, 4, 4]        # class 0 folded its own three rows away
    with pytest.raises(ValueError, match="on_full must be one of .*'merge'"):
        policies.capacity(cap, on_full="merge_all")


# ---- a rehearsal layer beside the network (replay_memory): the buffer apart from the block ------------------

def test_a_rehearsal_layer_beside_the_network_is_what_self_replay_draws_from():
    """With ``replay_memory`` the network has a layer ``replay`` of its inputs that no loss reads: its rows are
    the samples seen with their classes, self-replay draws from it (so a block frozen on the first class does
    not limit what is rehearsed), and the network's outputs are those of the same network without it."""
    x, y = _data(96, classes=3)
    order = np.argsort(y, kind="stable")            # class 0, then 1, then 2: a class-incremental stream
    x, y = x[order], y[order]
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=0.003, beta=3.0)
    net = gm.ResidualGrowingNet(d_out=3, n_blocks=1, readout=spec, replay_memory=True)
    pol = {"block_0": policies.capacity(8, "reject"), "readout": policies.labels(),
           "replay": policies.capacity(60, "evict_balanced")}
    tr = gm.Trainer(net, sample_input=x[:4], policy=pol, replay=SelfReplay(6, layer="replay", seed=2))
    for i in range(0, 96, 8):
        tr.step(x[i:i + 8], y[i:i + 8])
    rows = tr.rows_in_use()
    assert rows["block_0"] == 8                     # frozen once full, on class 0 alone
    rep = tr.memories()[("replay",)]
    labels = np.asarray(policies.stored_labels(tr.state.policy_state["replay"]))[:rows["replay"]]
    assert rows["replay"] == 60 and sorted(np.bincount(labels, minlength=3)) == [20, 20, 20]   # balanced
    # its rows are the inputs (RMSNorm'd) with their classes: each a stream sample or a rehearsal of one
    q = np.asarray(gm.rms_norm(jnp.asarray(x)))
    keys = np.asarray(rep.k)[:rows["replay"]]
    for k, c in zip(keys, labels):
        j = int(np.argmin(np.abs(q - k).max(axis=1)))
        np.testing.assert_allclose(k, q[j], rtol=0, atol=1e-5)
        assert c == y[j]
    # the rehearsals come from it: classes the frozen block never stored are replayed
    xr, yr = tr._with_replay(jnp.asarray(x[:8]), jnp.asarray(y[:8]))
    assert set(np.asarray(yr)[8:].tolist()) - {0}
    for xi in np.asarray(xr)[8:]:
        assert np.min(np.abs(keys - xi).max(axis=1)) == 0.0
    # the outputs do not read it
    plain = gm.ResidualGrowingNet(d_out=3, n_blocks=1, readout=spec)
    v = tr.variables
    without = {"params": v["params"], "memory": {k: m for k, m in v["memory"].items() if k != "replay"}}
    np.testing.assert_array_equal(np.asarray(tr.predict(x)), np.asarray(plain.apply(without, jnp.asarray(x))))


def test_a_preset_with_a_rehearsal_layer_gives_it_its_own_policies_and_budget_share(tmp_path):
    from growmem import config
    from growmem.continual.learner import GrowmemConfig, GrowmemLearner, bytes_per_row
    from growmem.errors import ConfigError
    from growmem.memory import row_bytes

    pre = config.load("replay_dct_buffer_freeze")
    assert pre.replay_memory and pre.self_replay().layer == "replay"
    pol = pre.policies()
    assert "reject" in pol("block_0").name and "evict_balanced" in pol("replay").name
    assert bytes_per_row(pre, 100, 10) == row_bytes(100, 100, "bfloat16") + row_bytes(100, 10, "bfloat16") + \
        row_bytes(100, 1, "bfloat16")
    text = (config.PRESET_DIR / "replay_dct_buffer_freeze.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("replay_memory = true\n", ""))
    with pytest.raises(ConfigError, match="replay_memory = true"):
        config.load(bad)
    # under a budget every layer, the rehearsal layer too, holds the rows it allows: bytes in use within it
    rs = np.random.RandomState(0)
    learner = GrowmemLearner(GrowmemConfig(preset="replay_dct_buffer_freeze"), num_classes=10, seed=0,
                             budget_bytes=120_000)
    for _ in range(30):
        learner.step(rs.rand(16, 784).astype(np.float32), rs.randint(0, 10, 16))
    b = learner.memory_bytes()
    assert b["bytes_in_use"] <= 120_000
    rows = next(iter(learner.trainers.values())).rows()
    assert set(rows) == {"block_0", "readout", "replay"} and rows["replay"] == learner.max_rows
