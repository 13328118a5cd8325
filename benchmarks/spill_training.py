"""Training under a RAM budget: a ``Trainer`` on the ``Tiered`` backend against the same model all in RAM.

One run trains the same ``ResidualGrowingNet`` (one weighted-softmax block + a
weighted-softmax readout, ``init="random"``, the settings of
``policies/weighted_softmax.toml``) two ways on the same data stream, the steps
interleaved (step i of one trainer, then step i of the other, the order alternating),
so both see the same machine load:

* **ram** — a plain ``Trainer``: every row in RAM;
* **spill** — the same trainer with ``backend=Tiered(dir, ram_budget_bytes=budget)``,
  ``budget = budget_fraction × the bytes of the final rows``; older rows spill to a
  TensorStore zarr tier on disk and every jitted step still reads them (a scan over the
  cold chunks through ``jax.pure_callback``, rematerialised in the backward pass).

Measured (all ratios within this run):

* step time of both as the rows grow: per window of steps, the median of the steps that
  compiled nothing, and the mean (which includes the spill writes); ``step_time_ratio``
  is the median over the final window of the per-step ratio t_spill / t_ram;
* where the spill step's time goes: time inside the host callbacks
  (``ColdStore.read_chunk``, split into issuing TensorStore reads, waiting for them, and
  the lazy-decay/padding step), the spill writes (``Tiered._spill``), the bytes of
  cold rows read per step;
* the raw sequential read bandwidth of the tier's chunk files (plain ``readinto``, warm
  page cache — the regime the training steps run in), hence the *read floor*: the time
  to read the bytes the callbacks read per step (≈ the readout's cold rows twice,
  forward + rematerialised backward, and the block's once: nothing differentiates the
  block's retrieval); ``spill_overhead_over_read_floor = (t_spill − t_ram) / floor``;
* on the final states, without the append (interleaved): the forward pass alone and the
  forward + backward pass of each way (``forward_ratio``, ``fwd_bwd_ratio``), and the same
  for the spill way with the callbacks handing over chunks already in RAM instead of reading
  the tier (``*_cached_chunks``): what is left is the cost of the callback structure (scan,
  callbacks, rematerialisation), the rest is the tier reads; plus a microbenchmark of one
  ``pure_callback`` returning a chunk, and the whole-table copies XLA inserts in each way's
  compiled train step (before the Trainer split its step into a gradient and a donated update
  program, the all-in-RAM step copied its key tables at the full capacity every step, which
  made it slower than its forward + backward suggests; the committed cpu results are from
  after the split: 0 copies);
* predictions of both on a held-out batch (``max_pred_diff``) and its accuracy;
* rows hot / cold at the end, the RAM budget, the cold bytes;
* peak RSS: each way trained again alone in a child process (``VmHWM``, the RSS sampled
  every step, and the RSS at the end after glibc's ``malloc_trim``), so the two do not
  share one peak (the cpu and paper presets; ``--rss`` / ``--no-rss`` override).

Data: MNIST (``growmem.data.mnist``: ``$GROWMEM_DATA`` or ``../shared/data/mnist``,
RMS-normalised images) when found and ``--data auto|mnist``, else a synthetic stream
(Gaussian inputs labelled by a fixed random linear teacher); the smoke preset is
synthetic. The tiers are written under ``--workdir`` (default: a fresh directory in
/tmp, never inside the repository) and deleted at the end.

    python benchmarks/spill_training.py --preset smoke     # seconds
    python benchmarks/spill_training.py --preset cpu       # minutes, >= 100 MB of cold rows
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402
from _common import peak_rss_gb, raw_read  # noqa: E402
import growmem as gm  # noqa: E402
from growmem.layers import DEFAULT_CAPACITY  # noqa: E402
from growmem.backends import tiered as spill_mod  # noqa: E402
from growmem.backends.tiered import Tiered, row_bytes  # noqa: E402

NAME = "spill_training"
GB = 1 << 30

# the layer settings of policies/weighted_softmax.toml (App. G.2), one block + readout
LAYER = dict(temperature=6.0, eta=0.003, beta=3.0, clip=16.0)

PRESETS = {
    # ~1k rows per layer at d=32, at most 4 cold chunks (few recompilations), no RSS children: seconds
    "smoke": dict(data="synthetic", d=32, classes=10, batch=32, steps=30, budget_fraction=0.55, chunk_rows=128,
                  window=6, heldout=64, rss=False, final_repeats=3, hlo_copies=False),
    # 20.5k rows per layer at d=784: 194 MB of rows, budget 48 MB, ~150 MB cold
    "cpu": dict(data="auto", d=784, classes=10, batch=64, steps=320, budget_fraction=0.25, chunk_rows=None,
                window=32, heldout=256, rss=True, final_repeats=7, hlo_copies=True),
    # 192k rows per layer: 1.8 GB of rows, ~1.4 GB cold under a 0.45 GB budget (a bigger machine)
    "paper": dict(data="auto", d=784, classes=10, batch=64, steps=3000, budget_fraction=0.25, chunk_rows=None,
                  window=100, heldout=1024, rss=True, final_repeats=7, hlo_copies=True),
}


# ----------------------------------------------------------------------------- memory

def current_rss_gb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GB
    except OSError:
        return float("nan")


# ----------------------------------------------------------------------------- data

def make_data(cfg, data: str, seed: int):
    """``(batch(i) -> (x, y), (x_heldout, y_heldout), info)`` for the steps of the config."""
    b, steps, n_test = cfg["batch"], cfg["steps"], cfg["heldout"]
    if data == "mnist":
        from growmem.data import mnist

        n = min(60_000, steps * b)
        x, y = mnist.load("train", limit=n)
        xt, yt = mnist.load("test", limit=n_test)
        # RMS-normalised images (‖x‖ = √d), as the CLI's MNIST task
        x, xt = (a / np.sqrt(np.mean(a * a, axis=1, keepdims=True)) for a in (x, xt))
        x, xt = x.astype(np.float32), xt.astype(np.float32)

        def batch(i):
            idx = np.arange(i * b, (i + 1) * b) % n
            return x[idx], y[idx]

        return batch, (xt, yt), {"data": "mnist", "d": 784, "classes": 10, "train_samples_used": n}
    d, c = cfg["d"], cfg["classes"]
    teacher = np.random.default_rng([seed, 1]).standard_normal((d, c)).astype(np.float32)

    def sample(rs, m):
        x = rs.standard_normal((m, d), dtype=np.float32)
        return x, np.argmax(x @ teacher, axis=1).astype(np.int32)

    def batch(i):
        return sample(np.random.default_rng([seed, 2, i]), b)

    return batch, sample(np.random.default_rng([seed, 3]), n_test), {"data": "synthetic", "d": d, "classes": c}


def resolve_data(want: str) -> str:
    if want == "synthetic":
        return "synthetic"
    from growmem.data import mnist

    if mnist.available():
        return "mnist"
    if want == "mnist":
        raise SystemExit("--data mnist: MNIST not found (set GROWMEM_DATA or put it in ../shared/data/mnist)")
    return "synthetic"


# ----------------------------------------------------------------------------- model

def make_model(cfg, d):
    """The same model for both ways. Its initial capacity (rows preallocated per layer) is at most
    the hot rows the budget allows: the ``Tiered`` backend caps the growth of the hot capacity but does
    not shrink a larger initial one, which would hold more than the budget from the first step."""
    spec = gm.GrowingSpec.make("weighted_softmax", init="random", init_rows=cfg["batch"], **LAYER)
    return gm.ResidualGrowingNet(d_out=cfg["classes"], n_blocks=1, block=spec, readout=spec,
                                 capacity=initial_capacity(cfg, d))


def initial_capacity(cfg, d) -> int:
    hot = budget_bytes(cfg, d) // sum(layer_row_bytes(d, cfg["classes"]).values())
    q = gm.memory.ROW_QUANTUM
    return int(min(DEFAULT_CAPACITY, max(q, hot // q * q)))


def final_rows(cfg) -> int:
    """Rows per layer at the end: D0 (``init_rows = batch``) + one row per sample."""
    return cfg["batch"] * (cfg["steps"] + 1)


def layer_row_bytes(d, classes):
    """Bytes of one row of each layer (w, k, v, born): block d→d, readout d→classes."""
    return {"block_0": row_bytes(d, d), "readout": row_bytes(d, classes)}


def budget_bytes(cfg, d) -> int:
    return int(cfg["budget_fraction"] * final_rows(cfg) * sum(layer_row_bytes(d, cfg["classes"]).values()))


# ----------------------------------------------------------------------------- instrumentation

class Probe:
    """Counts what the spill path does on the host: callbacks (split into issuing the
    TensorStore reads, waiting for them, lazy decay + padding), bytes of cold rows read,
    spill writes (``Tiered._spill``), and XLA compilations (``jax.monitoring``)."""

    FIELDS = ("callback_s", "callback_calls", "issue_s", "age_s", "bytes_read", "spill_write_s",
              "compile_s", "compiles")

    def __init__(self):
        self.reset()
        self._installed = False
        #: when True the callbacks return chunks kept in RAM (``cache``) instead of reading the tier
        self.cached_mode = False
        self.cache = {}

    def reset(self):
        self.c = {k: 0.0 for k in self.FIELDS}

    def take(self):
        out, self.c = self.c, {k: 0.0 for k in self.FIELDS}
        return out

    def install(self):
        if self._installed:
            return
        self._installed = True
        probe = self
        cs, sp, ct = spill_mod.ColdStore, spill_mod.Tiered, spill_mod.ColdTier
        read_chunk, issue, aged, before_step = cs.read_chunk, ct.issue, cs._aged, sp._spill

        def read_chunk_p(self, i, n, t, fields=spill_mod.FIELDS):
            t0 = time.perf_counter()
            try:
                if probe.cached_mode:   # the chunk from RAM (filled on first use): no TensorStore
                    key = (id(self), int(i), int(n), int(t), tuple(fields))
                    if key not in probe.cache:
                        probe.cache[key] = read_chunk(self, i, n, t, fields)
                    return probe.cache[key]
                return read_chunk(self, i, n, t, fields)
            finally:
                probe.c["callback_s"] += time.perf_counter() - t0
                probe.c["callback_calls"] += 1
                c = self.tier.chunk_rows
                rows = max(0, min(c, min(int(n), self.rows) - int(i) * c))
                per_row = {"w": 4, "born": 4, "k": 4 * self.tier.d_in, "v": 4 * self.tier.d_out}
                probe.c["bytes_read"] += rows * sum(per_row[f] for f in fields)

        def issue_p(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return issue(self, *a, **k)
            finally:
                probe.c["issue_s"] += time.perf_counter() - t0

        def aged_p(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return aged(self, *a, **k)
            finally:
                probe.c["age_s"] += time.perf_counter() - t0

        def before_step_p(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return before_step(self, *a, **k)
            finally:
                probe.c["spill_write_s"] += time.perf_counter() - t0

        cs.read_chunk, ct.issue, cs._aged, sp._spill = read_chunk_p, issue_p, aged_p, before_step_p

        def on_duration(event, duration, *a, **k):
            if event.endswith("backend_compile_duration"):
                probe.c["compile_s"] += duration
                probe.c["compiles"] += 1

        jax.monitoring.register_event_duration_secs_listener(on_duration)


# ----------------------------------------------------------------------------- training

def build(cfg, mode, data_dim, workdir, sample):
    backend = None
    if mode == "spill":
        kw = {} if cfg["chunk_rows"] is None else {"chunk_rows": cfg["chunk_rows"]}
        backend = Tiered(Path(workdir) / "tier", ram_budget_bytes=budget_bytes(cfg, data_dim), **kw)
    tr = gm.Trainer(make_model(cfg, data_dim), loss="cross_entropy", sample_input=sample, rng=jax.random.key(0),
                    backend=backend)
    tr.spill = backend
    return tr


def train(cfg, modes, data, workdir, probe=None, bar=None, sample_rss=False):
    """Train one trainer per mode on the same stream, steps interleaved; per-step records."""
    batch, heldout, info = data
    x0, _ = batch(0)
    trainers = {m: build(cfg, m, info["d"], workdir, x0) for m in modes}
    rss_before = current_rss_gb()
    peak_before = peak_rss_gb()
    recs = {m: [] for m in modes}
    rss_max = rss_before
    for i in range(cfg["steps"]):
        x, y = batch(i)
        order = modes if i % 2 == 0 else modes[::-1]
        for m in order:
            tr = trainers[m]
            if probe is not None:
                probe.reset()
            t0 = time.perf_counter()
            tr.step(x, y)
            jax.block_until_ready(tr.state)
            dt = time.perf_counter() - t0
            rec = {"s": dt}
            if tr.spill is not None:
                rec["cold_rows"] = tr.cold_rows()
            if probe is not None:
                rec.update(probe.take())
            if sample_rss:
                rec["rss_gb"] = current_rss_gb()
                rss_max = max(rss_max, rec["rss_gb"])
            recs[m].append(rec)
        if bar is not None:
            bar.update(1)
    xt, yt = heldout
    out = {}
    for m, tr in trainers.items():
        pred = np.asarray(tr.predict(xt))
        hot = {"/".join(p): int(mm.size) for p, mm in tr.memories().items()}   # rows held in RAM
        cold = tr.cold_rows()
        out[m] = {"steps": recs[m], "pred": pred, "accuracy": float(np.mean(pred.argmax(-1) == yt)),
                  "rows_hot": hot, "rows_cold": cold, "rows_total": {k: hot[k] + cold[k] for k in hot},
                  "capacity": {"/".join(p): int(mm.capacity) for p, mm in tr.memories().items()},
                  "spills": tr.spill.state.spills if tr.spill is not None else 0,
                  "chunk_rows": tr.spill.store(tr.memories()[("readout",)]).tier.chunk_rows
                  if tr.spill is not None else None,
                  "hot_rows_budget": tr.spill.hot_rows_per_layer if tr.spill is not None else None}
    out["_rss"] = {"rss_gb_before_training": rss_before, "peak_rss_gb_before_training": peak_before,
                   "max_sampled_rss_gb": rss_max if sample_rss else None}
    return out, trainers


def windows(cfg, res, modes, d):
    """Per window of steps: rows at its end, median/mean step time (steps without compiles)."""
    w, b = cfg["window"], cfg["batch"]
    rows = []
    for lo in range(0, cfg["steps"], w):
        hi = min(cfg["steps"], lo + w)
        # rows per layer after step j (0-based) = b (D0) + b (j + 1); "rows": the window's mean
        row = {"first_step": lo, "last_step": hi - 1, "rows": b * (lo + hi + 3) / 2, "rows_end": b * (hi + 1)}
        ok = [j for j in range(lo, hi) if all(res[m]["steps"][j].get("compiles", 0) == 0 for m in modes)]
        row["steps_timed"] = len(ok)
        for m in modes:
            st = res[m]["steps"]
            ts = [st[j]["s"] for j in ok]
            row[f"{m}_median_s"] = float(np.median(ts)) if ts else float("nan")
            row[f"{m}_mean_s"] = float(np.mean(ts)) if ts else float("nan")
            row[f"{m}_mean_all_s"] = float(np.mean([st[j]["s"] for j in range(lo, hi)]))
            if "rss_gb" in st[lo]:
                row[f"{m}_rss_gb"] = max(st[j]["rss_gb"] for j in range(lo, hi))
            if m == "spill" and "callback_s" in st[lo]:
                for k in ("callback_s", "issue_s", "age_s", "bytes_read", "spill_write_s",
                          "callback_calls"):
                    row[f"spill_{k}_per_step"] = float(np.mean([st[j][k] for j in ok])) if ok else float("nan")
                row["spill_wait_s_per_step"] = (row["spill_callback_s_per_step"] - row["spill_issue_s_per_step"]
                                                 - row["spill_age_s_per_step"])
                for layer in st[lo]["cold_rows"]:
                    row[f"spill_cold_rows_{layer}"] = float(np.mean([st[j]["cold_rows"][layer] for j in range(lo, hi)]))
                row["spill_compile_s"] = float(sum(st[j]["compile_s"] for j in range(lo, hi)))
        if "spill_cold_rows_readout" in row:
            row["remat_compute_ratio_est"] = remat_compute_ratio(d, cfg["classes"], row["rows"],
                                                                 row["spill_cold_rows_readout"])
        if len(modes) == 2 and ok:
            row["ratio_paired_median"] = float(np.median([res["spill"]["steps"][j]["s"] / res["ram"]["steps"][j]["s"]
                                                          for j in ok]))
            row["ratio_of_means"] = row["spill_mean_s"] / row["ram_mean_s"]
        rows.append(row)
    return rows


def remat_compute_ratio(d, classes, rows, cold_readout_rows) -> float:
    """Estimated compute of a spill step / an all-in-RAM step (matrix products, per row).

    All in RAM: block forward ``q kᵀ`` + ``e ṽ`` (2·2d), readout forward (2d + 2C) and its
    backward ``∂q = ∂a k``, ``∂e = g ṽᵀ`` (2d + 2C) — the block's retrieval is not
    differentiated (its output only feeds the loss through the residual stream, and its rows
    are not trained), and the in-RAM scan keeps its residuals. Spilling adds the readout's
    forward once more over its cold rows (the rematerialised scan body): ``2d + 2C`` per cold row.
    """
    ram = rows * (8 * d + 4 * classes)
    return (ram + cold_readout_rows * (2 * d + 2 * classes)) / ram


def callback_roundtrip(chunk_rows, d_in, d_out, calls=16, repeats=5) -> float:
    """Seconds per ``jax.pure_callback`` that hands one cold chunk's arrays (w, k, v, born;
    prepared in advance, no TensorStore) to a jitted scan, as the spill path's scan does: the
    cost of the callback mechanism itself (dispatch, GIL, copying the result into XLA)."""
    c = chunk_rows
    arrs = (np.ones((c,), np.float32), np.ones((c, d_in), np.float32), np.ones((c, d_out), np.float32),
            np.ones((c,), np.int32))
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrs)

    @jax.jit
    def f(x):
        def body(carry, i):
            w, k, v, born = jax.pure_callback(lambda i: arrs, shapes, i, vmap_method="sequential")
            return carry + w[-1] + k[-1, -1] + v[-1, -1] + born[-1].astype(jnp.float32), None

        return jax.lax.scan(body, x, jnp.arange(calls))[0]

    x = jnp.zeros((), jnp.float32)
    f(x).block_until_ready()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) / calls


def fwd_bwd(model, loss_fn, state, x, y):
    """The forward and backward pass of a train step without the append (and the state copies
    it may bring): the loss and ``g = ∂L/∂s`` of every growing layer, as in ``train_step``."""
    variables = {"params": state.params, **state.collections}
    shapes = jax.eval_shape(lambda: model.apply(variables, x, mutable=["perturbations"])[1])
    perts = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes.get("perturbations", {}))

    def objective(perts):
        out, _ = model.apply({**variables, "perturbations": perts}, x, mutable=["intermediates"])
        return loss_fn(out, y)

    return jax.value_and_grad(objective)(perts)


def final_passes(cfg, trainers, x, y, probe):
    """Interleaved timings at the end, on the final states: the forward pass alone
    (``predict`` of one batch) and forward + backward without the append."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    fb = {m: jax.jit(lambda st, x, y, tr=tr: fwd_bwd(tr.model, tr.loss_fn, st, x, y)) for m, tr in trainers.items()}
    fns = {}

    def run(fn, cached):
        probe.cached_mode = cached   # stays set until the next timed call (each is blocked on)
        return fn()

    for m, tr in trainers.items():
        variants = [(m, False)] + ([(m + "_cached", True)] if m == "spill" else [])
        for name, cached in variants:
            fns[f"forward_{name}"] = lambda tr=tr, c=cached: run(lambda: tr._predict(tr.variables, x), c)
            fns[f"fwd_bwd_{name}"] = lambda tr=tr, f=fb[m], c=cached: run(lambda: f(tr.state, x, y), c)
    probe.reset()
    try:
        ts = _common.time_interleaved(fns, cfg["final_repeats"], warmup=1)
    finally:
        probe.cached_mode = False
        probe.cache.clear()
    probe.reset()
    out = {k: _common.median(v) for k, v in ts.items()}
    # median over rounds of t_spill / t_ram timed in the same round
    for p in ("forward", "fwd_bwd"):
        out[f"{p}_ratio"] = _common.paired_ratio(ts, f"{p}_spill", f"{p}_ram")
        out[f"{p}_ratio_cached"] = _common.paired_ratio(ts, f"{p}_spill_cached", f"{p}_ram")
        # the share of the spill overhead that goes away when the chunks come from RAM
        over = out[f"{p}_spill"] - out[f"{p}_ram"]
        out[f"{p}_tier_read_share"] = (out[f"{p}_spill"] - out[f"{p}_spill_cached"]) / over if over > 0 else None
    out["times_s"] = ts
    return out


