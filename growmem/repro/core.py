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
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

#: where ``growmem repro`` writes by default (relative to the working directory: the repository root)
DEFAULT_OUT = Path("benchmarks") / "results" / "repro"
PRESETS = ("smoke", "cpu", "paper")
#: datasets a preset may need (everything else is generated)
IMAGE_DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100")


class ReproError(Exception):
    """A reproduction cannot start: an unknown experiment or preset, bad overrides (exit 2)."""


class UnknownExperimentError(ReproError, KeyError):
    """No experiment of that name; the message lists every experiment with one line each."""

    def __str__(self):   # KeyError would quote the message
        return self.args[0] if self.args else ""


class UnknownPresetError(ReproError, KeyError):
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
            raise UnknownPresetError(f"unknown preset {name!r} for {self.name}; valid presets: "
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
    if augment:
        return AugmentedBatches(data, batch, seed=seed)
    return Batches(data.x, data.y, batch, rng=jax.random.key(seed), shuffle=True)


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


# ------------------------------------------------------------------------------------------ running

def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on a terminal, or anywhere with GROWMEM_PROGRESS=1 (a log or a pipe gets the
    results, not bar frames) — growmem's convention (:func:`growmem.train.fit`)."""
    from tqdm.auto import tqdm
    force = os.environ.get("GROWMEM_PROGRESS") == "1"
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True,
                disable=(not enabled) or (False if force else None))


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
        self._done: Dict[str, Any] = {}
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
        self.bar = progress_bar(int(total), desc or f"repro {self.name} [{self.preset}]", self._progress)
        return self.bar

    def update(self, n: int = 1):
        if self.bar is not None:
            self.bar.update(n)

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
        result = fn()
        from ..reporting import _jsonable
        result = _jsonable(result)
        self.out.mkdir(parents=True, exist_ok=True)
        with self._partial.open("a") as f:
            f.write(json.dumps({"preset": self.preset, "key": k, "result": result}) + "\n")
        self._done[k] = result
        return result

    def finish(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._partial.unlink(missing_ok=True)


class LossWatch:
    """Device losses of a parametric loop, read in one sync every ``every`` steps: a NaN/inf
    stops the run with :class:`growmem.train.NonFiniteLossError` naming the step and the last
    finite loss (as :func:`growmem.train.fit` does for growing models)."""

    def __init__(self, every: int = 256):
        self.every = every
        self.pending: List[Tuple[int, Any]] = []
        self.last_finite: Optional[Tuple[int, float]] = None
        self.history: List[Tuple[int, float]] = []

    def add(self, step: int, loss) -> None:
        self.pending.append((step, loss))
        if len(self.pending) >= self.every:
            self.check()

    def check(self) -> None:
        if not self.pending:
            return
        import jax
        vals = np.asarray(jax.device_get([l for _, l in self.pending]), np.float64).reshape(-1)
        steps = [s for s, _ in self.pending]
        self.pending.clear()
        for s, l in zip(steps, vals):
            if not math.isfinite(l):
                from ..train import NonFiniteLossError
                lf = ("none yet" if self.last_finite is None
                      else f"{self.last_finite[1]:.6g} at step {self.last_finite[0]}")
                raise NonFiniteLossError(f"the training loss became {l} at step {s} (last finite loss: {lf}) — "
                                         f"lower the learning rate (or check the data)")
            self.last_finite = (s, float(l))
            self.history.append((s, float(l)))


def sweep(ctx: Context, model: str, grid: Sequence[dict], fn: Callable[[dict], dict], *,
          score: str = "accuracy", steps: int = 0, higher: bool = True) -> dict:
    """Run ``fn(hyper)`` for every configuration of ``grid`` (cached; see :meth:`Context.cached`)
    and keep the best by ``score`` (the paper's selection, App. F.1: the hyperparameters that
    maximise the plotted metric). A configuration whose loss diverges is recorded with its
    message and skipped; when every one diverges the sweep raises that
    :class:`~growmem.train.NonFiniteLossError`. -> ``{"best", "runs"}``."""
    from ..train import NonFiniteLossError
    runs, first_error = [], None
    for hp in grid:
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
    ok = [r for r in runs if "diverged" not in r and r.get(score) is not None and math.isfinite(r[score])]
    if not ok:
        raise NonFiniteLossError(f"{model}: every configuration diverged ({len(runs)} tried); the first: "
                                 f"{first_error}")
    best = (max if higher else min)(ok, key=lambda r: r[score])
    return {"best": best, "runs": runs}


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


def ordering(values: Dict[str, Optional[float]], winners: Sequence[str], losers: Sequence[str],
             higher: bool = True) -> bool:
    """Whether every one of ``winners`` beats every one of ``losers`` (a missing value: False)."""
    try:
        w = [values[k] for k in winners]
        l = [values[k] for k in losers]
    except KeyError:
        return False
    if any(v is None for v in w + l):
        return False
    return min(w) > max(l) if higher else max(w) < min(l)


def verdict(ok) -> str:
    """The README table's word for a claim's ordering."""
    return "reproduced" if ok else "NOT reproduced"


def pct(x: Optional[float], digits: int = 2) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f} %"


# ------------------------------------------------------------------------------------------ writing

def command_line(name: str, preset: str, extra: Sequence[str] = ()) -> str:
    return " ".join(["growmem repro", name, "--preset", preset, *extra])


def write_results(exp: Experiment, preset: str, cfg: dict, payload: dict, out: Path, *, seconds: float,
                  notes: Sequence[str], command: str) -> Tuple[Path, Path]:
    """``out/NAME.json`` (``summary`` first) and ``out/NAME.png``, each written atomically."""
    from ..reporting import pyplot, save_figure, write_json
    if "summary" not in payload:
        raise RuntimeError(f"{exp.name}: run() returned no summary")
    doc = {"experiment": exp.name, "preset": preset, "paper": exp.paper, "claim": exp.claim,
           "summary": payload["summary"], "command": command, "config": cfg, "notes": list(notes),
           "seconds": seconds, **{k: v for k, v in payload.items() if k != "summary"}}
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    import jax
    doc["environment"] = {"python": sys.version.split()[0], "jax": jax.__version__,
                          "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
                          "load_average": load,
                          "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    json_path = write_json(Path(out) / f"{exp.name}.json", doc)
    plt = pyplot()
    fig = exp.plot(doc, plt)
    fig.suptitle(f"{exp.name} [{preset}] — {exp.paper}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))   # room for the suptitle above the panels' titles
    png = save_figure(fig, Path(out) / f"{exp.name}.png")
    plt.close(fig)
    return json_path, png
