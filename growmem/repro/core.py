"""What every reproduction shares: the :class:`Experiment` record, presets and their errors,
data preparation, the progress bar, sweeps that survive a diverging configuration, a resumable
cache of finished runs, and the JSON + PNG writer.

A reproduction is a module of :mod:`growmem.repro` holding ``EXPERIMENT = Experiment(...)``:
its presets (``smoke``: seconds, generated or tiny data, run by the tests; ``cpu``: MNIST /
Fashion-MNIST on this kind of machine, scaled down only where it must be and saying how;
``paper``: the paper's settings verbatim, for a GPU owner), a ``run(ctx, cfg) -> payload``
whose ``payload["summary"]`` holds the headline numbers, a ``plot(payload, plt) -> figure``
and ``table(payload) -> [(claim, paper number, measured number)]`` for the README table.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, GrowmemError, RunError
from ..reporting import progress_bar

#: where ``growmem repro`` writes by default (relative to the working directory); the committed results are
#: written with ``--out benchmarks/results/repro``
DEFAULT_OUT = Path("runs") / "repro"
#: the committed results (README_TABLE.md and the docs render from here)
COMMITTED = Path("benchmarks") / "results" / "repro"
PRESETS = ("smoke", "cpu", "paper")
#: datasets a preset may need (everything else is generated)
IMAGE_DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100")


class ReproError(GrowmemError):
    """A reproduction cannot start: an unknown experiment or preset, bad overrides (exit 2)."""


class UnknownExperimentError(ReproError, KeyError):
    """No experiment of that name; the message lists every experiment with one line each."""

    def __str__(self):   # KeyError would quote the message
        return self.args[0] if self.args else ""


class UnknownReproPresetError(ReproError, KeyError):
    """No preset of that name; the message lists the valid ones."""

    def __str__(self):
        return self.args[0] if self.args else ""


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One reproduction of a figure or table of the paper.

    name      the ``growmem repro NAME``
    paper     where in the paper (``"Fig. 2/Right, App. G.2, Fig. 9"``)
    what      one line: what it shows
    claim     the paper's claim whose ordering ``summary.claim_reproduced`` checks
    presets   ``{"smoke" | "cpu" | "paper": config dict}``
    run       ``run(ctx, cfg) -> payload`` (``payload["summary"]`` required)
    plot      ``plot(payload, plt) -> matplotlib figure``
    table     ``table(payload) -> [(claim, paper number, measured number)]`` (strings)
    """

    name: str
    paper: str
    what: str
    claim: str
    presets: Dict[str, dict]
    run: Callable[["Context", dict], dict]
    plot: Callable[[dict, Any], Any]
    table: Callable[[dict], List[Tuple[str, str, str]]]

    def preset(self, name: str) -> dict:
        if name not in self.presets:
            raise UnknownReproPresetError(f"unknown preset {name!r} for {self.name}; valid presets: "
                                     f"{', '.join(p for p in PRESETS if p in self.presets)}")
        return copy.deepcopy(self.presets[name])

    def datasets(self, cfg: dict) -> List[str]:
        """The image datasets a configuration reads (its ``dataset`` entry and any ``datasets`` list)."""
        names = [cfg["dataset"]] if cfg.get("dataset") in IMAGE_DATASETS else []
        names += [d for d in cfg.get("datasets", ()) if d in IMAGE_DATASETS and d not in names]
        return names


def merge(cfg: dict, overrides: Optional[dict]) -> dict:
    """``cfg`` with ``overrides`` applied (nested dicts merged key by key); an override of a key
    the preset does not have is refused (a typo would otherwise run the default silently)."""
    out = copy.deepcopy(cfg)
    for k, v in (overrides or {}).items():
        if k not in out:
            raise ReproError(f"override {k!r} is not a setting of this preset; its settings are {sorted(out)}")
        if isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# ------------------------------------------------------------------------------------------ data

@dataclasses.dataclass
class Images:
    """A classification dataset prepared for the models (App. F.1.1 / F.10).

    ``x``, ``xt``: the network inputs — MNIST-like images RMS-normalised (‖x‖ = √d, the scale of
    the residual stream), CIFAR channel-normalised (F.1.1) — flattened; ``x_raw``/``xt_raw``: the
    pixels in [0, 1] (flattened, HWC for CIFAR). ``x`` is in a fixed shuffled order (one pass =
    the order of ``x``). ``classes``: number of classes."""

    name: str
    x: np.ndarray
    y: np.ndarray
    xt: np.ndarray
    yt: np.ndarray
    x_raw: np.ndarray
    xt_raw: np.ndarray
    classes: int
    normalisation: str
    mean: Optional[np.ndarray] = None   # CIFAR: per-channel statistics of the training images (F.1.1)
    std: Optional[np.ndarray] = None

    @property
    def d(self) -> int:
        return int(self.x.shape[1])

    def classical(self) -> Tuple[np.ndarray, np.ndarray]:
        """F.10 inputs for kNN / kernel ridge: ``(x_train, x_test)`` normalised with the training
        statistics (per channel for CIFAR, one mean/std for grey images), flattened."""
        from .. import classical
        if self.name.startswith("cifar"):
            imgs = lambda a: a.reshape(len(a), 32, 32, 3)
            xtr, mean, std = classical.flatten_normalize(imgs(self.x_raw), channel_axis=-1)
            xte, _, _ = classical.flatten_normalize(imgs(self.xt_raw), mean, std, channel_axis=-1)
        else:
            xtr, mean, std = classical.flatten_normalize(self.x_raw, channel_axis=None)
            xte, _, _ = classical.flatten_normalize(self.xt_raw, mean, std, channel_axis=None)
        return xtr, xte


