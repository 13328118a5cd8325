"""Avalanche's own strategies as baselines, each with its recipe, and how their state is saved.

Every baseline is Avalanche's strategy class. Unless its recipe says otherwise the model is
Avalanche's ``SimpleMLP`` (2 hidden layers of 400 units, **no dropout**; a classifier head per task
on task-incremental streams) trained by SGD with momentum 0.9 on mini-batches of 64:

=============== ============================================================================
``naive``        ``Naive`` (fine-tuning, the lower bound)
``ewc``          ``EWC``, mode ``separate``, λ chosen on the validation split
``lwf``          ``LwF``, α (one value for every experience) and the distillation temperature
                 chosen on the validation split
``gdumb``        ``GDumb`` with its authors' MNIST recipe (``drimpossible/GDumb``,
                 ``scripts/replicate.sh``): 4400 samples, an MLP 784-400-400 with batch norm and
                 no biases, 128 passes over the memory with SGD (momentum 0.9, weight decay 1e-6,
                 batch 16, gradient norm clipped at 10), one warm-up pass at 0.1 × lr 0.05, then
                 cosine annealing with warm restarts (T₀ = 1, T_mult = 2, down to 5e-4); the model
                 after the last pass is evaluated (the authors' script reports the best pass on the
                 test set, which we do not)
``replay_N``     ``Replay`` with a buffer of N samples (``replay_1000``, ``replay_4400``, any N)
``replay_bytes`` ``Replay`` with as many samples as the memory budget holds next to the model and
                 its optimizer state (budget-matched replay; needs a budget)
``gdumb_bytes``  ``GDumb`` with its recipe and as many samples as the memory budget holds next to
                 the model, its optimizer state and GDumb's copy of the initial model
                 (budget-matched GDumb; needs a budget). For both ``*_bytes`` methods the recipe's
                 width is kept where model and state take at most half the budget, else the widest
                 of 512/256/.../4 units that does (``budgets.budget_fixed_bytes``)
``er_<policy>:<store>`` online experience replay (:class:`OnlineReplay` on Avalanche's ``Naive``): every
                 mini-batch of 10 stream samples is trained on together with 10 samples drawn from a
                 buffer, then offered to it — ``reservoir`` (uniform over the stream) or
                 ``balanced`` (class-balanced reservoir); the buffer holds ``raw`` 8-bit images or
                 ``dct`` / ``proj`` codes (the target_dct / target_proj_merge preset's keys,
                 bfloat16) and as many samples as the
                 budget holds beside the model; the recipe is Avalanche's online-replay baseline
                 (SGD lr 0.1, one hidden layer), its width the widest of 512/256/.../4 units
                 whose parameters take at most half the budget
``cumulative``   ``Cumulative`` (retrains on everything seen so far)
``joint``        ``JointTraining`` (the whole stream at once, offline: the upper bound)
=============== ============================================================================

:data:`SETTINGS` holds the shared defaults, :data:`RECIPES` what each method changes, and
:data:`TUNED` values a user fixes per stream (empty as shipped: ``benchmarks/continual.py`` passes the
values ``benchmarks/continual_tune.py`` chose on each stream's validation split, read from
``benchmarks/results/continual_tune.json``, as ``settings``). ``settings`` passed to
:func:`make_baseline` override all three.

**Resume.** After each experience (and its evaluation) a continual run saves the strategy's learning
state — the model, the optimizer, the plugins' state (EWC's importances, LwF's previous model, the replay
and GDumb buffers as places in the stream...) and Cumulative's dataset — through growmem's ``Checkpointer``
(:mod:`growmem.continual.baseline_state`), and puts it back into a strategy built afresh on the same stream
rebuilt from its seed. A run killed during an experience restarts that experience from the state saved
after the previous one (and the torch RNG is re-seeded from ``(seed, experience)`` before every
experience), so it ends with the same results. ``joint`` trains once on everything: killed, it starts over.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import re
import warnings
from typing import Any, Dict, Optional

import numpy as np

from ..reservoir import POLICIES, Slots
from .errors import ConfigError, require_avalanche, unknown

require_avalanche()

import torch  # noqa: E402
from avalanche.core import SupervisedPlugin  # noqa: E402

from .methods import BUDGET_MATCHED, ONLINE_REPLAY  # noqa: E402

BASELINES = ("naive", "ewc", "lwf", "gdumb", "gdumb_bytes", "replay_1000", "replay_4400", "replay_bytes", "cumulative",
             "joint",
             *ONLINE_REPLAY)
_REPLAY = re.compile(r"^replay_(\d+)$")
_ER = re.compile(r"^er_(reservoir|balanced):(raw|dct|proj)$")
#: hidden widths an online-replay MLP may take: the widest whose parameters fit half the budget
ER_WIDTHS = (512, 256, 128, 64, 32, 16, 8, 4)

#: the shared settings of every baseline (see the module docstring)
SETTINGS: Dict[str, Any] = {
    "model": "simple_mlp", "hidden_size": 400, "hidden_layers": 2, "drop_rate": 0.0, "lr": 0.01, "momentum": 0.9,
    "weight_decay": 0.0, "train_mb_size": 64, "eval_mb_size": 256, "clip": None, "schedule": "constant",
    "ewc_lambda": 0.4, "ewc_mode": "separate", "lwf_alpha": None, "lwf_temperature": 1.0, "drop_last": False,
}
#: what each method's recipe changes (its published or documented settings)
RECIPES: Dict[str, Dict[str, Any]] = {
    # Avalanche's online replay on Split-MNIST (continual-learning-baselines, experiments/split_mnist/
    # online_replay.py): SGD lr 0.1 without momentum, 10 stream + 10 buffer samples a step, one pass
    "er": {"hidden_layers": 1, "lr": 0.1, "momentum": 0.0, "train_mb_size": 10, "batch_size_mem": 10, "epochs": 1},
    "gdumb": {"model": "gdumb_mlp", "lr": 0.05, "min_lr": 0.0005, "weight_decay": 1e-6, "train_mb_size": 16,
              "clip": 10.0, "schedule": "gdumb", "epochs": 128, "mem_size": 4400,
              "drop_last": True},   # batch norm needs two samples: a last batch of one is dropped
}
#: epochs per experience by stream, where no recipe or tuning says otherwise
EPOCHS = {"split_mnist": 2, "permuted_mnist": 1}
#: per-stream values over the recipes, ``{stream: {family or name: settings}}`` (empty as shipped: the
#: benchmark passes the tuned values of benchmarks/results/continual_tune.json as settings)
TUNED: Dict[str, Dict[str, Dict[str, Any]]] = {}


#: baselines that retrain their model from scratch at every experience (GDumb: the initial model, a fresh
#: optimizer state): only the last experience's training reaches the final model
RETRAINS_FROM_SCRATCH = ("gdumb", "gdumb_bytes")


def needs_budget(name: str) -> ConfigError:
    """The error of a buffer-sized method run without a memory budget (the one place it is worded)."""
    return ConfigError(f"{name} needs a memory budget (budget_bytes / --memory-budget): its buffer is what the "
                       f"budget holds beside the model")


def _mem_size(name: str, s: dict) -> int:
    if "mem_size" not in s:
        raise needs_budget(name)
    return int(s["mem_size"])


def is_baseline(name: str) -> bool:
    return name in BASELINES or bool(_REPLAY.match(name))


def check_baseline(name: str) -> str:
    if not is_baseline(name):
        raise unknown("baseline", name, BASELINES, "replay_N for any buffer size N")
    return name


def recipe(name: str, stream_name: str, settings: Optional[dict] = None) -> Dict[str, Any]:
    """The settings ``name`` trains with on ``stream_name``: shared defaults, its recipe, the tuned
    values, then ``settings``."""
    family = "replay" if _REPLAY.match(name) else "er" if _ER.match(name) else BUDGET_MATCHED.get(name, name)
    out = {**SETTINGS, **RECIPES.get(family, {}), **TUNED.get(stream_name, {}).get(family, {}),
           **TUNED.get(stream_name, {}).get(name, {}), **(settings or {})}
    m = _REPLAY.match(name)
    if m:
        out["mem_size"] = int(m.group(1))
    if name in BUDGET_MATCHED and "mem_size" not in (settings or {}):
        out.pop("mem_size", None)     # its buffer is what the budget holds, never its family's recipe's
    return out


def lwf_alphas(n_experiences: int):
    """α_i = i²/(i+1): 0, 0.5, 1.333, 2.25, 3.2 for 5 experiences (Avalanche's LwF example), the
    schedule used when no single α is chosen."""
    return [i * i / (i + 1) for i in range(max(1, n_experiences))]


def replay_capacity(budget_bytes: int, fixed_bytes: int, sample_bytes: int) -> int:
    """How many samples of ``sample_bytes`` fit in ``budget_bytes`` beside ``fixed_bytes`` (the model and
    its optimizer state): budget-matched replay's buffer size."""
    n = (int(budget_bytes) - int(fixed_bytes)) // int(sample_bytes)
    if n < 1:
        raise ConfigError(f"a memory budget of {budget_bytes} B does not hold the model and optimizer ({fixed_bytes} "
                          f"B) plus one sample ({sample_bytes} B): raise --memory-budget")
    return int(n)


def is_online_replay(name: str) -> bool:
    return bool(_ER.match(name))


def er_codes(name: str, input_size: int):
    """The fixed map an online-replay buffer stores (the key space of its key set's preset,
    :data:`growmem.continual.methods.KEY_SETS`), or None for raw images."""
    from growmem import config
    from .methods import KEY_SETS

    preset = KEY_SETS[_ER.match(name).group(2)]
    return None if preset is None else config.load(preset).key_space(int(input_size))


def er_model_bytes(n_in: int, hidden: int, n_classes: int) -> int:
    """Bytes of the float32 parameters of online replay's one-hidden-layer MLP."""
    return 4 * (n_in * hidden + hidden + hidden * n_classes + n_classes)


def er_width(budget_bytes: int, n_in: int, n_classes: int) -> int:
    """The widest of :data:`ER_WIDTHS` whose one-hidden-layer MLP's float32 parameters take at most half
    of ``budget_bytes``."""
    for h in ER_WIDTHS:
        if er_model_bytes(n_in, h, n_classes) <= budget_bytes // 2:
            return h
    raise ConfigError(f"a memory budget of {budget_bytes} B does not hold an online-replay MLP of {ER_WIDTHS[-1]} "
                      f"hidden units on {n_in} inputs in half of it: raise --memory-budget")


class OnlineReplay(SupervisedPlugin):
    """Online experience replay (ER: Chaudhry et al. 2019, "On tiny episodic memories in continual
    learning"; Avalanche's online-replay baseline). Before each forward pass the mini-batch of stream
    samples gets ``batch_size_mem`` samples drawn uniformly (with replacement) from the buffer; after the
    update the stream samples are offered to the buffer of ``mem_size`` samples:

    * ``reservoir`` — Vitter's reservoir over the whole stream;
    * ``balanced`` — the class-balanced reservoir (CBRS, Chrysakis & Moens 2020)
      (:mod:`growmem.reservoir` says which sample each keeps).

    ``codes``: a fixed key space (:mod:`growmem.keyspaces`) the inputs pass through before the model and
    the buffer (its unit-norm keys times √d; the buffer then holds bfloat16 codes); without it the buffer holds 8-bit pixels
    (``normalize``: the stream's ``(mean, std)``), decoded when drawn. ``nbytes`` counts what is stored.
    """

    def __init__(self, mem_size: int, batch_size_mem: int, policy: str, n_classes: int, *, seed: int = 0,
                 codes=None, normalize=(0.1307, 0.3081)):
        super().__init__()
        if policy not in POLICIES:
            raise unknown("online replay buffer policy", policy, POLICIES)
        if int(mem_size) < 1 or int(batch_size_mem) < 1:
            raise ConfigError(f"mem_size and batch_size_mem must be >= 1, got {mem_size}, {batch_size_mem}")
        self.mem_size, self.batch_size_mem, self.policy = int(mem_size), int(batch_size_mem), policy
        self.n_classes, self.codes, self.normalize = int(n_classes), codes, normalize
        self.rng = np.random.default_rng(int(seed))
        self.x = None                 # (mem_size, features) uint8 pixels or bfloat16 codes
        self.y = np.zeros(self.mem_size, np.int64)
        self.t = np.zeros(self.mem_size, np.int64)
        self.slots = Slots(self.mem_size, self.n_classes, policy, self.rng)
        self._incoming = None
        self._eval_codes = {}         # codes of the evaluation batches (derived from the test set, not stored)

    @property
    def size(self) -> int:
        return self.slots.size

    @property
    def seen(self) -> int:
        return self.slots.seen

    # --------------------------------------------------------------- what is stored
    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(len(x), -1)
        if self.codes is None:
            return x
        # unit-norm codes scaled by √d: features of unit mean square, the scale SGD's lr 0.1 is set for
        z = np.asarray(self.codes.prepare(x.cpu().numpy()), np.float32) * np.float32(np.sqrt(self.codes.key_dim))
        return torch.from_numpy(z)

    def _encode(self, x: torch.Tensor) -> np.ndarray:
        if self.codes is not None:
            return x.to(torch.bfloat16).view(torch.int16).numpy()      # bfloat16 bits (numpy has no bfloat16)
        mean, std = self.normalize
        return np.clip(np.rint(255.0 * (x.numpy().astype(np.float64) * std + mean)), 0, 255).astype(np.uint8)

    def _decode(self, rows: np.ndarray) -> torch.Tensor:
        if self.codes is not None:
            return torch.from_numpy(np.ascontiguousarray(rows)).view(torch.bfloat16).to(torch.float32)
        mean, std = self.normalize
        return torch.from_numpy((rows.astype(np.float32) / 255.0 - mean) / std)

    @staticmethod
    def sample_bytes(n_features: int, codes=None, task_labels: bool = False) -> int:
        """Bytes of one buffered sample: its input (8-bit pixels, or ``codes``' bfloat16 keys) plus a one-byte
        class (and a one-byte task label)."""
        n = n_features if codes is None else 2 * codes.key_dim
        return int(n + 1 + (1 if task_labels else 0))

    def nbytes(self) -> int:
        """Bytes of the samples in the buffer (:meth:`sample_bytes` each)."""
        if self.x is None:
            return 0
        task = bool(self.t[:self.size].max(initial=0) > 0)
        return self.size * self.sample_bytes(self.x.shape[1] if self.codes is None else 0, self.codes, task)

    # --------------------------------------------------------------- the plugin
    def before_forward(self, strategy, **kwargs):
        x, y, t = strategy.mbatch[0], strategy.mbatch[1], strategy.mbatch[2]
        x = self._inputs(x)
        self._incoming = (x.detach().cpu(), y.detach().cpu(), t.detach().cpu())
        if self.size:
            idx = self.rng.integers(0, self.size, self.batch_size_mem)
            x = torch.cat([x, self._decode(self.x[idx]).to(x.device)])
            y = torch.cat([y, torch.from_numpy(self.y[idx]).to(y.device)])
            t = torch.cat([t, torch.from_numpy(self.t[idx]).to(t.device)])
        strategy.mbatch = [x, y, t, *strategy.mbatch[3:]]

    def before_eval_forward(self, strategy, **kwargs):
        if self.codes is not None:
            x = strategy.mbatch[0]
            key = hashlib.blake2b(x.cpu().numpy().tobytes(), digest_size=16).digest()
            if key not in self._eval_codes:     # the test stream is evaluated after every experience: code it once
                self._eval_codes[key] = self._inputs(x)
            strategy.mbatch = [self._eval_codes[key].to(x.device), *strategy.mbatch[1:]]

    def after_training_iteration(self, strategy, **kwargs):
        x, y, t = self._incoming
        rows = self._encode(x)
        if self.x is None:
            self.x = np.zeros((self.mem_size, rows.shape[1]), rows.dtype)
        for r, c, tt in zip(rows, y.numpy(), t.numpy()):
            slot = self.slots.offer(int(c), self.y)
            if slot is not None:
                self.x[slot], self.y[slot], self.t[slot] = r, c, tt
        self._incoming = None


def experience_seed(seed: int, experience: int) -> int:
    """The torch seed set before training ``experience`` (same for every method and resume)."""
    return int(np.random.SeedSequence([int(seed), int(experience), 0x61766C]).generate_state(1)[0])


class GDumbMLP(torch.nn.Module):
    """GDumb's MNIST model: ``in → width → width → classes``, each a bias-free linear layer with batch
    norm (ReLU after the hidden ones)."""

    def __init__(self, input_size: int, num_classes: int, width: int = 400):
        super().__init__()
        def block(i, o, relu):
            return [torch.nn.Linear(i, o, bias=False), torch.nn.BatchNorm1d(o, eps=1e-6)] + \
                ([torch.nn.ReLU()] if relu else [])
        self.features = torch.nn.Sequential(*block(input_size, width, True), *block(width, width, True))
        self.classifier = torch.nn.Sequential(*block(width, num_classes, False))

    def forward(self, x):
        return self.classifier(self.features(x.reshape(x.shape[0], -1)))


def make_model(stream, settings: Optional[dict] = None):
    """The recipe's model: Avalanche's ``SimpleMLP`` or :class:`GDumbMLP`; on a task-incremental
    stream with a head per task (``as_multitask(model, "classifier")``, as Avalanche's
    ``examples/ewc_mnist.py`` does)."""
    from avalanche.models import SimpleMLP, as_multitask

    s = {**SETTINGS, **(settings or {})}
    if s["model"] == "gdumb_mlp":
        if stream.task_incremental:
            raise ConfigError("GDumb's MLP ends in batch norm, which Avalanche's heads per task (as_multitask) "
                              "cannot split: run gdumb on a stream without task labels")
        model = GDumbMLP(stream.input_size, stream.n_classes, s["hidden_size"])
    elif s["model"] == "simple_mlp":
        model = SimpleMLP(num_classes=stream.n_classes, input_size=s.get("input_size", stream.input_size),
                          hidden_size=s["hidden_size"],
                          hidden_layers=s["hidden_layers"], drop_rate=s["drop_rate"])
    else:
        raise unknown("baseline model", s["model"], ("simple_mlp", "gdumb_mlp"))
    return as_multitask(model, "classifier") if stream.task_incremental else model


class TrainingRecipe(SupervisedPlugin):
    """The parts of a recipe Avalanche's strategies do not take as arguments: gradient-norm clipping
    (``clip``) and the learning-rate schedule over the epochs of each experience (``schedule``:
    ``constant``; ``cosine``, from ``lr`` down to ``min_lr``; ``gdumb``, one warm-up epoch at 0.1 ×
    ``lr``, then cosine annealing with warm restarts, T₀ = 1, T_mult = 2, down to ``min_lr``)."""

    #: not learning state: rebuilt from the settings on a resume
    transient = True

    def __init__(self, lr: float, schedule: str = "constant", min_lr: float = 0.0, clip: Optional[float] = None):
        super().__init__()
        if schedule not in ("constant", "cosine", "gdumb"):
            raise unknown("learning-rate schedule", schedule, ("constant", "cosine", "gdumb"))
        self.lr, self.schedule, self.min_lr, self.clip = float(lr), schedule, float(min_lr), clip

    def lr_at(self, epoch: int, epochs: int) -> float:
        if self.schedule == "cosine":
            return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * epoch / max(1, epochs)))
        if self.schedule == "gdumb":
            if epoch == 0:
                return 0.1 * self.lr
            t, period = epoch - 1, 1        # SGDR: restarts after 1, 2, 4, ... epochs
            while t >= period:
                t, period = t - period, 2 * period
            return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * t / period))
        return self.lr

    def before_training_epoch(self, strategy, **kwargs):
        lr = self.lr_at(int(strategy.clock.train_exp_epochs), int(strategy.train_epochs))
        for group in strategy.optimizer.param_groups:
            group["lr"] = lr

    def before_update(self, strategy, **kwargs):
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(strategy.model.parameters(), float(self.clip))


