"""A native Avalanche strategy around a growmem learner.

:class:`GrowmemStrategy` is a ``SupervisedTemplate`` subclass (Avalanche's ``StreamingLDA`` is
the precedent for a strategy without a backward pass), so an Avalanche user passes their
benchmark, ``EvaluationPlugin``, metrics and loggers unchanged::

    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.evaluation.metrics import accuracy_metrics
    from growmem.continual import GrowmemStrategy

    strategy = GrowmemStrategy(num_classes=10, evaluator=EvaluationPlugin(accuracy_metrics(stream=True)))
    for exp in benchmark.train_stream:
        strategy.train(exp)
        strategy.eval(benchmark.test_stream)

Each training iteration runs the template's callbacks (``before_training_iteration``,
``before_forward``/``after_forward`` — ``mb_output`` holds the logits *before* the update, so
Avalanche's training-accuracy metrics are prequential —, ``before_update``, the growmem step,
``after_update``, ``after_training_iteration``). The mini-batch crosses from PyTorch to JAX as
a numpy view of the CPU tensor, one batch at a time; the dataset never goes to the device
whole.

**Modes.** Online: ``train_epochs=1`` (the default) — one pass, mini-batches; the strategy
needs no task boundaries (it also trains on ``split_online_stream`` sub-experiences).
Multi-epoch: ``train_epochs=E``.

**Data order.** The training order of an experience is a function of ``(seed, experience
index, epoch)`` (:func:`batch_order`): a permutation when ``shuffle`` (Avalanche's default),
the stored order otherwise (``strategy.train(exp, shuffle=False)``). This is what lets a run
resume at the batch it reached, and the fast native loop (:mod:`growmem.continual.fast`) replay
exactly the same batches.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy as np

from .errors import require_avalanche

require_avalanche()

import torch  # noqa: E402
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs  # noqa: E402
from avalanche.training.plugins.evaluation import default_evaluator  # noqa: E402
from avalanche.training.templates import SupervisedTemplate  # noqa: E402
from torch.utils.data import DataLoader, Sampler  # noqa: E402

from .learner import GrowmemConfig, GrowmemLearner  # noqa: E402


def batch_order(n: int, seed: int, unit: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order in which the ``n`` samples of training unit ``unit`` are read in ``epoch``."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([int(seed), int(unit), int(epoch), 0x67726F77]).permutation(n)


class EpochOrderSampler(Sampler):
    """Yields :func:`batch_order` for successive epochs, starting at ``start_epoch`` and skipping
    the first ``skip`` samples of that first epoch (resume)."""

    def __init__(self, n: int, *, seed: int, unit: int, shuffle: bool, start_epoch: int = 0, skip: int = 0):
        self.n, self.seed, self.unit, self.shuffle = n, seed, unit, shuffle
        self.epoch, self.skip = start_epoch, skip

    def __iter__(self):
        order = batch_order(self.n, self.seed, self.unit, self.epoch, self.shuffle)[self.skip:]
        self.epoch += 1
        self.skip = 0
        return iter(order.tolist())

    def __len__(self):
        return self.n - self.skip


class GrowmemModule(torch.nn.Module):
    """The ``model`` Avalanche sees: no torch parameters; ``forward(x, task_labels)`` asks the
    growmem learner for logits (a float32 CPU tensor)."""

    def __init__(self, learner: GrowmemLearner, eval_mb_size: int = 1024):
        super().__init__()
        self.learner = learner
        self.eval_mb_size = eval_mb_size

    def forward(self, x, task_labels=None):
        xs = x.detach().cpu().numpy()
        t = None if task_labels is None else torch.as_tensor(task_labels).cpu().numpy()
        if t is not None and t.ndim == 0:
            t = np.full(len(xs), int(t))
        return torch.from_numpy(self.learner.predict(xs, t, batch_size=self.eval_mb_size))


class GrowmemStrategy(SupervisedTemplate):
    """Avalanche strategy whose model is a growing memory (see the module docstring).

    ``config``: a :class:`GrowmemConfig` or a preset name (default:
    ``continual_growmem``). ``num_classes``: output size. ``input_size``: features per
    sample (inferred from the first batch when None; a stream whose inputs do not fit raises
    ``InputShapeError`` naming both shapes). ``budget_bytes``: cap the memory (see
    :mod:`growmem.continual.learner`). ``n_tasks``: number of task labels the budget is split
    over. ``train_mb_size`` / ``train_epochs`` default to the preset's batch size / 1.
    ``train_outputs``: compute the logits of each training batch before the update (for
    training-time metrics; one extra forward pass per batch).
    """

    def __init__(self, *, config: Union[GrowmemConfig, str, None] = None, num_classes: int,
                 input_size: Optional[int] = None, budget_bytes: Optional[int] = None, n_tasks: int = 1,
                 train_mb_size: Optional[int] = None, train_epochs: Optional[int] = None, eval_mb_size: int = 256,
                 seed: int = 0, train_outputs: bool = True, device: Union[str, torch.device] = "cpu",
                 plugins: Optional[Sequence] = None, evaluator=default_evaluator, eval_every: int = -1,
                 learner: Optional[GrowmemLearner] = None, **kwargs):
        self.learner = learner or GrowmemLearner(config, num_classes=num_classes, input_size=input_size,
                                                 budget_bytes=budget_bytes, n_tasks=n_tasks, seed=seed)
        self.seed = int(seed)
        self.train_outputs = bool(train_outputs)
        #: ``{"unit", "epoch", "batch"}`` to start the next training call from (set by a resume)
        self.resume_position: Optional[dict] = None
        #: called as ``hook(strategy, {"unit", "epoch", "batch"})`` after every training iteration
        self.checkpoint_hook: Optional[Callable] = None
        self._position = None
        #: running state of the training-accuracy metrics at the resumed batch (set by a resume)
        self.resume_epoch_accuracy: Optional[dict] = None
        super().__init__(model=GrowmemModule(self.learner, eval_mb_size), optimizer=None,
                         criterion=torch.nn.CrossEntropyLoss(),
                         train_mb_size=train_mb_size or self.learner.batch_size,
                         train_epochs=train_epochs or 1, eval_mb_size=eval_mb_size, device=device,
                         plugins=plugins, evaluator=evaluator, eval_every=eval_every, **kwargs)

    # ------------------------------------------------------------------ no torch optimizer
    def make_optimizer(self, **kwargs):
        """growmem learns by appending rows: no PyTorch optimizer."""

    def check_model_and_optimizer(self, **kwargs):
        self.model = self.model_adaptation()

    # ------------------------------------------------------------------ data
    def _unit(self) -> int:
        return int(self.experience.current_experience)

    def make_train_dataloader(self, num_workers=0, shuffle=True, pin_memory=None, persistent_workers=False,
                              drop_last=False, **kwargs):
        """A DataLoader over the adapted dataset in :func:`batch_order` (resumable)."""
        ds = self.adapted_dataset
        start_epoch, skip = 0, 0
        pos = self.resume_position
        if pos is not None and int(pos["unit"]) == self._unit():
            start_epoch, skip = int(pos["epoch"]), int(pos["batch"]) * self.train_mb_size
        sampler = EpochOrderSampler(len(ds), seed=self.seed, unit=self._unit(), shuffle=shuffle,
                                    start_epoch=start_epoch, skip=min(skip, len(ds)))
        args = self._obtain_common_dataloader_parameters(batch_size=self.train_mb_size, num_workers=num_workers,
                                                         pin_memory=pin_memory, persistent_workers=persistent_workers,
                                                         drop_last=drop_last)
        collate_from_data_or_kwargs(ds, args)
        self.dataloader = DataLoader(ds, sampler=sampler, **args)

    # ------------------------------------------------------------------ training
    def _train_exp(self, experience, eval_streams=None, **kwargs):
        pos, self.resume_position = self.resume_position, None
        start_epoch, start_batch = 0, 0
        if pos is not None and int(pos["unit"]) == self._unit():
            start_epoch, start_batch = int(pos["epoch"]), int(pos["batch"])
        for epoch in range(start_epoch, self.train_epochs):
            self._position = {"unit": self._unit(), "epoch": epoch, "batch": start_batch if epoch == start_epoch
                              else 0}
            self._before_training_epoch(**kwargs)  # the epoch metrics reset here...
            if epoch == start_epoch and pos is not None and self.resume_epoch_accuracy:
                from .metrics import epoch_accuracies, set_accuracy_state
                for acc in epoch_accuracies(self.evaluator):  # ...and continue from the resumed batch
                    set_accuracy_state(acc, self.resume_epoch_accuracy)
                self.resume_epoch_accuracy = None
            if self._stop_training:
                self._stop_training = False
                break
            self.training_epoch(**kwargs)
            self._after_training_epoch(**kwargs)

    def forward(self):
        t = self.mb_task_id if len(self.mbatch) >= 3 else None
        return self.model(self.mb_x, t)

    def training_epoch(self, **kwargs):
        """One epoch through :func:`growmem.train.fit`, the package's one loop: each batch runs the
        template's callbacks around the learner's step (``fit``'s ``before_step`` / ``on_step``); a
        plugin's ``stop_training()`` ends the epoch after the step it was called in."""
        from types import SimpleNamespace

        from growmem.train import fit

        batches = iter(self.dataloader)

        def batch(step):
            self.mbatch = next(batches)
            self._unpack_minibatch()
            return ()

        def update():   # the mini-batch as the callbacks left it (a plugin may change it before the update)
            t = self.mb_task_id.cpu().numpy() if len(self.mbatch) >= 3 else None
            return self.learner.step(self.mb_x.detach().cpu().numpy(), self.mb_y.cpu().numpy(), t)

        def before_step(step, batch):
            self._before_training_iteration(**kwargs)
            self.loss = self._make_empty_loss()
            self._before_forward(**kwargs)
            if self.train_outputs:  # the logits before the update (prequential training metrics)
                self.mb_output = self.forward()
            else:  # callbacks still get an output of the right shape
                self.mb_output = torch.zeros((len(self.mb_y), self.learner.num_classes))
            self._after_forward(**kwargs)
            self.loss += self.criterion()
            self._before_update(**kwargs)

        def on_step(step, metrics):
            self._after_update(**kwargs)
            self._after_training_iteration(**kwargs)
            if self._position is not None:
                self._position["batch"] += 1
                if self.checkpoint_hook is not None:
                    self.checkpoint_hook(self, dict(self._position))

        if self._stop_training:
            return
        # the learner's step returns its task models' outputs, no "loss": fit watches none (as in FastLoop)
        fit(SimpleNamespace(step=update), batch, steps=len(self.dataloader), before_step=before_step, on_step=on_step,
            stop=lambda: self._stop_training, on_nonfinite="skip")