def rms_normalise(x: np.ndarray) -> np.ndarray:
    """Every row scaled to ‖x‖ = √d (RMSNorm without scale, as `growmem train --task mnist`)."""
    x = np.asarray(x, np.float32)
    return np.ascontiguousarray(x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-12), np.float32)


def check_data(names: Iterable[str], data_dir=None, *, download: bool = False, who: str = "") -> None:
    """Fail before any work when a dataset is missing: :class:`growmem.data.DatasetNotFoundError`
    naming the folders searched and how to get the files (``--download`` fetches them)."""
    from .. import data as gdata
    for name in names:
        try:
            gdata.locate(name, data_dir, download=download)
        except gdata.DatasetNotFoundError as e:
            hint = "" if download else (" — or pass --download to fetch it (growmem repro ... --download) "
                                        "into the cache")
            raise gdata.DatasetNotFoundError(f"{who}needs {name}: {e}{hint}", dataset=e.dataset,
                                             searched=e.searched, attempts=e.attempts, target=e.target) from None


def load_images(name: str, n_train: Optional[int] = None, n_test: Optional[int] = None, *, data_dir=None,
                seed: int = 0) -> Images:
    """``n_train`` training images drawn at random (all when None) in a shuffled order fixed by
    ``seed``, and the first ``n_test`` test images, prepared by :class:`Images`' rules."""
    from .. import data as gdata
    x, y = gdata.load(name, "train", data_dir, download=False)
    xt, yt = gdata.load(name, "test", data_dir, download=False, limit=n_test)
    order = np.random.default_rng(seed).permutation(len(x))
    if n_train is not None:
        if n_train > len(x):
            raise ReproError(f"{name} has {len(x)} training images; n_train={n_train} asks for more")
        order = order[:n_train]
    x, y = x[order], y[order]
    classes = 100 if name == "cifar100" else 10
    if name.startswith("cifar"):
        from ..data import transforms
        mean, std = transforms.channel_stats(x)
        xn = np.asarray(transforms.eval_transform(x, mean, std), np.float32)
        xtn = np.asarray(transforms.eval_transform(xt, mean, std), np.float32)
        how = "per-channel mean/std of the training images (App. F.1.1), flattened to 3072"
    else:
        xn, xtn = rms_normalise(x), rms_normalise(xt)
        how = "each image scaled to ||x|| = sqrt(d) (RMS normalisation), flattened to 784"
    stats = dict(mean=mean, std=std) if name.startswith("cifar") else {}
    return Images(name, xn, y.astype(np.int32), xtn, yt.astype(np.int32), x, xt, classes, how, **stats)


class AugmentedBatches:
    """App. F.1.1 training batches by step: every epoch each CIFAR image once, in a fresh shuffled
    order, with a freshly drawn augmentation (reflect-pad 4, random 32 × 32 crop, horizontal flip),
    normalised and flattened (:func:`growmem.data.transforms.train_transform`). Same interface as
    :class:`growmem.train.Batches` (``batches(step)``, ``per_epoch``)."""

    def __init__(self, data: Images, batch_size: int, *, seed: int = 0):
        if data.mean is None:
            raise ReproError(f"augmentation (App. F.1.1) is for CIFAR images, not {data.name}")
        import jax
        self.data, self.batch_size, self.n = data, int(batch_size), len(data.x_raw)
        self.per_epoch = self.n // self.batch_size
        self.key = jax.random.key(seed)

    def __call__(self, step: int):
        import jax
        from ..data import transforms
        from ..train import epoch_order
        epoch, b = divmod(step - 1, self.per_epoch)
        idx = epoch_order(self.key, epoch, self.n)[b * self.batch_size:(b + 1) * self.batch_size]
        x = transforms.train_transform(jax.random.fold_in(self.key, step), self.data.x_raw[idx], self.data.mean,
                                       self.data.std)
        return np.asarray(x), self.data.y[idx]