class MaterializedTrainingData(SupervisedPlugin):
    """Reads the adapted training dataset (GDumb's buffer) once per experience into tensors, its training
    transforms applied, and trains on those: the same samples in the same order, so the same batches, without
    going through Avalanche's dataset stack and the per-sample transforms at every epoch (GDumb's recipe
    rereads its buffer 128 times an experience). Only for transforms that give a sample the same tensor at
    every read (:attr:`growmem.continual.streams.Stream.fixed_train_transforms`)."""

    #: not learning state: rebuilt on a resume
    transient = True

    def after_train_dataset_adaptation(self, strategy, **kwargs):
        from avalanche.benchmarks.utils import _make_taskaware_tensor_classification_dataset

        data = strategy.adapted_dataset
        if len(data) == 0:
            return
        items = [data[i] for i in range(len(data))]
        ys, ts = [int(it[1]) for it in items], [int(it[2]) for it in items]
        strategy.adapted_dataset = _make_taskaware_tensor_classification_dataset(
            torch.stack([it[0] for it in items]), torch.tensor(ys), targets=ys, task_labels=ts)


def make_baseline(name: str, stream, *, seed: int, evaluator, epochs: Optional[int] = None,
                  settings: Optional[dict] = None, plugins=None, device="cpu"):
    """Avalanche's strategy for baseline ``name`` on ``stream`` (model initialised from ``seed``), with
    :func:`recipe`'s settings (``settings["mem_size"]`` sizes ``replay_bytes``'s buffer)."""
    from avalanche.training.supervised import (EWC, GDumb, Cumulative, JointTraining, LwF, Naive, Replay)

    check_baseline(name)
    s = recipe(name, stream.name, settings)
    torch.manual_seed(int(seed))
    er = _ER.match(name)
    if er:
        codes = er_codes(name, stream.input_size)
        s = {**s, "input_size": stream.input_size if codes is None else codes.key_dim}
    model = make_model(stream, s)
    opt = torch.optim.SGD(model.parameters(), lr=s["lr"], momentum=s["momentum"], weight_decay=s["weight_decay"])
    epochs = epochs_of(name, stream.name, epochs, settings)
    extra = [TrainingRecipe(s["lr"], s["schedule"], s.get("min_lr", 0.0), s["clip"])] \
        if s["schedule"] != "constant" or s["clip"] is not None else []
    common = dict(model=model, optimizer=opt, criterion=torch.nn.CrossEntropyLoss(), train_mb_size=s["train_mb_size"],
                  train_epochs=int(epochs), eval_mb_size=s["eval_mb_size"], device=device, evaluator=evaluator,
                  plugins=list(plugins or []) + extra)
    if er:
        plugin = OnlineReplay(_mem_size(name, s), int(s["batch_size_mem"]), er.group(1), stream.n_classes,
                              seed=int(seed), codes=codes)
        return Naive(**{**common, "plugins": common["plugins"] + [plugin]})
    if _REPLAY.match(name) or name == "replay_bytes":
        return Replay(mem_size=_mem_size(name, s), **common)
    if name == "naive":
        return Naive(**common)
    if name == "ewc":
        return EWC(ewc_lambda=s["ewc_lambda"], mode=s["ewc_mode"], **common)
    if name == "lwf":
        alpha = lwf_alphas(stream.n_experiences) if s["lwf_alpha"] is None else float(s["lwf_alpha"])
        return LwF(alpha=alpha, temperature=s["lwf_temperature"], **common)
    if name in ("gdumb", "gdumb_bytes"):
        gdumb = GDumb(mem_size=_mem_size(name, s), **common)
        if getattr(stream, "fixed_train_transforms", False):     # after GDumb's own plugin: it fills the buffer
            gdumb.plugins.append(MaterializedTrainingData())
        return gdumb
    if name == "cumulative":
        return Cumulative(**common)
    return JointTraining(**common)