def table_copies(tr, x, y) -> dict:
    """Copies of whole row tables (``k``, ``v`` at the full capacity) in the compiled train step
    of ``tr``'s current state: XLA's copy insertion adds them when it cannot update a donated
    table in place. Returns the count and the bytes copied per step."""
    import re

    x, y = jnp.asarray(x), jnp.asarray(y)
    grads = tr._grads(tr.state, x, y)
    txt = (tr._grads.lower(tr.state, x, y).compile().as_text() + "\n"
           + tr._apply.lower(tr.state, grads, x.shape[0]).compile().as_text())
    shapes = {}
    for mem in tr.memories().values():
        for a in (mem.k, mem.v):
            shapes[f"f32[{a.shape[0]},{a.shape[1]}]"] = a.size * a.dtype.itemsize
    n, nbytes = 0, 0
    for line in txt.splitlines():
        m = re.search(r"= (f32\[\d+,\d+\])\{1,0\} copy\(", line)
        if m and m.group(1) in shapes:
            n += 1
            nbytes += shapes[m.group(1)]
    return {"copies": n, "bytes": nbytes,
            "capacity": {"/".join(p): int(mm.capacity) for p, mm in tr.memories().items()}}


# ----------------------------------------------------------------------------- raw reads of the tier

def chunk_files(root: Path):
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and "c" in p.relative_to(root).parts)