def batches_for(data: Images, batch: int, *, seed: int = 0, augment: bool = False):
    """Training batches by step: augmented CIFAR epochs (F.1.1) or the prepared images reshuffled
    every epoch (:class:`growmem.train.Batches`)."""
    import jax
    from ..train import Batches
    batches = AugmentedBatches(data, batch, seed=seed) if augment else \
        Batches(data.x, data.y, batch, rng=jax.random.key(seed), shuffle=True)
    if batches.per_epoch < 1:   # no step at all: the run would report an untrained model and NaN losses
        raise ReproError(f"{len(data.y)} training images of {data.name} make no whole batch of {batch}: raise "
                         f"n_train or lower the batch size")
    return batches


def synthetic_images(n_train: int, n_test: int, *, d: int = 256, classes: int = 10, seed: int = 0,
                     on: float = 0.25, noise: float = 0.15) -> Images:
    """A generated stand-in for the smoke presets (no files): ``classes`` prototypes of ``d``
    binary "pixels" (a fraction ``on`` lit, like pen strokes), each sample its prototype plus
    Gaussian noise of std ``noise``, clipped to [0, 1], RMS-normalised like MNIST.

    Image-like on purpose: prototypes of dense uniform pixels all share a large mean component
    (cosine ~0.75 between classes), and at a small d the weighted softmax's score scale
    √d / T then leaves every class nearly tied — the growing nets sat at chance and the smoke
    runs checked nothing. With sparse prototypes at d = 256 they learn in one short pass."""
    rng = np.random.default_rng(seed)
    centres = (rng.random((classes, d)) < on).astype(np.float32)

    def draw(n):
        y = rng.integers(0, classes, n).astype(np.int32)
        x = np.clip(centres[y] + noise * rng.standard_normal((n, d)).astype(np.float32), 0.0, 1.0)
        return x.astype(np.float32), y

    x, y = draw(n_train)
    xt, yt = draw(n_test)
    return Images("synthetic", rms_normalise(x), y, rms_normalise(xt), yt, x, xt, classes,
                  f"generated: {classes} sparse binary prototypes in {d} pixels + noise, RMS-normalised")


def images_for(cfg: dict, ctx: "Context", *, seed: int = 0) -> Images:
    """The data a configuration names: ``dataset`` = an image dataset (``n_train``/``n_test``)
    or ``"synthetic"`` (smoke presets)."""
    if cfg["dataset"] == "synthetic":
        return synthetic_images(cfg["n_train"], cfg["n_test"], d=cfg.get("d", 256), seed=seed)
    return load_images(cfg["dataset"], cfg.get("n_train"), cfg.get("n_test"), data_dir=ctx.data_dir, seed=seed)

class SeededImages:
    """``data(seed)``: :func:`images_for` of one seed (its random subset and order; for generated data
    its draw), the last one kept so that a loop over models within a seed loads the data once."""

    def __init__(self, cfg: dict, ctx: "Context"):
        self.cfg, self.ctx, self._seed, self._data = cfg, ctx, None, None

    def __call__(self, seed: int) -> Images:
        if self._seed != seed:
            self._data, self._seed = None, None
            self._data, self._seed = images_for(self.cfg, self.ctx, seed=seed), seed
        return self._data


# ------------------------------------------------------------------------------------------ running

