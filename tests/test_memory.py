"""The Memory pytree (growmem.memory): append/select against numpy, geometric growth,
and the number of compilations a long run costs (DESIGN: O(log N) traces for N rows)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import growmem.train as train_mod
from growmem import GrowingLayer, GrowingSpec, ResidualGrowingNet, Trainer, backends, memory
from conftest import assert_in_place

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


def test_make_room_grows_geometrically_and_keeps_rows():
    """backends.make_room, the host drivers' one make-room step, on a RAM memory."""
    r = np.random.default_rng(3)
    mem = memory.empty(3, 2)
    assert mem.capacity == QUANTUM
    append = jax.jit(memory.append)
    all_k, caps, bound = [], [mem.capacity], 0
    for step in range(50):
        # b admitted rows out of a fixed 77 candidates (one shape: one compile per capacity)
        b = int(r.choice([1, 13, 77]))
        old_cap, need = mem.capacity, int(mem.size) + b
        grown, bound = backends.make_room(mem, b, bound)
        if need <= old_cap:
            assert grown is mem                                    # no copy when it fits
        else:   # geometric: at least double, rounded to the quantum
            assert grown.capacity == math.ceil(max(need, 2 * old_cap) / QUANTUM) * QUANTUM
            np.testing.assert_array_equal(grown.rows()["k"], mem.rows()["k"])
            caps.append(grown.capacity)
        w, k, v = random_rows(r, 77)
        mem = append(grown, w, k, v, step, np.arange(77) < b)
        bound += b
        all_k.append(k[:b])
    total = sum(len(k) for k in all_k)
    assert int(mem.size) == total
    np.testing.assert_array_equal(mem.rows()["k"], np.concatenate(all_k))
    # capacities at least double and end below 2N + quantum: O(log N) distinct values
    assert len(caps) <= math.log2(total / QUANTUM) + 2
    assert all(b >= 2 * a for a, b in zip(caps, caps[1:]))


def test_a_trainer_refuses_a_growth_factor_that_does_not_grow():
    model = ResidualGrowingNet(d_out=2, n_blocks=0, readout=GrowingSpec.make("weighted_softmax", eta=1.0, beta=0.5))
    with pytest.raises(ValueError, match="growth factor must be > 1, got 1.0"):
        Trainer(model, loss="squared_error", sample_input=np.zeros((1, 3), np.float32), growth=1.0)


def test_make_room_with_other_growth_factor_and_errors():
    mem = memory.from_rows(np.ones(250), np.zeros((250, 2)), np.zeros((250, 1)))
    grown, bound = backends.make_room(mem, 10, 250, growth=1.5)
    assert grown.capacity == math.ceil(max(260, math.ceil(256 * 1.5)) / QUANTUM) * QUANTUM and bound == 250
    big = memory.from_rows(np.ones(300), np.zeros((300, 2)), np.zeros((300, 1)))
    assert big.capacity == 2 * QUANTUM
    with pytest.raises(ValueError):
        memory.with_capacity(big, 100)                  # would drop rows in use
    with pytest.raises(ValueError):
        memory.empty(0, 3)
    with pytest.raises(ValueError):
        memory.from_rows(np.ones(3), np.zeros((3, 2)), np.zeros((4, 1)))


def test_make_room_is_the_drivers_one_step_and_reads_the_size_only_when_needed():
    """backends.make_room (Trainer and Store): room for ``extra`` rows past the caller's bound on the rows in
    use; the bound becomes the exact count only where the rows might not fit, or the grown memory's fill."""
    from growmem import backends

    def rows(n):
        return memory.from_rows(np.ones(n), np.zeros((n, 2)), np.zeros((n, 1)))

    full = rows(250)                                             # capacity 256
    assert backends.make_room(full, 6, 250) == (full, 250)       # fits by the bound: no sync, no copy
    grown, bound = backends.make_room(full, 10, 250)             # 260 > 256: max(260, 2 × 256)
    assert grown.capacity == 512 and bound == 250 and int(grown.size) == 250
    np.testing.assert_array_equal(grown.rows()["w"], full.rows()["w"])
    assert backends.make_room(full, 10, 250, growth=1.5)[0].capacity == math.ceil(384 / QUANTUM) * QUANTUM
    fewer = rows(200)                                            # a stale bound: the exact count is read
    assert backends.make_room(fewer, 10, 250) == (fewer, 200)
    # a capacity policy's max_rows: its evictions make the room, the capacity stops there
    assert backends.make_room(full, 10, 250, limit=252) == (full, 250)


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
    capacities, bound = set(), 0
    for t in range(steps):
        mem, bound = backends.make_room(mem, b, bound)
        bound += b
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