#: the message of Avalanche's ``deprecated`` decorator (avalanche._annotations)
_AVALANCHE_DEPRECATION = re.compile(r"Call to deprecated (function|class) \w+ \(removal in version ")


@contextlib.contextmanager
def avalanche_deprecations_hidden():
    """Within it, the warnings of Avalanche's ``deprecated`` decorator are not shown: Avalanche's own plugins
    call its deprecated ``storage_policy.update`` (ReplayPlugin, GDumbPlugin) once an experience, and the
    decorator puts a "once" filter before every other on each call, so no warning filter can hide them; the
    warning display drops them instead (every other warning is shown, or recorded, as before)."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, DeprecationWarning) and _AVALANCHE_DEPRECATION.match(str(message)):
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def train_kwargs(name: str, stream, settings: Optional[dict] = None) -> Dict[str, Any]:
    """Keyword arguments for ``strategy.train(experience, **kw)``: the stream's, and the recipe's
    ``drop_last``."""
    return {**stream.train_kwargs, **({"drop_last": True} if recipe(name, stream.name, settings)["drop_last"] else {})}


def epochs_of(name: str, stream_name: str, epochs: Optional[int] = None, settings: Optional[dict] = None) -> int:
    """Epochs per experience: ``epochs`` if given, else the recipe's / tuned value, else :data:`EPOCHS`."""
    if epochs is not None:
        return int(epochs)
    s = recipe(name, stream_name, settings)
    return int(s.get("epochs") or EPOCHS.get(stream_name, 1))