class Context:
    """What a running reproduction may use: its output folder, the data folder, the progress
    bar (``ctx.bar``, steps), ``ctx.note(text)`` for the JSON's notes and a resumable cache of
    finished runs (``ctx.cached(key, fn)``)."""

    def __init__(self, name: str, preset: str, out: Path, data_dir=None, *, resume: bool = False,
                 progress: bool = True):
        self.name, self.preset, self.out, self.data_dir = name, preset, Path(out), data_dir
        self.notes: List[str] = []
        self.bar = None
        self._progress = progress
        self._partial = self.out / f"{name}.partial.jsonl"
        self._units = self.out / f"{name}.units"    # the running unit's checkpoints (Context.unit_dir)
        self._unit: Optional[str] = None
        self._done: Dict[str, Any] = {}
        if not resume:
            shutil.rmtree(self._units, ignore_errors=True)
        if resume and self._partial.exists():
            for line in self._partial.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:   # a line cut by a kill: that run is redone
                    continue
                if rec.get("preset") == preset:
                    self._done[rec["key"]] = rec["result"]
        elif self._partial.exists():
            self._partial.unlink()

    def start(self, total: int, desc: Optional[str] = None):
        self.bar = progress_bar(int(total), desc or f"repro {self.name} [{self.preset}]", enabled=self._progress)
        return self.bar

    def update(self, n: int = 1):
        if self.bar is not None:
            self.bar.update(n)

    def more(self, n: int):
        """``n`` steps more than :meth:`start` counted (a sweep extending its grid past the values it was
        given), so the bar's total and ETA stay true."""
        if self.bar is not None and n > 0:
            self.bar.total = (self.bar.total or 0) + int(n)
            self.bar.refresh()

    def status(self, text: str):
        if self.bar is not None:
            self.bar.set_postfix_str(text[:60])

    def note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)

    def cached(self, key, fn: Callable[[], dict], steps: int = 0) -> dict:
        """``fn()``'s result, or the one a killed run of the same preset already finished
        (``--resume``); ``steps`` advances the bar when the result is reused."""
        k = json.dumps(key, sort_keys=True, default=str)
        if k in self._done:
            self.update(steps)
            return self._done[k]
        self._unit = k
        try:
            result = fn()
            folder = self.unit_dir()
        finally:
            self._unit = None
        from ..reporting import _jsonable
        result = _jsonable(result)
        self.out.mkdir(parents=True, exist_ok=True)
        with self._partial.open("a") as f:
            f.write(json.dumps({"preset": self.preset, "key": k, "result": result}) + "\n")
        self._done[k] = result
        shutil.rmtree(folder, ignore_errors=True)   # finished: its result is the cache's line, not the checkpoint
        return result

    def unit_dir(self) -> Optional[Path]:
        """The folder where the unit :meth:`cached` is running keeps its in-progress checkpoints
        (:class:`UnitCheckpoint`), named by the unit's key; None outside :meth:`cached`. ``--resume`` goes on
        from them; a run without it removes them at its start."""
        if self._unit is None:
            return None
        return self._units / hashlib.sha1(f"{self.preset}/{self._unit}".encode()).hexdigest()[:16]

    def finish(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._partial.unlink(missing_ok=True)
        shutil.rmtree(self._units, ignore_errors=True)


#: a long unit of a reproduction checkpoints itself about this often (seconds; :class:`UnitCheckpoint`)
UNIT_EVERY_S = 600.0


class UnitCheckpoint:
    """A long unit of a reproduction that a kill does not lose: :func:`growmem.train.fit` with the trainer, the
    loop's own record (``carry``: a JSON dict its callbacks fill) and the evaluations so far checkpointed in
    ``folder`` (a :class:`~growmem.checkpoint.Checkpointer` keeping the latest) every ``every`` steps, once at
    least ``min_seconds`` passed since the last one (the last step is not saved: the finished unit is the
    cache's line). Built again on the same folder (``--resume``), it restores the trainer and ``carry`` and
    :meth:`fit` goes on from that step — bitwise, where the batches are a function of the step.
    ``folder`` None: a plain ``fit``, nothing saved. ``key``: checked against the saved one."""

    def __init__(self, folder: Optional[Path], trainer, *, every: int, min_seconds: float = UNIT_EVERY_S,
                 key=None):
        if every < 1:
            raise ConfigError(f"a unit checkpoints every >= 1 steps, got every={every}")
        self.trainer, self.every, self.min_seconds = trainer, int(every), float(min_seconds)
        self.key = None if key is None else json.loads(json.dumps(key, default=str))
        self.start, self.carry, self.evals, self._spent = 0, {}, [], 0.0
        self._ck, self._t0 = None, None
        if folder is None:
            return
        from ..checkpoint import Checkpointer
        self._ck = Checkpointer(folder, keep=1)
        if self._ck.latest_step() is not None:
            r = self._ck.restore(trainer, config=self.key)
            self.start, self._spent = r.step, float(r.extra["seconds"])
            self.carry, self.evals = r.extra["carry"], r.extra["evals"]

    @property
    def resumed(self) -> bool:
        """Whether the state came from a checkpoint (``carry`` holds what the loop recorded before it)."""
        return self.start > 0

    def seconds(self) -> float:
        """The unit's seconds so far, over every process that ran it (checkpoint writes left out)."""
        return self._spent + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def fit(self, batches, *, steps: int, evaluate=None, eval_every: int = 0,
            before_save: Optional[Callable[[], None]] = None, **kw) -> dict:
        """``growmem.train.fit`` from :attr:`start` to ``steps``; its ``evals`` from step 0 on and its
        ``seconds`` over every process that ran the unit. ``before_save()``: called before each checkpoint
        (e.g. to move what the loop holds on the device into :attr:`carry`)."""
        from ..train import fit
        last = [time.perf_counter()]

        def ev(step):
            e = evaluate(step)
            if e:
                self.evals.append(dict(e, step=step))
            return e

        def save(step):
            if step == steps or time.perf_counter() - last[0] < self.min_seconds:
                return
            if before_save is not None:
                before_save()
            self._spent, self._t0 = self.seconds(), None
            self._ck.save(self.trainer, step, config=self.key,
                          extra={"carry": self.carry, "evals": self.evals, "seconds": self._spent})
            last[0] = self._t0 = time.perf_counter()

        self._t0 = time.perf_counter()
        try:
            out = fit(self.trainer, batches, steps=steps, start=self.start,
                      checkpoint=save if self._ck is not None else None, every=self.every,
                      evaluate=ev if evaluate is not None else None, eval_every=eval_every, **kw)
        finally:
            self._spent, self._t0 = self.seconds(), None
            if self._ck is not None:
                self._ck.close()
        return {**out, "evals": list(self.evals), "seconds": self._spent}


def sweep(ctx: Context, model: str, grid: Sequence[dict], fn: Callable[[dict], dict], *,
          score: str = "accuracy", steps: int = 0, higher: bool = True, extend: Optional[dict] = None,
          reasons: Optional[Dict[str, str]] = None) -> dict:
    """Run ``fn(hyper)`` for every configuration of ``grid`` (cached; see :meth:`Context.cached`)
    and keep the best by ``score`` (the paper's selection, App. F.1: the hyperparameters that
    maximise the plotted metric). A configuration whose loss diverges is recorded with its
    message and skipped; when every one diverges the sweep raises that
    :class:`~growmem.train.NonFiniteLossError`.

    ``extend = {axis: steps}`` (or ``{axis: {"steps": n, "scale": "log" | "log1m"}}``): while the
    best value of that axis sits at an end of the values tried, one more value beyond that end is
    tried (the best configuration with only that axis changed; the next value continues the
    geometric spacing of the two end values — of ``1 − v`` for ``"log1m"``, a momentum), at most
    ``steps`` times per end. ``grid_edges`` (:func:`grid_edges`) then says, for every axis whose best
    value still sits at an end, why: the next value diverged, the extension limit, a bound, or
    ``reasons[axis]`` (the preset's reason for not extending it).
    -> ``{"best", "runs", "edges"}``."""
    from ..train import NonFiniteLossError
    runs, first_error, seen = [], None, set()
    extend = {k: (v if isinstance(v, dict) else {"steps": int(v)}) for k, v in (extend or {}).items()}

    def run_one(hp):
        nonlocal first_error
        key = json.dumps(hp, sort_keys=True, default=str)
        if key in seen:
            return next(r for r in runs if json.dumps(r["hyper"], sort_keys=True, default=str) == key)
        seen.add(key)
        ctx.status(f"{model} {hp}")

        def one(hp=hp):
            try:
                return {"hyper": hp, **fn(hp)}
            except NonFiniteLossError as e:
                return {"hyper": hp, "diverged": str(e)}

        r = ctx.cached([model, hp], one, steps)
        if "diverged" in r:
            first_error = first_error or r["diverged"]
        runs.append(r)
        return r

    def finite(r):
        return "diverged" not in r and r.get(score) is not None and math.isfinite(r[score])

    def best_of():
        ok = [r for r in runs if finite(r)]
        if not ok:
            raise NonFiniteLossError(f"{model}: every configuration diverged ({len(runs)} tried); the first: "
                                     f"{first_error}")
        return (max if higher else min)(ok, key=lambda r: r[score])

    for hp in grid:
        run_one(dict(hp))
    extended = {(axis, side): 0 for axis in extend for side in ("low", "high")}
    stopped: Dict[Tuple[str, str], str] = {}
    while True:
        best = best_of()
        proposals = []
        for axis, spec in extend.items():
            values = _axis_values(runs, axis)
            v = best["hyper"].get(axis)
            if len(values) < 2 or not _numeric(v):
                continue
            for side, end, nb in (("low", values[0], values[1]), ("high", values[-1], values[-2])):
                if v != end or (axis, side) in stopped:
                    continue
                if extended[(axis, side)] >= spec["steps"]:
                    stopped[(axis, side)] = f"the extension limit ({spec['steps']} values beyond the grid) was reached"
                    continue
                nxt = _next_value(end, nb, spec.get("scale", "log"))
                if nxt is None:
                    stopped[(axis, side)] = f"{end:g} is the bound of {axis}"
                    continue
                proposals.append((axis, side, nxt))
        if not proposals:
            break
        for axis, side, nxt in proposals:
            extended[(axis, side)] += 1
            hp = {**best["hyper"], axis: nxt}
            if json.dumps(hp, sort_keys=True, default=str) not in seen:
                ctx.more(steps)                  # a run the bar's total did not count
            r = run_one(hp)
            if not finite(r):
                stopped[(axis, side)] = f"{axis} = {nxt:g} beyond it diverged (the best sits at the stability edge)"
    best = best_of()
    edges = grid_edges(runs, best, reasons=reasons, stopped=stopped, extended=extended)
    return {"best": best, "runs": runs, "edges": edges}


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _axis_values(runs: Sequence[dict], axis: str) -> List[float]:
    return sorted({r["hyper"][axis] for r in runs if _numeric(r["hyper"].get(axis))})


def _next_value(end: float, neighbour: float, scale: str) -> Optional[float]:
    """The value beyond ``end`` continuing the spacing from ``neighbour`` (geometric; of ``1 − v`` for
    ``"log1m"``); None at a bound (0, or 1 for ``log1m``)."""
    if scale == "log1m":
        a, b = 1.0 - end, 1.0 - neighbour
        if a <= 0 or b <= 0:
            return None
        return float(f"{1.0 - a * a / b:.6g}")
    if scale != "log":
        raise ReproError(f"extension scale must be 'log' or 'log1m', got {scale!r}")
    if end <= 0 or neighbour <= 0:
        return None
    return float(f"{end * end / neighbour:.6g}")


def grid_edges(runs: Sequence[dict], best: dict, *, reasons: Optional[Dict[str, str]] = None,
               stopped: Optional[dict] = None, extended: Optional[dict] = None) -> Dict[str, dict]:
    """``{axis: {"value", "edge": "low" | "high", "values", "extended", "reason"}}`` for every numeric
    axis with at least two finished values whose best value is the smallest or largest of them (an
    optimum the grid may not contain), each with why it was left there: a value beyond it diverged,
    the extension limit or a bound was reached, or ``reasons[axis]``."""
    finished = [r for r in runs if "diverged" not in r]
    out = {}
    for axis in sorted(best["hyper"]):
        v = best["hyper"][axis]
        values = _axis_values(finished, axis)
        if not _numeric(v) or len(values) < 2 or v not in (values[0], values[-1]):
            continue
        side = "low" if v == values[0] else "high"
        beyond = [r["hyper"][axis] for r in runs if "diverged" in r and _numeric(r["hyper"].get(axis))
                  and (r["hyper"][axis] < v if side == "low" else r["hyper"][axis] > v)]
        why = (stopped or {}).get((axis, side))
        if why is None and beyond:
            nearest = max(beyond) if side == "low" else min(beyond)
            why = f"{axis} = {nearest:g} beyond it diverged (the best sits at the stability edge)"
        if why is None:
            why = (reasons or {}).get(axis, "not extended in this preset")
        n_ext = (extended or {}).get((axis, side), 0)
        out[axis] = {"value": v, "edge": side, "values": values, "extended": n_ext, "reason": why}
    return out


def select_and_seed(ctx: Context, model: str, grid: Sequence[dict], fn: Callable[[dict, int], dict],
                    seeds: Sequence[int], *, score: str = "accuracy", steps: int = 0, higher: bool = True,
                    extend: Optional[dict] = None, reasons: Optional[Dict[str, str]] = None) -> dict:
    """The hyperparameters chosen by :func:`sweep` on the first seed, then that configuration run on
    every other seed (cached): ``{"best" (the chosen run of the first seed), "hyper", "edges",
    "runs" (the sweep), "by_seed": [result per seed, in ``seeds`` order], "selected_on": seed}``.
    The first seed's value is the selected one, so it is biased up a little; every model of an
    experiment is selected the same way."""
    seeds = list(seeds)
    sw = sweep(ctx, model, grid, lambda hp: fn(hp, seeds[0]), score=score, steps=steps, higher=higher,
               extend=extend, reasons=reasons)
    hp = sw["best"]["hyper"]
    by_seed = [sw["best"]]
    for s in seeds[1:]:
        by_seed.append(ctx.cached([model, "seed", s, hp], lambda s=s: {"hyper": hp, **fn(hp, s)}, steps))
    return {"best": sw["best"], "hyper": hp, "edges": sw["edges"], "runs": sw["runs"], "by_seed": by_seed,
            "selected_on": seeds[0]}


def accuracy(predict: Callable, x, y, batch: int = 1000) -> float:
    """Test accuracy of ``predict(x_batch) -> logits``, batch by batch."""
    correct = 0
    for i in range(0, len(x), batch):
        correct += int(np.sum(np.asarray(predict(x[i:i + batch])).argmax(-1) == y[i:i + batch]))
    return correct / max(len(x), 1)


def grid(spec: dict) -> List[dict]:
    """Cartesian product of ``{name: [values]}`` as a list of ``{name: value}``."""
    import itertools
    keys = sorted(spec)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(spec[k] for k in keys))]


