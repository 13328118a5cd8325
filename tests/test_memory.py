"""The Memory pytree (growmem.memory): append/select against numpy, geometric growth,
and the number of compilations a long run costs (DESIGN: O(log N) traces for N rows)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import growmem.train as train_mod
from growmem import GrowingLayer, GrowingSpec, ResidualGrowingNet, Trainer, memory

QUANTUM = 256  # rows are allocated in multiples of this (memory.ROW_QUANTUM)


def random_rows(r, n, d_in=3, d_out=2):
    return (r.uniform(0.1, 1.0, n).astype(np.float32), r.normal(size=(n, d_in)).astype(np.float32),
            r.normal(size=(n, d_out)).astype(np.float32))


def assert_padding_zero(mem):
    n = int(mem.size)
    for name in ("w", "k", "v", "born"):
        np.testing.assert_array_equal(np.asarray(getattr(mem, name))[n:], 0, err_msg=name)


def test_round_capacity_is_smallest_multiple_of_quantum():
    assert memory.ROW_QUANTUM == QUANTUM
    for n in (0, 1, 255, 256, 257, 1000):
        c = memory.round_capacity(n)
        assert c % QUANTUM == 0 and c >= max(n, 1) and c - QUANTUM < max(n, 1)


@pytest.mark.parametrize("per_row_born", [False, True])
def test_append_with_mask_packs_admitted_rows_contiguously(per_row_born):
    r = np.random.default_rng(0)
    w0, k0, v0 = random_rows(r, 11)
    mem = memory.from_rows(w0, k0, v0)
    assert int(mem.size) == 11 and mem.capacity == QUANTUM
    append = jax.jit(memory.append)
    expect = {"w": [w0], "k": [k0], "v": [v0], "born": [np.full(11, memory.BORN_INITIAL)]}
    for step in range(1, 6):
        w, k, v = random_rows(r, 16)
        mask = r.uniform(size=16) < 0.4
        mask[step] = True  # at least one admitted row
        born = np.arange(16, dtype=np.int32) + 100 * step if per_row_born else step
        mem = append(mem, w, k, v, born, mask)
        expect["w"].append(w[mask]); expect["k"].append(k[mask]); expect["v"].append(v[mask])
        expect["born"].append(np.broadcast_to(born, (16,))[mask])
        rows = mem.rows()
        for name, parts in expect.items():
            np.testing.assert_array_equal(rows[name], np.concatenate(parts), err_msg=f"{name} step {step}")
        assert_padding_zero(mem)
    # mask=None admits every candidate
    w, k, v = random_rows(r, 4)
    n = int(mem.size)
    mem = memory.append(mem, w, k, v, born=9)
    np.testing.assert_array_equal(mem.rows()["k"][n:], k)
    assert int(mem.size) == n + 4


def test_append_past_capacity_keeps_first_rows_that_fit_and_saturates():
    r = np.random.default_rng(1)
    w0, k0, v0 = random_rows(r, QUANTUM - 5)
    mem = memory.from_rows(w0, k0, v0)
    w, k, v = random_rows(r, 20)
    mask = np.ones(20, bool)
    mask[[0, 2, 3]] = False
    out = memory.append(mem, w, k, v, born=1, mask=mask)
    assert int(out.size) == QUANTUM == out.capacity
    np.testing.assert_array_equal(out.rows()["k"], np.concatenate([k0, k[mask][:5]]))
    np.testing.assert_array_equal(out.rows()["v"], np.concatenate([v0, v[mask][:5]]))


def test_select_compacts_kept_rows_in_order():
    r = np.random.default_rng(2)
    n = 40
    w0, k0, v0 = random_rows(r, n)
    born = r.integers(0, 50, n)
    mem = memory.from_rows(w0, k0, v0, born)
    keep = r.uniform(size=mem.capacity) < 0.5
    keep[n:] = True   # rows past `size` are never resurrected
    out = jax.jit(memory.select)(mem, keep)
    kept = keep[:n]
    assert int(out.size) == kept.sum() and out.capacity == mem.capacity
    rows = out.rows()
    for name, a in (("w", w0), ("k", k0), ("v", v0), ("born", born)):
        np.testing.assert_array_equal(rows[name], a[kept], err_msg=name)
    assert_padding_zero(out)
    # keeping nothing empties the memory
    assert int(memory.select(mem, np.zeros(mem.capacity, bool)).size) == 0


def test_ensure_capacity_grows_geometrically_and_keeps_rows():
    r = np.random.default_rng(3)
    mem = memory.empty(3, 2)
    assert mem.capacity == QUANTUM
    append = jax.jit(memory.append)
    all_k, caps = [], [mem.capacity]
    for step in range(50):
        # b admitted rows out of a fixed 77 candidates (one shape: one compile per capacity)
        b = int(r.choice([1, 13, 77]))
        old_cap, need = mem.capacity, int(mem.size) + b
        grown = memory.ensure_capacity(mem, b)
        if need <= old_cap:
            assert grown is mem                                    # no copy when it fits
        else:   # geometric: at least double, rounded to the quantum
            assert grown.capacity == math.ceil(max(need, 2 * old_cap) / QUANTUM) * QUANTUM
            np.testing.assert_array_equal(grown.rows()["k"], mem.rows()["k"])
            caps.append(grown.capacity)
        w, k, v = random_rows(r, 77)
        mem = append(grown, w, k, v, step, np.arange(77) < b)
        all_k.append(k[:b])
    total = sum(len(k) for k in all_k)
    assert int(mem.size) == total
    np.testing.assert_array_equal(mem.rows()["k"], np.concatenate(all_k))
    # capacities at least double and end below 2N + quantum: O(log N) distinct values
    assert len(caps) <= math.log2(total / QUANTUM) + 2
    assert all(b >= 2 * a for a, b in zip(caps, caps[1:]))


def test_ensure_capacity_with_other_growth_factor_and_errors():
    mem = memory.from_rows(np.ones(250), np.zeros((250, 2)), np.zeros((250, 1)))
    grown = memory.ensure_capacity(mem, 10, growth=1.5)
    assert grown.capacity == math.ceil(max(260, math.ceil(256 * 1.5)) / QUANTUM) * QUANTUM
    with pytest.raises(ValueError):
        memory.ensure_capacity(mem, 10, growth=1.0)
    big = memory.from_rows(np.ones(300), np.zeros((300, 2)), np.zeros((300, 1)))
    assert big.capacity == 2 * QUANTUM
    with pytest.raises(ValueError):
        memory.with_capacity(big, 100)                  # would drop rows in use
    with pytest.raises(ValueError):
        memory.empty(0, 3)
    with pytest.raises(ValueError):
        memory.from_rows(np.ones(3), np.zeros((3, 2)), np.zeros((4, 1)))


# ---------------------------------------------------------------- compilation count


def test_thousand_appends_trace_log_n_times():
    b, steps, d_in, d_out = 8, 1000, 4, 2
    r = np.random.default_rng(4)
    ks = r.normal(size=(steps, b, d_in)).astype(np.float32)
    vs = r.normal(size=(steps, b, d_out)).astype(np.float32)
    ws = r.uniform(size=(steps, b)).astype(np.float32)
    traces = []

    @jax.jit
    def append_batch(mem, w, k, v, born):
        traces.append(mem.capacity)     # runs once per trace (python side effect)
        return memory.append(mem, w, k, v, born)

    mem = memory.empty(d_in, d_out)
    capacities = set()
    for t in range(steps):
        mem = memory.ensure_capacity(mem, b)
        capacities.add(mem.capacity)
        mem = append_batch(mem, ws[t], ks[t], vs[t], t)
    n = steps * b
    assert int(mem.size) == n
    bound = math.log2(n / QUANTUM) + 3
    assert len(traces) <= bound, (len(traces), traces)
    assert len(traces) == len(capacities)            # exactly one trace per capacity
    assert append_batch._cache_size() == len(traces)
    rows = mem.rows()
    np.testing.assert_array_equal(rows["k"], ks.reshape(n, d_in))
    np.testing.assert_array_equal(rows["born"], np.repeat(np.arange(steps), b))


def test_trainer_traces_its_step_log_n_times(monkeypatch):
    kernel = "weighted_softmax"
    b, steps, d = 8, 150, 4
    traces, grad_traces = [], []
    original, original_grads = train_mod.apply_step, train_mod.step_gradients

    def counting_apply_step(*args, **kwargs):
        traces.append(1)                # python side effect: once per trace
        return original(*args, **kwargs)

    def counting_step_gradients(*args, **kwargs):
        grad_traces.append(1)
        return original_grads(*args, **kwargs)

    monkeypatch.setattr(train_mod, "apply_step", counting_apply_step)
    monkeypatch.setattr(train_mod, "step_gradients", counting_step_gradients)
    spec = GrowingSpec.make(kernel, eta=0.1, beta=0.1, init="random", init_rows=b)
    # start small so that the run has to grow the memories several times
    net = GrowingLayer(spec, 2, capacity=QUANTUM)
    r = np.random.default_rng(5)
    xs = r.normal(size=(steps, b, d)).astype(np.float32)
    ys = r.normal(size=(steps, b, 2)).astype(np.float32)
    trainer = Trainer(net, loss="squared_error", sample_input=xs[0], rng=jax.random.key(0))
    init_rows = b
    for x, y in zip(xs, ys):
        trainer.step(x, y)
    n = init_rows + steps * b
    assert list(trainer.rows_in_use().values()) == [n]
    caps = {m.capacity for m in trainer.memories().values()}
    assert caps == {memory.round_capacity(2 ** math.ceil(math.log2(n / QUANTUM)) * QUANTUM)}
    assert 1 <= len(traces) <= math.log2(n / QUANTUM) + 3, len(traces)
    assert trainer._apply._cache_size() == len(traces) == len(grad_traces) == trainer._grads._cache_size()
    assert np.isfinite(np.asarray(trainer.predict(xs[0]))).all()


def test_trainer_two_programs_equal_the_one_program_train_step():
    """Trainer runs step_gradients and a donated apply_step; the composition is train_step."""
    from growmem import policies

    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=0.5, init="random", init_rows=8)
    model = ResidualGrowingNet(d_out=3, n_blocks=1, block=spec, readout=spec, capacity=QUANTUM)
    r = np.random.default_rng(0)
    xs = r.normal(size=(6, 8, 5)).astype(np.float32)
    ys = r.integers(0, 3, size=(6, 8))
    tr = Trainer(model, loss="cross_entropy", sample_input=xs[0],
                 policy=policies.chain(policies.novelty(0.5), policies.weight_decay(0.01)))
    state = jax.tree.map(jnp.copy, tr.state)
    one = jax.jit(lambda st, x, y: train_mod.train_step(model, train_mod.cross_entropy, None, st, x, y))
    for x, y in zip(xs, ys):
        tr.step(x, y)
        state, _ = one(state, jnp.asarray(x), jnp.asarray(y))
    got, ref = tr.memories(), train_mod.memories(state.collections)
    assert int(state.step) == int(tr.state.step) == len(xs)
    for path in ref:
        a, b = got[path].rows(), ref[path].rows()
        assert len(a["w"]) == len(b["w"]) > 8
        for f in ("w", "k", "v", "born"):
            np.testing.assert_allclose(a[f], b[f], rtol=1e-5, atol=1e-6)