def test_building_a_trainer_lowers_a_few_programs_not_one_per_initialiser_op():
    """The model's initialisation is one compiled program (an eager init lowers a program per op: dozens for
    this net; each restart of a resumed run paid them), and its rows are the eager init's (to float32 rounding:
    XLA fuses the initialiser's ops)."""
    from collections import Counter

    from jax import monitoring

    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, init="random", init_rows=8)
    model = ResidualGrowingNet(d_out=3, n_blocks=2, block=spec, readout=spec, capacity=QUANTUM)
    x = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    events = []
    listener = lambda name, secs, **kw: events.append(name)
    monitoring.register_event_duration_secs_listener(listener)
    try:
        tr = Trainer(model, sample_input=x, rng=jax.random.key(3))
    finally:
        monitoring.unregister_event_duration_listener(listener)
    lowered = Counter(events)["/jax/core/compile/jaxpr_to_mlir_module_duration"]
    assert 1 <= lowered <= 8, lowered
    eager = train_mod.memories(model.init(jax.random.key(3), x))
    assert set(eager) == set(tr.memories()) and len(eager) == 3
    for path, m in tr.memories().items():
        a, b = m.rows(), eager[path].rows()
        assert len(a["w"]) == 8, path
        for f in a:
            np.testing.assert_allclose(np.asarray(a[f]), np.asarray(b[f]), rtol=1e-6, atol=1e-6, err_msg=str(path))


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


# --------------------------------------------------------------------------------------- eviction in place


@pytest.mark.parametrize("n_leave", [0, 3, 16, 40, 190])
def test_evict_and_append_keeps_exactly_the_kept_rows_and_the_admitted_candidates(n_leave):
    """Any number of evicted rows (fewer than the batch, or many times it: a pruning wave) —
    the rows in use afterwards are, as a set, the kept rows plus the admitted candidates (numpy),
    packed below the new size, with zeros after it."""
    r = np.random.default_rng(n_leave)
    n, b = 200, 16
    w, k, v = random_rows(r, n)
    born = np.arange(n, dtype=np.int32)
    mem = memory.from_rows(w, k, v, born, capacity=512)
    keep = np.ones(512, bool)
    keep[r.choice(n, n_leave, replace=False)] = False
    mask = r.random(b) < 0.7
    cw, ck, cv = random_rows(r, b)
    out, _ = memory.evict_and_append(mem, jnp.asarray(keep), cw, ck, cv, 1000, jnp.asarray(mask))
    m = int(out.size)
    kept = np.flatnonzero(keep[:n])
    assert m == len(kept) + mask.sum()
    want_k = np.concatenate([k[kept], ck[mask]])
    want_born = np.concatenate([born[kept], np.full(mask.sum(), 1000)])
    got_k, got_born = np.asarray(out.k)[:m], np.asarray(out.born)[:m]
    order_got, order_want = np.lexsort(got_k.T[::-1]), np.lexsort(want_k.T[::-1])
    np.testing.assert_array_equal(got_k[order_got], want_k[order_want])
    np.testing.assert_array_equal(got_born[order_got], want_born[order_want])
    w_all, v_all = np.concatenate([w[kept], cw[mask]]), np.concatenate([v[kept], cv[mask]])
    np.testing.assert_array_equal(np.asarray(out.w)[:m][order_got], w_all[order_want])
    np.testing.assert_array_equal(np.asarray(out.v)[:m][order_got], v_all[order_want])
    assert_padding_zero(out)


def test_the_evicting_update_copies_no_row_table():
    """Eviction + append compiled with the memory donated touches only the rows that change:
    XLA's program holds no copy of a (C, d) table (a lax.cond between an in-place and a
    compacting path made it copy every table on every step)."""
    r = np.random.default_rng(0)
    w, k, v = random_rows(r, 300, d_in=64, d_out=64)
    mem = memory.from_rows(w, k, v, np.arange(300, dtype=np.int32), capacity=1024)
    cw, ck, cv = random_rows(r, 16, d_in=64, d_out=64)
    step = jax.jit(lambda m, keep: memory.evict_and_append(m, keep, cw, ck, cv, 7, jnp.ones(16, bool))[0],
                   donate_argnums=0)
    table = 1024 * 64 * 4
    assert_in_place(step.lower(mem, jnp.ones(1024, bool)).compile(), table, tables=2)   # k and v
    # the check itself: a program that must materialise a reordered table fails it
    rev = jax.jit(lambda m, keep: memory.evict_and_append(m.replace(k=jnp.flip(m.k, 0) * keep[:, None]), keep,
                                                          cw, ck, cv, 7, jnp.ones(16, bool))[0], donate_argnums=0)
    with pytest.raises(AssertionError, match="scratch"):
        assert_in_place(rev.lower(mem, jnp.ones(1024, bool)).compile(), table, tables=2)