# ------------------------------------------------------------------------------------------ verdicts
#
# Every claim is decided from per-seed values by one rule (:data:`growmem.reporting.RULE`):
# *reproduced* only if the claimed ordering holds by a paired Student t-test at 95 % (t quantile with
# n − 1 degrees of freedom), *contradicted* if the opposite holds by the same test, otherwise
# *inconclusive* — with the number of seeds at which the present mean difference would pass it
# (``n_needed``), where that can be estimated. The test itself is :func:`growmem.reporting.compare`.

from ..reporting import CONFIDENCE, seeds_needed  # noqa: E402  (re-exported: the one rule)

#: the fewest seeds a ``cpu`` or ``paper`` preset runs (the paper reports 5, App. F)
MIN_SEEDS = 3
REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE)


def _values(v) -> Optional[List[float]]:
    """Per-seed values as floats (a scalar is one value; None stays None)."""
    if v is None:
        return None
    if isinstance(v, dict) and "values" in v:
        v = v["values"]
    if isinstance(v, (int, float)):
        v = [v]
    return [float(x) for x in v]


def beats(a, b, *, margin: float = 0.0, higher: bool = True, paired: bool = True, confidence: float = CONFIDENCE,
          names: Tuple[str, str] = ("a", "b")) -> dict:
    """Whether ``a`` beats ``b`` by more than ``margin`` (higher values when ``higher``, lower otherwise),
    decided by :func:`growmem.reporting.compare` on per-seed values: ``{"a", "b", "margin", "higher",
    "difference" (mean a − mean b), "comparison", "verdict", "n", "n_needed"}``. A scalar ``b`` is a
    fixed reference (every seed compared with it); ``margin`` is in the units of the values and
    counts in the claim's direction (``a`` must exceed ``b + margin``, or fall below ``b − margin``)."""
    from ..reporting import compare, mean_std
    av, bv = _values(a), _values(b)
    part = {"a": names[0], "b": names[1], "margin": margin, "higher": higher, "paired": paired}
    if not av or not bv:
        return {**part, "difference": None, "comparison": "untested", "verdict": INCONCLUSIVE, "n": 0,
                "n_needed": None, "why": "a value is missing"}
    if len(bv) == 1 and len(av) > 1:   # a fixed reference number
        bv = bv * len(av)
    if paired and len(av) != len(bv):
        raise ConfigError(f"{names[0]} vs {names[1]}: a paired comparison needs one value per seed on both sides, "
                          f"got {len(av)} and {len(bv)}")
    shifted = [x - margin for x in av] if higher else [x + margin for x in av]
    cmp = compare(shifted, bv, higher=higher, confidence=confidence, paired=paired)
    verdict = {"better": REPRODUCED, "worse": CONTRADICTED}.get(cmp, INCONCLUSIVE)
    n = min(len(av), len(bv))
    need = None
    if verdict == INCONCLUSIVE:
        need = seeds_needed(shifted, bv, paired=paired, confidence=confidence)
        if need is not None:
            need = max(need, n + 1)
    return {**part, "difference": mean_std(av)["mean"] - mean_std(bv)["mean"], "comparison": cmp,
            "verdict": verdict, "n": n, "n_needed": need}


