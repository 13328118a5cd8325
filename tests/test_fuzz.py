"""Property-based fuzzing (hypothesis) of what users type and feed: size strings, preset TOML files,
command lines of every command, and arrays with NaN/Inf, wrong dtypes and shapes into the memories.

Each property: the input is accepted, or refused by one of growmem's own errors in one line; never a
traceback of another kind, never a non-finite row stored, never a file written by a refused command.
The example counts (``max_examples``) add up to more than 2,000 generated cases per run; the seed is
fixed (``derandomize``) so that a failure reproduces, and printed by hypothesis when one occurs."""
import argparse
import math

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from growmem import config  # noqa: E402
from growmem.errors import GrowmemError  # noqa: E402
from growmem.units import parse_size  # noqa: E402

def fuzz(n: int):
    """``n`` generated cases, the same ones every run (a failure reproduces), no example database."""
    return settings(max_examples=n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much])
COUNTS = {"sizes": 600, "presets": 500, "argv": 600, "arrays": 360, "order_free": 240}


def one_line(e: BaseException) -> bool:
    return len(" ".join(str(e).split())) > 0 and "Traceback" not in str(e)


# ----------------------------------------------------------------------------- sizes

SIZE_TEXT = st.one_of(
    st.text(max_size=12),
    st.builds(lambda n, u, sp: f"{n}{sp}{u}",
              st.one_of(st.integers(-10 ** 30, 10 ** 30).map(str), st.floats(allow_nan=True).map(repr),
                        st.text("0123456789.", min_size=1, max_size=420)),
              st.sampled_from(["", "B", "KB", "kb", "MB", "MiB", "GB", "GiB", "TB", "XB", "mb ", "M", "%"]),
              st.sampled_from(["", " ", "\t"])))


@fuzz(COUNTS["sizes"])
@given(SIZE_TEXT)
def test_a_size_is_a_non_negative_byte_count_or_one_value_error(text):
    from growmem.app.options import _size

    try:
        n = parse_size(text)
    except ValueError as e:
        assert one_line(e) and "size" in str(e)
    else:
        assert isinstance(n, int) and 0 <= n < 2 ** 63
    try:
        n = _size(text)                              # the type of --ram-budget / --memory-budget
    except argparse.ArgumentTypeError as e:
        assert one_line(e)
    else:
        assert n > 0


# ----------------------------------------------------------------------------- preset files

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _toml(doc: dict) -> str:
    head, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append(f"[{k}]\n" + "".join(f"{kk} = {_toml_value(vv)}\n" for kk, vv in v.items()))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            tables += [f"[[{k}]]\n" + "".join(f"{kk} = {_toml_value(vv)}\n" for kk, vv in x.items()) for x in v]
        else:
            head.append(f"{k} = {_toml_value(v)}\n")
    return "".join(head) + "\n".join(tables)


VALUES = st.one_of(st.booleans(), st.integers(-10 ** 6, 10 ** 7), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from(["weighted_softmax", "rbf", "linear", "dct", "identity", "evict_balanced",
                                    "merge", "block", "readout", "bfloat16", "", "x"]),
                   st.lists(st.integers(0, 5), max_size=3))


def _table(keys):
    return st.dictionaries(st.sampled_from(sorted(keys) + ["bogus"]), VALUES, max_size=5)


PRESETS = st.builds(
    lambda desc, parts: {**({"description": desc} if desc is not None else {}), **parts},
    st.one_of(st.none(), st.text(max_size=30)),
    st.fixed_dictionaries({}, optional={
        "model": _table(config.MODEL), "layer": _table(config.LAYER), "readout": _table(config.LAYER),
        "train": _table(config.TRAIN), "replay": _table(config.REPLAY), "target": _table(config.TARGET),
        "keys": _table(config.KEYS),
        "policy": st.lists(st.builds(lambda name, rest: {"name": name, **rest},
                                     st.sampled_from(sorted(config.POLICIES) + ["forget"]),
                                     _table({k for p in config.POLICIES.values() for k in p} | {"layer"})),
                           max_size=3)}))