# ----------------------------------------------------------------------------- child: one way alone (RSS)

def child_main(args, cfg):
    data_name = args.data
    data = make_data(cfg, data_name, args.seed)
    res, _ = train(cfg, [args.child], data, args.workdir, sample_rss=True)
    r = res[args.child]
    peak = peak_rss_gb()
    rss_end = current_rss_gb()
    try:  # hand freed heap back to the OS (glibc): what is left is memory still in use
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = current_rss_gb()
    except (OSError, AttributeError):
        trimmed = None
    out = {"mode": args.child, "peak_rss_gb": peak, "rss_gb_end": rss_end, "rss_gb_end_after_malloc_trim": trimmed,
           **res["_rss"],
           "step_s": [s["s"] for s in r["steps"]], "rss_gb": [s["rss_gb"] for s in r["steps"]],
           "pred": r["pred"].tolist(), "rows_cold": r["rows_cold"], "rows_hot": r["rows_hot"]}
    Path(args.child_out).write_text(json.dumps(out))


def run_child(args, mode, data_name, work: Path):
    out = work / f"child-{mode}.json"
    wd = work / f"child-{mode}"
    wd.mkdir()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--preset", args.preset, "--child", mode,
           "--child-out", str(out), "--workdir", str(wd), "--data", data_name, "--seed", str(args.seed)]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if p.returncode != 0:
        return {"error": p.stderr[-3000:]}
    doc = json.loads(out.read_text())
    doc["wall_s"] = time.perf_counter() - t0
    shutil.rmtree(wd, ignore_errors=True)
    return doc