def combine(parts: Sequence[dict], *, rule: str, claim: str = "", mode: str = "all") -> dict:
    """One claim from its parts. ``mode="all"`` (every part must hold): *reproduced* when every part
    is, *contradicted* when any part is, else *inconclusive*; ``mode="any"`` (some part must hold):
    *reproduced* when any part is, *contradicted* when every part is, else *inconclusive*.
    ``n_needed``: the largest estimate among the undecided parts (None when any of them has none)."""
    verdicts = [p["verdict"] for p in parts]
    if not parts:
        verdict = INCONCLUSIVE
    elif mode == "all":
        verdict = (REPRODUCED if all(v == REPRODUCED for v in verdicts)
                   else CONTRADICTED if CONTRADICTED in verdicts else INCONCLUSIVE)
    elif mode == "any":
        verdict = (REPRODUCED if REPRODUCED in verdicts
                   else CONTRADICTED if all(v == CONTRADICTED for v in verdicts) else INCONCLUSIVE)
    else:
        raise ConfigError(f"mode must be 'all' or 'any', got {mode!r}")
    need = None
    if verdict == INCONCLUSIVE:
        open_ = [p for p in parts if p["verdict"] == INCONCLUSIVE]
        ests = [p.get("n_needed") for p in open_]
        need = max(ests) if open_ and all(e is not None for e in ests) else None
    return {"claim": claim, "rule": rule, "verdict": verdict, "n_needed": need, "parts": list(parts)}