def describe(name: str, stream, epochs: Optional[int] = None, settings: Optional[dict] = None) -> dict:
    s = recipe(name, stream.name, settings)
    model = (f"GDumbMLP({s['hidden_size']}, batch norm)" if s["model"] == "gdumb_mlp"
             else f"SimpleMLP({s['hidden_layers']} x {s['hidden_size']}, drop_rate={s['drop_rate']})")
    out = {"model": model + (", a head per task" if stream.task_incremental else ""), "hidden_size": s["hidden_size"],
           "optimizer": f"SGD(lr={s['lr']}, momentum={s['momentum']}, weight_decay={s['weight_decay']})",
           "schedule": s["schedule"], "clip": s["clip"], "train_mb_size": s["train_mb_size"],
           "epochs": epochs_of(name, stream.name, epochs, settings)}
    if _ER.match(name):
        out.update(batch_size_mem=s["batch_size_mem"], buffer=_ER.match(name).group(1),
                   stores=_ER.match(name).group(2))
    if "mem_size" in s and (name in ("gdumb", "gdumb_bytes", "replay_bytes") or _REPLAY.match(name) or _ER.match(name)):
        out["mem_size"] = int(s["mem_size"])
    if name == "ewc":
        out.update(ewc_lambda=s["ewc_lambda"], ewc_mode=s["ewc_mode"])
    elif name == "lwf":
        out.update(lwf_alpha=lwf_alphas(stream.n_experiences) if s["lwf_alpha"] is None else s["lwf_alpha"],
                   lwf_temperature=s["lwf_temperature"])
    return out