def test_keep_freed_memory_stops_the_page_faults_of_reallocating_large_buffers():
    """growmem.runtime.keep_freed_memory (glibc): a 50 MB buffer freed and allocated again costs
    page faults every time without it (malloc unmaps it), none with it. Run in a fresh process:
    the setting is process-wide."""
    import subprocess
    import sys
    code = """
import resource, sys, numpy as np
from growmem.runtime import keep_freed_memory
if sys.argv[1] == "on":
    assert keep_freed_memory()["applied"]
def cycle():
    a = np.ones((16384, 784), np.float32); del a
cycle()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10): cycle()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 10)
"""
    faults = {mode: float(subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                                         check=True).stdout) for mode in ("off", "on")}
    assert faults["off"] > 100 and faults["on"] < 10, faults
    import os
    env = dict(os.environ, GROWMEM_MALLOC="system")
    out = subprocess.run([sys.executable, "-c", "from growmem.runtime import keep_freed_memory as k; print(k())"],
                         capture_output=True, text=True, check=True, env=env).stdout
    assert "'applied': False" in out and "GROWMEM_MALLOC=system" in out


def test_exec_with_huge_pages_reexecutes_with_the_tunable_and_cuts_the_faults_of_new_memory():
    """growmem.runtime.exec_with_huge_pages: the same command line runs again with glibc's
    hugetlb tunable added to the ones already set; 256 MB of fresh malloc memory then faults per
    2 MiB page instead of per 4 KiB page. GROWMEM_MALLOC=system, or a tunable already set, keeps
    the process as it is (no re-exec loop)."""
    import os
    import subprocess
    import sys

    from growmem import runtime
    code = """
import ctypes, os, resource, sys
from growmem.runtime import exec_with_huge_pages
exec_with_huge_pages()
libc = ctypes.CDLL("libc.so.6"); libc.malloc.restype = ctypes.c_void_p
n = 256 << 20
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
p = libc.malloc(n); ctypes.memset(p, 1, n)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0, os.environ.get("GLIBC_TUNABLES"), sys.argv[1:])
"""

    def run(**env):
        out = subprocess.run([sys.executable, "-c", code, "a", "b"], capture_output=True, text=True, check=True,
                             env={**{k: v for k, v in os.environ.items()
                                     if k not in ("GLIBC_TUNABLES", runtime.REEXEC_MARK)}, **env}).stdout.split(" ", 2)
        return int(out[0]), out[1], out[2].strip()

    off_faults, off_tun, _ = run(GROWMEM_MALLOC="system", GLIBC_TUNABLES="glibc.malloc.arena_max=4")
    assert off_tun == "glibc.malloc.arena_max=4" and off_faults > 60_000    # 65,536 pages of 4 KiB
    with open(runtime.THP_SETTING) as f:
        thp = f.read()
    if "[never]" in thp:    # the kernel has no huge pages for us: nothing to gain, so no re-exec
        assert runtime.huge_pages_env({}) is None
        return
    faults, tun, argv = run(GLIBC_TUNABLES="glibc.malloc.arena_max=4")
    assert tun == "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1" and argv == "['a', 'b']"
    assert faults < off_faults / 20, (faults, off_faults)
    # already set by the user: left alone
    assert runtime.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert runtime.huge_pages_env({runtime.REEXEC_MARK: "1"}) is None


def test_appending_to_a_bfloat16_memory_stores_the_rounded_rows_exactly():
    """bf16 tables are written through their uint16 bits: the stored rows are numpy's
    bfloat16 rounding of the candidates, the other rows untouched."""
    r = np.random.default_rng(5)
    w, k, v = random_rows(r, 40)
    mem = memory.from_rows(w, k, v, capacity=256, row_dtype="bfloat16")
    cw, ck, cv = random_rows(r, 8)
    mask = np.array([1, 0, 1, 1, 0, 1, 1, 1], bool)
    out = jax.jit(lambda m: memory.append(m, cw, ck, cv, 3, jnp.asarray(mask)))(mem)
    assert out.k.dtype == jnp.bfloat16 and int(out.size) == 46
    want_k = np.concatenate([k, ck[mask]]).astype(jnp.bfloat16)
    want_v = np.concatenate([v, cv[mask]]).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(out.k)[:46], want_k)
    np.testing.assert_array_equal(np.asarray(out.v)[:46], want_v)
    assert_padding_zero(out)


def test_finite_rows_is_the_one_non_finite_filter_on_host_and_under_jit():
    from growmem.memory import finite_rows
    w = np.array([1.0, np.nan, 2.0, 3.0], np.float32)
    k = np.ones((4, 3), np.float32)
    k[2, 1] = np.inf
    v = np.ones((4, 2, 2), np.float32)
    v[3, 1, 0] = -np.inf
    want = [True, False, False, False]
    assert finite_rows(w, k, v).tolist() == want and isinstance(finite_rows(w, k, v), np.ndarray)
    got = jax.jit(lambda *a: finite_rows(*a))(jnp.asarray(w), jnp.asarray(k), jnp.asarray(v))
    assert np.asarray(got).tolist() == want
    assert finite_rows(k).tolist() == [True, True, False, True]