def ordering(values: Dict[str, Any], winners: Sequence[str], losers: Sequence[str], *, higher: bool = True,
             margin: float = 0.0, paired: bool = True, confidence: float = CONFIDENCE, claim: str = "") -> dict:
    """The claim "every one of ``winners`` beats every one of ``losers``" on per-seed ``values``
    (``{name: [value per seed]}``, in the same seed order for every name), decided part by part
    with :func:`beats` and combined with :func:`combine` (all parts must hold)."""
    parts = [beats(values.get(w), values.get(l), margin=margin, higher=higher, paired=paired, confidence=confidence, names=(w, l))
             for w in winners for l in losers]
    side = "higher" if higher else "lower"
    rule = (f"each of {', '.join(winners)} {side} than each of {', '.join(losers)}"
            + (f" by more than {margin:g}" if margin else "") + f", by a paired t-test at {confidence:.0%}"
            + (" (paired by seed)" if paired else ""))
    return combine(parts, rule=rule, claim=claim)


def within(a, b, tolerance: float, *, paired: bool = True, confidence: float = CONFIDENCE, names=("a", "b"), claim: str = "") -> dict:
    """The claim "``a`` lies within ± ``tolerance`` of ``b``": *reproduced* when ``a`` is both above
    ``b − tolerance`` and below ``b + tolerance`` by the t-test, *contradicted* when it
    is outside that band by the t-test on either side, else *inconclusive*."""
    above = beats(a, b, margin=-tolerance, higher=True, paired=paired, confidence=confidence, names=names)
    below = beats(a, b, margin=-tolerance, higher=False, paired=paired, confidence=confidence, names=names)
    parts = [above, below]
    if CONTRADICTED in (above["verdict"], below["verdict"]):
        verdict = CONTRADICTED
    elif above["verdict"] == below["verdict"] == REPRODUCED:
        verdict = REPRODUCED
    else:
        verdict = INCONCLUSIVE
    open_ = [p.get("n_needed") for p in parts if p["verdict"] == INCONCLUSIVE]
    need = max(open_) if verdict == INCONCLUSIVE and open_ and None not in open_ else None
    return {"claim": claim, "rule": f"{names[0]} within ± {tolerance:g} of {names[1]}, by a paired t-test at {confidence:.0%}",
            "verdict": verdict, "n_needed": need, "parts": parts}


