"""The fast native loop: a growmem learner on Avalanche experiences without the template.

The ``SupervisedTemplate`` runs a dozen plugin callbacks and reads the dataset one sample at a
time through Avalanche's dataset stack, every epoch and every evaluation. This loop reads each
training experience once into numpy (through a plain DataLoader over the same Avalanche
dataset, so the same transforms apply), each test experience once per run, then steps the
learner on exactly the batches :class:`~growmem.continual.strategy.GrowmemStrategy` would see
(:func:`~growmem.continual.strategy.batch_order`), and evaluates with Avalanche's ``Accuracy``
metric class. It produces the metrics the runner reports — per-experience accuracy (keys as
Avalanche's ``Top1_Acc_Exp``), the sample-weighted stream accuracy (``Top1_Acc_Stream``),
prequential training accuracy (``Top1_Acc_Epoch``, with ``train_outputs``) and the bytes
records — and the tests check they equal the template's.

Limits: the training transforms must be deterministic (the experience is read once; random
augmentation would be frozen) — use the template for augmented streams.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from .errors import require_avalanche

require_avalanche()

import torch  # noqa: E402
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs  # noqa: E402
from avalanche.evaluation.metrics import Accuracy  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from ..train import fit  # noqa: E402
from .learner import GrowmemLearner  # noqa: E402
from .metrics import EXP_ACC, STREAM_ACC, TRAIN_EPOCH_ACC, BytesRecorder, set_accuracy_state  # noqa: E402
from .strategy import batch_order  # noqa: E402


def materialize(dataset, batch_size: int = 1024):
    """``(x, y, t)`` numpy arrays of a whole (Avalanche) dataset, in its order."""
    args = {"batch_size": batch_size, "shuffle": False}
    collate_from_data_or_kwargs(dataset, args)
    xs, ys, ts = [], [], []
    for batch in DataLoader(dataset, **args):
        xs.append(batch[0].numpy())
        ys.append(batch[1].numpy())
        ts.append(batch[2].numpy() if len(batch) >= 3 else np.zeros(len(batch[1]), np.int64))
    if not xs:
        return np.zeros((0,)), np.zeros((0,), np.int64), np.zeros((0,), np.int64)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ts)


class FastLoop:
    """Train / evaluate a :class:`GrowmemLearner` on Avalanche experiences (module docstring)."""

    def __init__(self, learner: GrowmemLearner, *, train_mb_size: Optional[int] = None, train_epochs: int = 1,
                 eval_mb_size: int = 256, seed: int = 0, train_outputs: bool = False, memory_every: int = 1):
        self.learner = learner
        self.train_mb_size = int(train_mb_size or learner.batch_size)
        self.train_epochs = int(train_epochs)
        self.eval_mb_size = int(eval_mb_size)
        self.seed = int(seed)
        self.train_outputs = bool(train_outputs)
        self.memory_every = int(memory_every)
        self.bytes = BytesRecorder()
        self._test_cache: Dict[tuple, tuple] = {}
        #: the running prequential accuracy of the current epoch (Avalanche ``Accuracy``)
        self.epoch_acc = None

    def n_batches(self, experience) -> int:
        return -(-len(experience.dataset) // self.train_mb_size) * self.train_epochs

    def train(self, experience, *, shuffle: bool = True, resume: Optional[dict] = None,
              hook: Optional[Callable[[dict], None]] = None, on_batch: Optional[Callable[[dict], None]] = None,
              bytes_resume: Optional[dict] = None, acc_resume: Optional[dict] = None) -> Dict[str, float]:
        """One training experience. ``resume``: ``{"epoch", "batch"}`` to start from; ``hook``
        and ``on_batch`` get ``{"unit", "epoch", "batch"}`` after every batch. Returns
        ``{"Top1_Acc_Epoch/...": prequential accuracy}`` of the last epoch with ``train_outputs``
        (``acc_resume``: its running state at the resumed batch, see ``epoch_acc``)."""
        unit = int(experience.current_experience)
        x, y, t = materialize(experience.dataset.train())
        n, b = len(y), self.train_mb_size
        nb = -(-n // b)                                       # batches per epoch; step s is batch (s-1) % nb
        start = int(resume["epoch"]) * nb + int(resume["batch"]) if resume else 0
        self.bytes.start(unit, self.learner.memory_bytes(), resume=bytes_resume)
        out, order = {}, {}

        def epoch_end(epoch):
            self.bytes.add(self.learner.memory_bytes())
            if self.train_outputs:
                out[f"{TRAIN_EPOCH_ACC}/Task{int(t[0]) if len(t) else 0:03d}"] = self.epoch_acc.result()

        def new_epoch(epoch, restore):
            order.clear()
            order[epoch] = batch_order(n, self.seed, unit, epoch, shuffle)
            self.epoch_acc = Accuracy()
            if restore:
                set_accuracy_state(self.epoch_acc, acc_resume)

        def batch(step):
            epoch, i = divmod(step - 1, nb)
            if epoch not in order:
                new_epoch(epoch, restore=bool(resume) and step == start + 1 and i > 0)
            idx = order[epoch][i * b:(i + 1) * b]
            return x[idx], y[idx], t[idx]

        def before_step(step, batch):       # prequential: the batch predicted before the learner sees it
            if self.train_outputs:
                logits = self.learner.predict(batch[0], batch[2], batch_size=self.eval_mb_size)
                self.epoch_acc.update(torch.from_numpy(logits), torch.from_numpy(batch[1]))

        def on_step(step, metrics):
            it = step - start
            if (self.memory_every and it % self.memory_every == 0) or (not self.memory_every and it == 1):
                self.bytes.add(self.learner.memory_bytes())
            epoch, i = divmod(step - 1, nb)
            pos = {"unit": unit, "epoch": epoch, "batch": i + 1}
            if hook is not None:
                hook(pos)
            if on_batch is not None:
                on_batch(pos)
            if i == nb - 1:
                epoch_end(epoch)

        if nb == 0:                          # an empty experience: each epoch ends at once
            for epoch in range(self.train_epochs):
                new_epoch(epoch, restore=False)
                epoch_end(epoch)
        elif resume and start % nb == 0 and int(resume["batch"]) > 0:
            # stopped after an epoch's last batch, before its end was recorded: record it now
            new_epoch(start // nb - 1, restore=True)
            epoch_end(start // nb - 1)
        # the learner's step returns its task models' outputs, no "loss" (a target memory's first is NaN by
        # design): fit watches none
        fit(self.learner, batch, steps=self.train_epochs * nb, start=start, before_step=before_step, on_step=on_step,
            on_nonfinite="skip")
        self.last_bytes = self.bytes.finish(self.learner.memory_bytes())
        return out

    def _test_arrays(self, exp):
        key = (getattr(exp.origin_stream, "name", "test"), int(exp.current_experience), len(exp.dataset))
        if key not in self._test_cache:
            self._test_cache[key] = materialize(exp.dataset.eval())
        return self._test_cache[key]

    def eval(self, stream) -> Dict[str, float]:
        """Accuracy on every experience of ``stream`` (keys as Avalanche's ``Top1_Acc_Exp``)
        and the sample-weighted stream accuracy (``Top1_Acc_Stream``)."""
        out = {}
        stream_acc = Accuracy()
        task = 0
        for exp in stream:
            x, y, t = self._test_arrays(exp)
            acc = Accuracy()
            for lo in range(0, len(y), self.eval_mb_size):
                sl = slice(lo, lo + self.eval_mb_size)
                logits = torch.from_numpy(self.learner.predict(x[sl], t[sl], batch_size=self.eval_mb_size))
                yy = torch.from_numpy(y[sl])
                acc.update(logits, yy)
                stream_acc.update(logits, yy)
            task = int(t[0]) if len(t) else 0
            out[f"{EXP_ACC}/Task{task:03d}/Exp{int(exp.current_experience):03d}"] = acc.result()
        out[f"{STREAM_ACC}/Task{task:03d}"] = stream_acc.result()
        return out