# ----------------------------------------------------------------------------- main

def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0], PRESETS)
    p.add_argument("--data", choices=["auto", "mnist", "synthetic"], default=None,
                   help="data stream (default: the preset's; auto = MNIST if found, else synthetic)")
    p.add_argument("--steps", type=int, default=None, help="override the preset's number of steps")
    p.add_argument("--workdir", type=Path, default=None, help="where to write the cold tiers (default: /tmp)")
    p.add_argument("--no-rss", action="store_true", help="skip the two child runs that measure peak RSS")
    p.add_argument("--rss", action="store_true", help="measure peak RSS in two child runs even if the preset does not")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", choices=["ram", "spill"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cfg = dict(PRESETS[args.preset])
    if args.steps:
        cfg["steps"] = args.steps
    if args.child:
        return child_main(args, cfg)

    t_start = time.perf_counter()
    command = "python benchmarks/spill_training.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    data_name = resolve_data(args.data or cfg["data"])
    repo = Path(__file__).resolve().parent.parent
    base = args.workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="growmem-spill-training-", dir=base))
    if repo in work.resolve().parents:
        shutil.rmtree(work)
        raise SystemExit(f"--workdir must be outside the repository ({repo})")

    data = make_data(cfg, data_name, args.seed)
    info = data[2]
    d = info["d"]
    budget = budget_bytes(cfg, d)
    rb = layer_row_bytes(d, cfg["classes"])
    result = {"preset": args.preset, "command": command, "config": cfg, "layer": LAYER, "data": info,
              "seed": args.seed, "workdir": str(work), "row_bytes": rb, "ram_budget_bytes": budget,
              "final_row_bytes": final_rows(cfg) * sum(rb.values()), "initial_capacity": initial_capacity(cfg, d)}
    modes = ["ram", "spill"]
    probe = Probe()
    probe.install()
    try:
        with tqdm(total=cfg["steps"], desc=f"spill_training [{args.preset}] ram+spill", unit="step",
                  file=sys.stderr, dynamic_ncols=True) as bar:
            res, trainers = train(cfg, modes, data, work / "main", probe=probe, bar=bar)
        sp_tr = trainers["spill"]
        files = chunk_files(work / "main" / "tier")
        file_bytes = sum(f.stat().st_size for f in files)
        raw_read(files)  # warm the page cache (the regime of the training steps)
        raws = [raw_read(files) for _ in range(3)]
        raw_bw = float(np.median([n / t for n, t in raws]))
        result["raw_read"] = {"files": len(files), "file_bytes": file_bytes, "gb_per_s": raw_bw / GB,
                              "all_gb_per_s": [n / t / GB for n, t in raws], "page_cache": "warm"}
        xf, yf = data[0](cfg["steps"])   # the next batch of the stream
        with tqdm(total=1, desc=f"spill_training [{args.preset}] final passes", file=sys.stderr,
                  dynamic_ncols=True) as bar:
            result["final_passes"] = final_passes(cfg, trainers, xf, yf, probe)
            if cfg["hlo_copies"]:
                result["table_copies"] = {m: table_copies(tr, xf, yf) for m, tr in trainers.items()}
            bar.update(1)
        c = res["spill"]["chunk_rows"]
        result["callback_roundtrip_s"] = {layer: callback_roundtrip(c, d, d if layer == "block_0" else cfg["classes"])
                                          for layer in ("block_0", "readout")}
        del trainers, sp_tr
        rss = {}
        if (cfg["rss"] or args.rss) and not args.no_rss:
            with tqdm(total=2, desc=f"spill_training [{args.preset}] RSS children", file=sys.stderr,
                      dynamic_ncols=True) as bar:
                for m in modes:
                    rss[m] = run_child(args, m, data_name, work)
                    bar.update(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["deleted_workdir"] = not work.exists()

    wins = windows(cfg, res, modes, d)
    last = wins[-1]
    pred_r, pred_s = res["ram"]["pred"], res["spill"]["pred"]
    diff = float(np.max(np.abs(pred_r - pred_s)))
    cold_rows, hot_rows = res["spill"]["rows_cold"], res["spill"]["rows_hot"]
    cold_bytes = sum(cold_rows[k] * rb[k] for k in cold_rows)
    c = res["spill"]["chunk_rows"]
    rt = result["callback_roundtrip_s"]
    # callbacks per step: one per cold chunk of the block (forward), two of the readout (+ backward)
    dispatch_s = (np.ceil(last.get("spill_cold_rows_block_0", 0) / c) * rt["block_0"]
                  + 2 * np.ceil(last.get("spill_cold_rows_readout", 0) / c) * rt["readout"])
    floor_s = last.get("spill_bytes_read_per_step", float("nan")) / raw_bw
    t_ram, t_spill = last["ram_median_s"], last["spill_median_s"]
    for m in modes:  # the per-step records without the predictions
        res[m]["pred_abs_max"] = float(np.max(np.abs(res[m]["pred"])))
        del res[m]["pred"]
    result.update(main_run=res, windows=wins)
    child = {}
    for m, doc in rss.items():
        if "error" in doc:
            child[m] = doc
            continue
        child[m] = {k: doc[k] for k in ("peak_rss_gb", "rss_gb_before_training", "peak_rss_gb_before_training",
                                        "max_sampled_rss_gb", "rss_gb_end", "rss_gb_end_after_malloc_trim",
                                        "wall_s", "rows_cold", "rows_hot")}
        child[m]["rss_gb_after_first_step"] = doc["rss_gb"][0]
        child[m]["step_s"], child[m]["rss_gb"] = doc["step_s"], doc["rss_gb"]
        child[m]["max_pred_diff_vs_main_ram"] = float(np.max(np.abs(np.asarray(doc["pred"]) - pred_r)))
    if all("step_s" in child.get(m, {}) for m in modes):
        w = cfg["window"]
        child["final_window_ratio_of_medians"] = (float(np.median(child["spill"]["step_s"][-w:]))
                                                  / float(np.median(child["ram"]["step_s"][-w:])))
    result["rss_children"] = child

    def _rss(m, k="peak_rss_gb"):
        return child.get(m, {}).get(k)

    summary = {
        "step_time_ratio": last.get("ratio_paired_median"),
        "step_time_ratio_of_means": last.get("ratio_of_means"),
        "ram_step_s": t_ram,
        "spill_step_s": t_spill,
        "max_pred_diff": diff,
        "max_abs_pred": float(np.max(np.abs(pred_r))),
        "ram_budget_gb": budget / GB,
        "final_rows_gb": result["final_row_bytes"] / GB,
        "cold_gb": cold_bytes / GB,
        "cold_file_gb": file_bytes / GB,
        "rows_cold": cold_rows,
        "rows_hot": hot_rows,
        "rows_total": res["ram"]["rows_total"],
        "peak_rss_gb_spill": _rss("spill"),
        "peak_rss_gb_ram": _rss("ram"),
        "rss_gb_before_training_spill": _rss("spill", "rss_gb_before_training"),
        "rss_gb_before_training_ram": _rss("ram", "rss_gb_before_training"),
        "rss_gb_after_first_step_spill": _rss("spill", "rss_gb_after_first_step"),
        "rss_gb_after_first_step_ram": _rss("ram", "rss_gb_after_first_step"),
        # RSS at the end after glibc's malloc_trim(0): the rest of the peak is freed heap kept by malloc
        "rss_gb_end_after_malloc_trim_spill": _rss("spill", "rss_gb_end_after_malloc_trim"),
        "rss_gb_end_after_malloc_trim_ram": _rss("ram", "rss_gb_end_after_malloc_trim"),
        "raw_read_gb_per_s": raw_bw / GB,
        "cold_gb_read_per_step": last.get("spill_bytes_read_per_step", float("nan")) / GB,
        "read_floor_s": floor_s,
        "spill_overhead_s": t_spill - t_ram,
        "spill_overhead_over_read_floor": (t_spill - t_ram) / floor_s,
        "ratio_to_ram_plus_read_floor": t_spill / (t_ram + floor_s),
        # the same final states, without the append: forward alone, forward + backward
        "forward_ratio": result["final_passes"]["forward_ratio"],
        "fwd_bwd_ratio": result["final_passes"]["fwd_bwd_ratio"],
        # ... with the callbacks handing over chunks kept in RAM (no TensorStore): what is left is
        # the cost of the callback structure itself (scan, callbacks, rematerialisation)
        "forward_ratio_cached_chunks": result["final_passes"]["forward_ratio_cached"],
        "fwd_bwd_ratio_cached_chunks": result["final_passes"]["fwd_bwd_ratio_cached"],
        "fwd_bwd_overhead_share_tier_reads": result["final_passes"]["fwd_bwd_tier_read_share"],
        # whole-table copies XLA inserts in the compiled train step (bytes per step), each way
        "table_copy_gb_per_step_ram": result.get("table_copies", {}).get("ram", {}).get("bytes", float("nan")) / GB,
        "table_copy_gb_per_step_spill": (result.get("table_copies", {}).get("spill", {}).get("bytes", float("nan"))
                                         / GB),
        "remat_compute_ratio_estimate": last.get("remat_compute_ratio_est"),
        "callback_roundtrip_s": rt,
        # the callback mechanism alone (roundtrip microbenchmark x callbacks per step)
        "callback_dispatch_s_per_step_est": dispatch_s,
        "callback_s_per_step": last.get("spill_callback_s_per_step"),
        "callback_fraction_of_spill_step": last.get("spill_callback_s_per_step", float("nan")) / t_spill,
        "callback_wait_s_per_step": last.get("spill_wait_s_per_step"),
        "callback_issue_s_per_step": last.get("spill_issue_s_per_step"),
        "callback_age_s_per_step": last.get("spill_age_s_per_step"),
        "callbacks_per_step": last.get("spill_callback_calls_per_step"),
        "spill_write_s_per_step": last.get("spill_spill_write_s_per_step"),
        "accuracy_ram": res["ram"]["accuracy"],
        "accuracy_spill": res["spill"]["accuracy"],
        "data": info["data"],
        "final_window_steps": [last["first_step"], last["last_step"]],
    }
    result["wall_s"] = time.perf_counter() - t_start
    json_path = _common.write_results(NAME, summary, result, args.out)
    png_path = plot(result, summary, args.out)
    _print(args, cfg, summary, wins, child, json_path, png_path, result["wall_s"])
    return summary


def _print(args, cfg, s, wins, child, json_path, png_path, wall):
    print(f"\nspill_training [{args.preset}] ({s['data']}, {cfg['steps']} steps of {cfg['batch']}): RAM budget "
          f"{s['ram_budget_gb'] * 1024:.1f} MB of {s['final_rows_gb'] * 1024:.1f} MB final rows; cold "
          f"{s['cold_gb'] * 1024:.1f} MB, rows cold {s['rows_cold']} hot {s['rows_hot']}")
    print(f"{'rows':>8} {'ram ms':>9} {'spill ms':>9} {'ratio':>6} {'callback ms':>12} {'MB read':>8}")
    for w in wins:
        print(f"{w['rows']:8.0f} {w['ram_median_s'] * 1e3:9.2f} {w['spill_median_s'] * 1e3:9.2f} "
              f"{w.get('ratio_paired_median', float('nan')):6.2f} "
              f"{w.get('spill_callback_s_per_step', float('nan')) * 1e3:12.2f} "
              f"{w.get('spill_bytes_read_per_step', float('nan')) / 2 ** 20:8.1f}")
    print(f"  step_time_ratio spill/ram (final window, paired median) = {s['step_time_ratio']:.3f}; "
          f"ratio of means (incl. spill writes) = {s['step_time_ratio_of_means']:.3f}")
    print(f"  raw read {s['raw_read_gb_per_s']:.2f} GB/s (warm page cache): reading the "
          f"{s['cold_gb_read_per_step'] * 1024:.1f} MB/step the callbacks read takes {s['read_floor_s'] * 1e3:.1f} ms; "
          f"spill overhead {s['spill_overhead_s'] * 1e3:.1f} ms = {s['spill_overhead_over_read_floor']:.2f}x that; "
          f"t_spill / (t_ram + read floor) = {s['ratio_to_ram_plus_read_floor']:.3f}")
    print(f"  callbacks {s['callbacks_per_step']:.0f}/step, {s['callback_s_per_step'] * 1e3:.1f} ms/step "
          f"({s['callback_fraction_of_spill_step']:.2f} of the spill step): issue "
          f"{s['callback_issue_s_per_step'] * 1e3:.1f} ms, decay+pad {s['callback_age_s_per_step'] * 1e3:.1f} ms")
    print(f"  callback mechanism alone (microbenchmark): {s['callback_roundtrip_s']['block_0'] * 1e3:.3f} / "
          f"{s['callback_roundtrip_s']['readout'] * 1e3:.3f} ms per call (block / readout) = "
          f"{s['callback_dispatch_s_per_step_est'] * 1e3:.1f} ms/step; rematerialised readout forward: FLOP estimate "
          f"of the compute ratio {s['remat_compute_ratio_estimate']:.3f}")
    print(f"  final states, no append: forward spill/ram = {s['forward_ratio']:.3f} "
          f"({s['forward_ratio_cached_chunks']:.3f} with chunks from RAM), forward+backward spill/ram = "
          f"{s['fwd_bwd_ratio']:.3f} ({s['fwd_bwd_ratio_cached_chunks']:.3f} with chunks from RAM: the tier reads are "
          f"{s['fwd_bwd_overhead_share_tier_reads'] or float('nan'):.2f} of its overhead)" + ("" if s["table_copy_gb_per_step_ram"] is None or
                                           not np.isfinite(s["table_copy_gb_per_step_ram"]) else
          f"; whole-table copies in the compiled train step: ram {s['table_copy_gb_per_step_ram'] * 1024:.0f} "
          f"MB/step, spill {s['table_copy_gb_per_step_spill'] * 1024:.0f} MB/step"))
    print(f"  max |pred_spill - pred_ram| = {s['max_pred_diff']:.3g} (max |pred| {s['max_abs_pred']:.3g}); "
          f"held-out accuracy ram {s['accuracy_ram']:.3f} spill {s['accuracy_spill']:.3f}")
    if s["peak_rss_gb_spill"] is not None:
        print(f"  peak RSS (alone in a child): spill {s['peak_rss_gb_spill']:.3f} GB, ram {s['peak_rss_gb_ram']:.3f} GB "
              f"(after step 1 {s['rss_gb_after_first_step_spill']:.3f} / {s['rss_gb_after_first_step_ram']:.3f} GB, "
              f"at the end after malloc_trim {s['rss_gb_end_after_malloc_trim_spill'] or float('nan'):.3f} / "
              f"{s['rss_gb_end_after_malloc_trim_ram'] or float('nan'):.3f} GB)"
              f"; children's final-window ratio of medians {child.get('final_window_ratio_of_medians', float('nan')):.3f}")
    else:
        errs = {m: c.get("error", "")[-300:] for m, c in child.items() if isinstance(c, dict) and "error" in c}
        print(f"  peak RSS not measured{': ' + str(errs) if errs else ''}")
    print(f"wall {wall:.1f} s; wrote {json_path} and {png_path}")


def plot(result, summary, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wins = result["windows"]
    child = result["rss_children"]
    has_rss = all("rss_gb" in child.get(m, {}) for m in ("ram", "spill"))
    fig, axes = plt.subplots(1, 3 if has_rss else 2, figsize=(15 if has_rss else 10, 4.2))
    rows = np.array([w["rows"] for w in wins], float)
    a1 = axes[0]
    a1.plot(rows, [w["ram_median_s"] * 1e3 for w in wins], "o-", label="all rows in RAM")
    a1.plot(rows, [w["spill_median_s"] * 1e3 for w in wins], "s-", label="spill (TensorStore tier)")
    if "spill_callback_s_per_step" in wins[0]:
        a1.plot(rows, [(w["spill_median_s"] - w["spill_callback_s_per_step"]) * 1e3 for w in wins], ":",
                color="C1", label="spill minus callback time")
    a1.set_xlabel("rows per layer")
    a1.set_ylabel("step time (ms, window median)")
    a1.set_title(f"{summary['data']}, B={result['config']['batch']}, budget "
                 f"{summary['ram_budget_gb'] * 1024:.0f} MB", fontsize=9)
    a1.legend(fontsize=8)
    a2 = axes[1]
    a2.plot(rows, [w.get("ratio_paired_median", np.nan) for w in wins], "o-", color="C3", label="t_spill / t_ram")
    bw = summary["raw_read_gb_per_s"] * GB
    floor = [(w["ram_median_s"] + w.get("spill_bytes_read_per_step", np.nan) / bw) / w["ram_median_s"] for w in wins]
    a2.plot(rows, floor, "--", color="gray", label="(t_ram + raw read of the cold bytes) / t_ram")
    fp = result.get("final_passes", {})
    x_end = wins[-1]["rows_end"]
    for key, mk, lab in (("forward_ratio", "^", "forward only (final state)"),
                         ("fwd_bwd_ratio", "v", "forward + backward, no append"),
                         ("fwd_bwd_ratio_cached", "x", "forward + backward, chunks from RAM")):
        if fp.get(key) is not None:
            a2.plot([x_end], [fp[key]], mk, ms=8, label=f"{lab}: {fp[key]:.2f}")
    a2.axhline(1.0, color="k", lw=0.8, ls=":")
    a2.set_xlabel("rows per layer")
    a2.set_ylabel("ratio")
    a2.set_title(f"final: {summary['step_time_ratio']:.2f}x; max |Δpred| {summary['max_pred_diff']:.1e}",
                 fontsize=9)
    a2.legend(fontsize=8)
    if has_rss:
        a3 = axes[2]
        b = result["config"]["batch"]
        for m, lab in (("ram", "all rows in RAM"), ("spill", "spill")):
            r = np.asarray(child[m]["rss_gb"]) * 1024
            a3.plot(b * (np.arange(len(r)) + 2), r, label=f"{lab} (peak {child[m]['peak_rss_gb'] * 1024:.0f} MB)")
        a3.axhline(child["spill"]["rss_gb_after_first_step"] * 1024 + summary["ram_budget_gb"] * 1024, ls="--",
                   color="C1", lw=0.8, label="spill: RSS after step 1 + RAM budget")
        for m, mk in (("ram", "o"), ("spill", "s")):
            if child[m].get("rss_gb_end_after_malloc_trim"):
                a3.plot([b * (len(child[m]["rss_gb"]) + 1)], [child[m]["rss_gb_end_after_malloc_trim"] * 1024], mk,
                        color="C0" if m == "ram" else "C1", mfc="none", label=f"{m}: at the end after malloc_trim")
        a3.set_xlabel("rows per layer")
        a3.set_ylabel("RSS (MB), each run alone")
        a3.legend(fontsize=8)
    fig.tight_layout()
    return _common.save_figure(fig, NAME, out_dir)


if __name__ == "__main__":
    main()