def overall(claims: Dict[str, dict]) -> dict:
    """An experiment's verdict from its claims (all must hold; see :func:`combine`)."""
    return combine([{"verdict": c["verdict"], "n_needed": c.get("n_needed")} for c in claims.values()],
                   rule="every claim", mode="all")


def verdict(claim) -> str:
    """The README table's words for a claim: *reproduced*, *contradicted* or *inconclusive at this size*
    (with the seeds that would decide it, where that can be estimated)."""
    if claim is None:
        return "not decided"
    v = claim["verdict"] if isinstance(claim, dict) else claim
    if v == REPRODUCED:
        return "reproduced"
    if v == CONTRADICTED:
        return "contradicted"
    need = claim.get("n_needed") if isinstance(claim, dict) else None
    return "inconclusive at this size" + (f" (≈ {need} seeds would decide it)" if need else "")


def metric(values: Sequence[float]) -> dict:
    """Mean ± sample std over seeds (:func:`growmem.reporting.mean_std`)."""
    from ..reporting import mean_std
    return mean_std([float(v) for v in values])


def pm(m: dict, scale: float = 100.0, digits: int = 2, unit: str = " %") -> str:
    """``"mean ± std unit"`` of a :func:`metric` (percent by default)."""
    return f"{scale * m['mean']:.{digits}f} ± {scale * m['std']:.{digits}f}{unit}"


def seeds_of(cfg: dict) -> List[int]:
    """The preset's seeds (``cfg["seeds"]``)."""
    seeds = [int(s) for s in cfg["seeds"]]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ReproError(f"seeds must be distinct integers, got {cfg['seeds']!r}")
    return seeds


def pct(x: Optional[float], digits: int = 2) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f} %"


# ------------------------------------------------------------------------------------------ writing

def command_line(name: str, preset: str, extra: Sequence[str] = ()) -> str:
    return " ".join(["growmem repro", name, "--preset", preset, *extra])


def check_overwrite(out: Path, name: str, preset: str):
    """Refuse a run whose ``out/NAME.json`` would replace another preset's result (a smoke run over a
    cpu run's JSON) or a file that is not a reproduction's result."""
    path = Path(out) / f"{name}.json"
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text()).get("preset")
    except (OSError, ValueError, AttributeError):
        old = None
    if old is None:
        raise ReproError(f"{path} is not a growmem repro result; a {preset} run would replace it: pass another "
                         f"--out, or move that file away")
    if old != preset:
        raise ReproError(f"{path} holds the {old} preset's result; a {preset} run would replace it: pass another "
                         f"--out, or remove that file first")


def write_results(exp: Experiment, preset: str, cfg: dict, payload: dict, out: Path, *, seconds: float,
                  notes: Sequence[str], command: str) -> Tuple[Path, Path]:
    """``out/NAME.json`` (``summary`` first) and ``out/NAME.png``, each written atomically."""
    from ..reporting import pyplot, save_figure, write_json
    if "summary" not in payload:
        raise RunError(f"{exp.name}: run() returned no summary")
    missing = [k for k in ("seeds", "metrics", "claims", "verdict") if k not in payload["summary"]]
    if missing:
        raise RunError(f"{exp.name}: run()'s summary lacks {missing} (every experiment reports its seeds, "
                       f"per-metric mean/std and its claims' verdicts)")
    doc = {"experiment": exp.name, "preset": preset, "paper": exp.paper, "claim": exp.claim,
           "summary": payload["summary"], "command": command, "config": cfg, "notes": list(notes),
           "seconds": seconds, **{k: v for k, v in payload.items() if k != "summary"}}
    json_path = write_json(Path(out) / f"{exp.name}.json", doc)
    plt = pyplot()
    fig = exp.plot(doc, plt)
    fig.suptitle(f"{exp.name} [{preset}] — {exp.paper}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))   # room for the suptitle above the panels' titles
    png = save_figure(fig, Path(out) / f"{exp.name}.png")
    plt.close(fig)
    return json_path, png