@fuzz(COUNTS["presets"])
@given(PRESETS)
def test_a_preset_file_loads_or_is_refused_naming_the_file(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("preset") / "fuzzed.toml"
    path.write_text(_toml(doc))
    try:
        p = config.load(path)
    except config.ConfigError as e:
        assert one_line(e) and str(path) in str(e)
    else:
        assert p.description and str(p.path) == str(path)


# ----------------------------------------------------------------------------- command lines

def _commands():
    """``{(command, ...): [option strings]}`` of every command of ``growmem``, read from its parser."""
    from growmem.app.cli import build_parser

    out = {}

    def walk(parser, prefix):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[prefix] = sorted(s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help"))
        for a in subs:
            for name, p in a.choices.items():
                walk(p, prefix + (name,))

    walk(build_parser(), ())
    return out


COMMANDS = _commands()
ARG_VALUES = ["0", "-1", "1", "3", "1.5", "nan", "inf", "-inf", "1e309", str(2 ** 64), "1,2", "1,x", "x", "",
              "1MB", "0.1MB", "15.7XB", "-1MB", "1B", "target:dct", "knn:dct", "split_mnist", "drifting_teacher",
              "weighted_softmax", "capped", "smoke", "cpu", "{dir}/nowhere", "{dir}/a_file", "{dir}/folder",
              "{dir}/x%41y", "{dir}/a#b", "mnist", "--", "-"]


@st.composite
def argvs(draw):
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    argv = list(cmd)
    for _ in range(draw(st.integers(0, 4))):
        flag = draw(st.sampled_from(COMMANDS[cmd] + ["--no-such-flag"])) if COMMANDS[cmd] else "--no-such-flag"
        argv.append(flag)
        if draw(st.booleans()):
            argv.append(draw(st.sampled_from(ARG_VALUES)))
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(ARG_VALUES)))      # a stray positional
    return argv


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    d = tmp_path_factory.mktemp("argv")
    (d / "a_file").write_text("x")
    (d / "folder").mkdir()
    return d


def _tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@fuzz(COUNTS["argv"])
@given(argvs())
def test_a_command_line_is_parsed_and_checked_or_refused_in_one_line_touching_nothing(sandbox, argv):
    """``growmem``'s parse and pre-run checks (what ``main`` runs before a command): a growmem error or a
    namespace, no other exception, and no file or folder made."""
    from growmem import environment
    from growmem.app.cli import build_parser

    argv = [a.replace("{dir}", str(sandbox)) for a in argv]
    before = _tree(sandbox)
    try:
        args = build_parser().parse_args(argv)
        environment.check()
        if getattr(args, "check", None) is not None:
            args.check(args)
    except GrowmemError as e:
        assert one_line(e), (argv, e)
    assert _tree(sandbox) == before, argv


# ----------------------------------------------------------------------------- arrays into memories

def _batch(dtype, shape):
    """Arrays of ``dtype`` whose floats include NaN, ±inf, subnormals and the extremes of the dtype."""
    dt = np.dtype(dtype)
    return hnp.arrays(dt, shape, elements=st.floats(width=dt.itemsize * 8) if dt.kind == "f" else None)


BATCHES = st.tuples(st.sampled_from([np.float32, np.float64, np.float16, np.int32]),
                    st.sampled_from([(4, 6), (4, 5), (4,), (0, 6), (4, 6, 1)]),
                    st.sampled_from([(4, 2), (4, 3), (3, 2), (4,)])).flatmap(
    lambda t: st.tuples(_batch(t[0], t[1]), _batch(np.float32, t[2])))


@pytest.fixture(scope="module")
def memories():
    """One Store, one TargetMemory, one Trainer and the three order-free models (d = 6, e = 2), built once;
    each case appends to them."""
    import jax

    import growmem as gm
    from growmem.keyspaces import Identity
    from growmem.nadaraya import TargetMemory
    from growmem.store import Store

    spec = gm.GrowingSpec.make("rbf", eta=0.1)
    store = Store.create(spec, 6, 2, name="fuzz")
    # bfloat16 rows: a finite float32 near its top (3.4e38) rounds to inf there
    store_bf16 = Store.create(gm.GrowingSpec.make("rbf", eta=0.1, row_dtype="bfloat16"), 6, 2, name="fuzz_bf16")
    target = TargetMemory(Identity(6), 2, temperature=1.0)
    net = gm.ResidualGrowingNet(d_out=2, n_blocks=0, readout=gm.GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0))
    trainer = gm.Trainer(net, loss="squared_error", sample_input=np.zeros((4, 6), np.float32), rng=jax.random.key(0))
    from growmem.order_free import KNN, NCM, SLDA
    order_free = {"knn": KNN(Identity(6), 2, budget_bytes=4_000), "ncm": NCM(Identity(6), 2), "slda": SLDA(Identity(6), 2)}
    return {"store": store, "store_bf16": store_bf16, "target": target, "trainer": trainer, **order_free}


def _finite_rows(rows) -> bool:
    return all(np.isfinite(np.asarray(rows[f], np.float64)).all() for f in ("w", "k", "v") if f in rows)


@fuzz(COUNTS["arrays"])
@given(st.sampled_from(["store", "store_bf16", "from_rows", "target", "trainer"]), BATCHES)
def test_arrays_with_nan_inf_wrong_dtypes_or_shapes_never_store_a_non_finite_row(memories, which, batch):
    from growmem.store import Store

    x, y = batch
    m = memories.get(which)
    try:
        if which in ("store", "store_bf16"):
            m.append(np.ones(len(x), np.float32), x, y)
        elif which == "from_rows":   # a store built from the rows at once (bfloat16): built finite, or refused
            m = Store.from_rows(np.ones(len(x), np.float32), x, y, spec=memories["store_bf16"].spec)
            assert m.mem.k.dtype == np.dtype("bfloat16")
        elif which == "target":
            m.observe(x, y)
        else:
            m.step(x, y)
    except (GrowmemError, ValueError) as e:   # a refusal: growmem's own, or a ValueError that names the problem
        assert one_line(e), e
    if m is None:
        return
    stored = [m.rows()] if which in ("store", "store_bf16", "from_rows") else [mem.rows() for mem in m.mems] if which == "target" else \
        [mem.rows() for mem in m.memories().values()]
    assert all(_finite_rows(r) for r in stored)


#: class labels for 4 inputs: mostly valid (ints or integral floats in {0, 1}), sometimes out of range or too few
LABELS = st.one_of(hnp.arrays(np.int64, (4,), elements=st.integers(0, 1)),
                   hnp.arrays(np.float32, (4,), elements=st.sampled_from([0.0, 1.0])),
                   hnp.arrays(np.int64, (4,), elements=st.integers(0, 1)),
                   hnp.arrays(np.int64, st.sampled_from([(4,), (3,)]), elements=st.integers(-3, 4)))
ORDER_FREE_BATCHES = st.tuples(st.sampled_from([np.float32, np.float64, np.float16, np.int32]),
                               st.sampled_from([(4, 6), (4, 6), (4, 5), (4,)])).flatmap(
    lambda t: st.tuples(_batch(t[0], t[1]), LABELS))


def test_order_free_models_keep_a_finite_state_and_answer_finite_scores(memories):
    """kNN (a class-balanced reservoir at its budget), NCM and SLDA: a batch is learnt (its non-finite keys
    dropped and counted) or refused in one line; the state stays finite and a finite query gets finite scores.
    Not vacuous: each model keeps samples from the generated batches."""
    learnt = {"knn": 0, "ncm": 0, "slda": 0}

    @fuzz(COUNTS["order_free"])
    @given(st.sampled_from(sorted(learnt)), ORDER_FREE_BATCHES)
    def check(which, batch):
        x, y = batch
        m = memories[which]
        try:
            learnt[which] += m.observe(x, y)["stored"]
        except (GrowmemError, ValueError) as e:
            assert one_line(e), e
        for name, a in m.state().items():
            a = np.asarray(a)
            if a.dtype.kind == "f":
                assert np.isfinite(a).all(), (which, name)
        scores = m.predict(np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6))
        assert scores.shape == (2, 2) and np.isfinite(scores).all()

    check()
    assert all(n >= 20 for n in learnt.values()), learnt


def test_a_value_past_the_stored_dtypes_range_is_seen_as_the_inf_it_would_become():
    """Found by review: the finite check ran before the cast to the stored dtype, so a float64 1e300
    (float32 rows) or a float32 3.4e38 (bfloat16 rows) passed it and was stored as inf."""
    import growmem as gm
    from growmem.store import Store

    k = np.zeros((3, 6), np.float64)
    k[1, 2] = 1e300
    v = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="1 of the 3 rows are not finite"):
        Store.from_rows(np.ones(3), k, v, spec=gm.GrowingSpec.make("rbf", eta=0.1))
    bf16 = gm.GrowingSpec.make("rbf", eta=0.1, row_dtype="bfloat16")
    k32 = np.zeros((3, 6), np.float32)
    k32[2, 0] = 3.4e38                            # finite in float32, inf in bfloat16
    with pytest.raises(ValueError, match="1 of the 3 rows are not finite"):
        Store.from_rows(np.ones(3), k32, v, spec=bf16)
    store = Store.create(bf16, 6, 2)
    store.append(np.ones(3, np.float32), k32, v)
    assert store.size == 2 and store.dropped_nonfinite == 1
    assert np.isfinite(np.asarray(store.rows()["k"], np.float32)).all()
