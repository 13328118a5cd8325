"""``run_continual``: growmem and Avalanche's baselines on one stream, same data, same seeds.

For every seed the stream is built once (its class order / permutations / teachers follow the
seed) and every method trains on it, experience after experience, and is evaluated on the
whole test stream after each experience (the accuracy matrix). Methods:

* ``growmem`` — a :class:`~growmem.continual.learner.GrowmemLearner` with the ``growmem``
  config (a preset; ``continual_growmem``, a growing readout keeping every row, by default), driven by the fast
  native loop (``growmem_loop="fast"``) or by :class:`GrowmemStrategy` inside Avalanche's
  template (``"template"``); ``growmem:<preset>`` — the same with another preset (e.g.
  ``growmem:continual_decay``);
* Avalanche's baselines (:mod:`growmem.continual.baselines`): ``naive``, ``ewc``, ``lwf``,
  ``gdumb``, ``replay_<N>``, ``cumulative``, ``joint``.

**Checkpoints and resume** (``checkpoint_dir``): ``run.json`` holds the run's configuration
(a resume with another configuration is refused, naming what differs); each (method, seed)
has a folder with ``result.json`` once it is done. growmem saves its models with the core
``Checkpointer`` every ``checkpoint_every`` batches and after every experience, with the
data position ``(experience, epoch, batch)`` and the results so far, so ``resume=True`` picks
up at the batch the checkpoint reached (the data order is a function of the seed, the
experience and the epoch). Baselines save their state after every experience and restart an
interrupted experience from it (:mod:`growmem.continual.baselines`). A resumed run ends with
the same accuracies, forgetting, BWT and bytes as an uninterrupted one (timings differ).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from growmem.errors import CheckpointError
from growmem.reporting import _jsonable, progress_bar, write_json

from .errors import ConfigError, require_avalanche, unknown

require_avalanche()

import torch  # noqa: E402
from avalanche.core import SupervisedPlugin  # noqa: E402
from avalanche.evaluation.metrics import ElapsedTime  # noqa: E402

from . import baseline_state as BS  # noqa: E402
from . import baselines as B  # noqa: E402
from .budgets import baseline_settings_for, sample_bytes_of  # noqa: E402
from .fast import FastLoop  # noqa: E402
from .learner import GrowmemConfig, GrowmemLearner  # noqa: E402
from .methods import GROWMEM, Method, resolve_all  # noqa: E402
from .metrics import (TRAIN_EPOCH_ACC, accuracy_row, accuracy_state, epoch_accuracies, make_evaluator,  # noqa: E402
                      memory_metric, stream_accuracy, summarize)
from .report import aggregate, plot, table  # noqa: E402
from .streams import STREAMS, Stream, make_stream  # noqa: E402
from .strategy import GrowmemStrategy  # noqa: E402

#: growmem methods run by default on the drifting stream: no forgetting / forgetting when a drift detector
#: fires / constant weight decay / a window (docs/results/continual.md compares them over seeds)
DRIFT_GROWMEM = ("growmem", "growmem:drift_discount", "growmem:continual_decay", "growmem:continual_window")
DEFAULT_BASELINES = ("naive", "replay_1000")
LOOPS = ("fast", "template")
RESULT_FILE = "result.json"
RUN_FILE = "run.json"


# ----------------------------------------------------------------------------- methods

def default_methods(stream_name: str) -> List[str]:
    gm = list(DRIFT_GROWMEM) if stream_name == "drifting_teacher" else [GROWMEM]
    return gm + list(DEFAULT_BASELINES)


def learner_config(method: Method, base: Optional[GrowmemConfig], settings: Optional[dict]) -> GrowmemConfig:
    """The :class:`GrowmemConfig` of a learner method: ``base`` for ``growmem`` itself (when given), else
    the method's preset; ``settings``: ``{"overrides": {"section.key": value}}`` (preset values, or an
    order-free model's hyperparameters) and any :class:`GrowmemConfig` field."""
    cfg = base if (base is not None and method.alias == GROWMEM) else GrowmemConfig(preset=method.preset)
    settings = dict(settings or {})
    over = {**dict(cfg.overrides), **settings.pop("overrides", {})}
    bad = set(settings) - {f.name for f in dataclasses.fields(GrowmemConfig)} - {"preset"}
    if bad:
        raise ConfigError(f"{method.name}: unknown settings {sorted(bad)}; a growmem method takes 'overrides' "
                          f"and {[f.name for f in dataclasses.fields(GrowmemConfig) if f.name != 'preset']}")
    return dataclasses.replace(cfg, overrides=tuple(sorted(over.items())), **settings)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)


# ----------------------------------------------------------------------------- checkpoints

def _prepare_checkpoints(checkpoint_dir, config: dict, resume: bool, out=None):
    """``(root or None, folders)``: the checkpoint folder (its ``run.json`` checked against
    ``config`` on a resume, written on a new run) and :class:`growmem.locks.RunFolders` holding it
    and ``out`` for this run — a folder another command wrote, a resume with nothing to resume,
    or another run writing into either at the same time is refused; ``folders.close()`` releases
    them."""
    from growmem.checkpoint.manager import diff
    from growmem.locks import RunFolders

    if checkpoint_dir is None and resume:
        raise ConfigError("resume=True needs a checkpoint_dir (--checkpoint-dir DIR)")
    root = None if checkpoint_dir is None else Path(checkpoint_dir)
    run_file = None if root is None else root / RUN_FILE
    if run_file is not None and run_file.exists() and not resume:
        raise ConfigError(f"{root} already holds a continual run; pass resume=True (--resume) to continue it, or "
                          f"use another checkpoint directory")
    folders = RunFolders("continual", root, resume=resume, out=out)
    try:
        if run_file is not None and run_file.exists():
            diffs = diff(json.loads(run_file.read_text()).get("config", {}), _jsonable(config))
            if diffs:
                raise ConfigError(f"{root} holds a run with a different configuration; it cannot be resumed with "
                                  f"this one: " + "; ".join(diffs))
        elif run_file is not None:
            write_json(run_file, {"config": config})
            folders.checkpoints.own(RUN_FILE)   # a run that fails before it saved anything leaves no run.json
    except BaseException:
        folders.close(failed=True)
        raise
    return root, folders


# ----------------------------------------------------------------------------- progress

class _Progress(SupervisedPlugin):
    """Per-iteration progress for strategies inside Avalanche's template (bar + callback)."""

    #: not part of the learning state (not saved with a baseline's checkpoint)
    transient = True

    def __init__(self):
        super().__init__()
        self.bar = None
        self.on_batch = None
        self._epoch = 0
        self._batch = 0

    def before_training_epoch(self, strategy, **kwargs):
        if self.bar is not None and self.bar.total is None:
            self.bar.total = len(strategy.dataloader) * strategy.train_epochs
            self.bar.refresh()
        self._batch = 0

    def after_training_iteration(self, strategy, **kwargs):
        self._batch += 1
        if self.bar is not None:
            self.bar.update(1)
        if self.on_batch is not None:
            self.on_batch({"epoch": strategy.clock.train_exp_epochs, "batch": self._batch})


# ----------------------------------------------------------------------------- one run

def _new_results() -> dict:
    """Per experience: the accuracy-matrix row, Avalanche's stream accuracy, the bytes record, the
    wall times, and ``prequential_acc`` — Avalanche's ``Top1_Acc_Epoch`` of a single training
    pass (each batch scored before the update; a replay batch includes its buffer samples), None
    for multi-epoch training."""
    return {"accuracy_matrix": [], "acc_stream_weighted_after": [], "bytes": [], "train_seconds": [],
            "eval_seconds": [], "prequential_acc": []}


def _record(results: dict, metrics: dict, n_exp: int, bytes_rec: dict, train_s: float, eval_s: float,
            prequential: bool):
    results["accuracy_matrix"].append(accuracy_row(metrics, n_exp))
    results["acc_stream_weighted_after"].append(stream_accuracy(metrics))
    results["bytes"].append(bytes_rec)
    results["train_seconds"].append(train_s)
    results["eval_seconds"].append(eval_s)
    pre = [float(v) for k, v in metrics.items() if k.startswith(TRAIN_EPOCH_ACC)] if prequential else []
    results["prequential_acc"].append(pre[-1] if pre else None)


def _finish(results: dict, *, stream: Stream, method: Method, seed: int, config: dict, budget,
            square: bool = True, resumed: bool = False) -> dict:
    s = summarize(results["accuracy_matrix"], results["acc_stream_weighted_after"][-1], square=square)
    b = results["bytes"]
    s.update(bytes_in_use_peak=max(r["peak_in_use"] for r in b), bytes_in_use_final=b[-1]["final_in_use"],
             bytes_allocated_peak=max(r["peak_allocated"] for r in b), bytes_allocated_final=b[-1]["final_allocated"],
             train_seconds=float(sum(results["train_seconds"])), eval_seconds=float(sum(results["eval_seconds"])))
    s["wall_seconds"] = s["train_seconds"] + s["eval_seconds"]
    pre = [p for p in results["prequential_acc"] if p is not None]
    s["prequential_acc_mean"] = float(np.mean(pre)) if pre else None
    s["within_budget"] = None if budget is None else bool(s["bytes_in_use_peak"] <= budget)
    return {"stream": stream.name, "method": method.name, "description": method.description, "alias": method.alias,
            "family": method.family, "seed": seed, "kind": method.kind, "config": config,
            "n_experiences": stream.n_experiences, **results, "summary": s, "resumed": resumed}


def _timer():
    t = ElapsedTime()
    t.update()
    return t


def _elapsed(t) -> float:
    t.update()
    return float(t.result())


def _experience_loop(results: dict, units, n_exp: int, *, train, evaluate, after, prequential: bool):
    """The one loop over a stream's experiences, growmem's and Avalanche's: ``train(e, unit) -> (metrics, or None
    if not measured; bytes)``, ``evaluate()`` on the test stream, the row recorded, then ``after(e)``."""
    for e, unit in units:
        t = _timer()
        train_metrics, bytes_rec = train(e, unit)
        train_s = _elapsed(t)
        t = _timer()
        metrics = {} if train_metrics is None else {**train_metrics, **evaluate()}
        _record(results, metrics, n_exp, bytes_rec, train_s, _elapsed(t), prequential=prequential)
        after(e)


def _run_learner(stream: Stream, method: Method, cfg: GrowmemConfig, seed: int, *, budget, epochs, run_dir, resume,
                 loop: str, checkpoint_every: int, eval_mb_size: int, progress: bool, loggers, on_batch,
                 on_experience, prequential: bool) -> dict:
    from growmem.checkpoint import Checkpointer

    learner = GrowmemLearner(cfg, num_classes=stream.n_classes, input_size=stream.input_size, budget_bytes=budget,
                             n_tasks=len(stream.task_labels), seed=seed)
    learner.input_shape = tuple(stream.input_shape)
    n_epochs = int(epochs) if epochs is not None else learner.epochs
    config = {"growmem": cfg.describe(), "epochs": n_epochs, "batch_size": learner.batch_size, "loop": loop,
              "budget_bytes": budget}
    results, pos, partial, acc_partial, counter = _new_results(), None, None, None, 0
    ck = Checkpointer(run_dir / "ckpt", keep=2) if run_dir is not None else None
    resumed = False
    if ck is not None and resume and ck.latest_step() is not None:
        r = learner.restore(ck, config=config)
        counter, pos = r.step, r.data_position
        results, partial, acc_partial = r.extra["results"], r.extra.get("bytes_current"), r.extra.get("epoch_acc")
        resumed = True
    shuffle = bool(stream.train_kwargs.get("shuffle", True))
    if loop == "fast":
        driver = FastLoop(learner, train_mb_size=learner.batch_size, train_epochs=n_epochs, eval_mb_size=eval_mb_size,
                          seed=seed, train_outputs=prequential)
        driver.bytes.records = list(results["bytes"])
        strategy = None
    else:
        strategy = GrowmemStrategy(learner=learner, num_classes=stream.n_classes, train_mb_size=learner.batch_size,
                                   train_epochs=n_epochs, eval_mb_size=eval_mb_size, seed=seed,
                                   train_outputs=prequential, evaluator=make_evaluator(loggers))
        memory_metric(strategy.evaluator).recorder.records = list(results["bytes"])
    start = 0 if pos is None else (pos["exp"] + 1 if pos["done"] else pos["exp"])
    n_exp = stream.n_experiences

    def save(position, current, epoch_acc=None):
        nonlocal counter
        counter += 1
        learner.save(ck, counter, data_position=position, config=config,
                     extra={"results": results, "bytes_current": current, "epoch_acc": epoch_acc})

    def train(e, exp):
        nonlocal partial, acc_partial
        here = pos if (pos is not None and not pos["done"] and pos["exp"] == e) else None
        nb = -(-len(exp.dataset) // learner.batch_size)
        done = 0 if here is None else here["epoch"] * nb + here["batch"]
        bar = progress_bar(nb * n_epochs, f"{method.name} seed {seed} exp {e + 1}/{n_exp}", initial=done, unit="batch",
                           leave=False, enabled=progress)
        since = [0]

        def after_batch(p, current_bytes, current_acc):
            if bar is not None:
                bar.update(1)
            since[0] += 1
            if ck is not None and checkpoint_every and since[0] >= checkpoint_every:
                since[0] = 0
                acc = current_acc()
                save({"exp": e, "epoch": p["epoch"], "batch": p["batch"], "done": False}, current_bytes(),
                     None if acc is None else accuracy_state(acc))
            if on_batch is not None:
                on_batch({"method": method.name, "seed": seed, "experience": e, "epoch": p["epoch"],
                          "batch": p["batch"]})

        if loop == "fast":
            train_metrics = driver.train(exp, shuffle=shuffle, resume=here, bytes_resume=partial if here else None,
                                         acc_resume=acc_partial if here else None,
                                         hook=lambda p: after_batch(p, lambda: driver.bytes.current,
                                                                    lambda: driver.epoch_acc))
            bytes_rec = driver.last_bytes
        else:
            mm = memory_metric(strategy.evaluator)
            strategy.resume_position = None if here is None else {"unit": e, "epoch": here["epoch"],
                                                                  "batch": here["batch"]}
            mm.pending_resume = partial if here else None
            strategy.resume_epoch_accuracy = acc_partial if here else None
            accs = epoch_accuracies(strategy.evaluator)
            strategy.checkpoint_hook = lambda s, p: after_batch(p, lambda: mm.recorder.current,
                                                                lambda: accs[0] if accs else None)
            train_metrics = strategy.train(exp, **stream.train_kwargs)
            bytes_rec = mm.records[-1]
        if bar is not None:
            bar.close()
        partial = acc_partial = None
        return train_metrics, bytes_rec

    def after(e):
        if ck is not None:
            save({"exp": e, "epoch": n_epochs, "batch": 0, "done": True}, None)
        if on_experience is not None:
            on_experience({"method": method.name, "seed": seed, "experience": e, "stream": stream, "learner": learner})

    evaluate = lambda: (driver if loop == "fast" else strategy).eval(stream.test_stream)  # noqa: E731
    _experience_loop(results, [(e, stream.train_stream[e]) for e in range(start, n_exp)], n_exp, train=train,
                     evaluate=evaluate, after=after, prequential=prequential and n_epochs == 1)
    if ck is not None:
        ck.close()
    config.update(learner=learner.describe())
    return _finish(results, stream=stream, method=method, seed=seed, config=config, budget=budget, resumed=resumed)


def _run_baseline(stream: Stream, method: Method, seed: int, *, budget, epochs, run_dir, resume, settings,
                  progress: bool, loggers, on_batch, on_experience, sample_bytes: Optional[int],
                  final_only: bool = False) -> dict:
    from growmem.checkpoint import Checkpointer

    prog = _Progress()
    settings = baseline_settings_for(method, stream, dict(settings or {}), budget, sample_bytes)
    strategy = B.make_baseline(method.name, stream, seed=seed,
                               evaluator=make_evaluator(loggers, sample_bytes=sample_bytes), epochs=epochs,
                               settings=settings, plugins=[prog])
    mm = memory_metric(strategy.evaluator)
    config = dict(B.describe(method.name, stream, epochs, settings), sample_bytes=sample_bytes,
                  torch_threads=torch.get_num_threads())
    results, start, resumed = _new_results(), 0, False
    joint = method.name == "joint"
    n_exp = stream.n_experiences
    exps = [stream.train_stream[e] for e in range(n_exp)]
    ck = None
    if run_dir is not None and not joint:      # joint trains once on everything: killed, it starts over
        if (run_dir / "state.pkl").exists():
            raise CheckpointError(f"{run_dir} holds a baseline saved by an earlier growmem as a pickle, which is no "
                                  f"longer read: start the run again in another --checkpoint-dir")
        BS.tag_samples(exps)                   # a buffer is saved as the places of its samples in the stream
        ck = Checkpointer(run_dir / "ckpt", keep=2)
    checked = {k: v for k, v in config.items() if k != "torch_threads"}   # what a resume must match
    if resume and ck is not None and ck.latest_step() is not None:
        r = ck.restore_leaves(config=checked)
        BS.load_strategy_state(strategy, r.state, r.extra["baseline"], exps)
        results, start, resumed = r.extra["results"], r.extra["exp"] + 1, True
        mm.recorder.records = list(results["bytes"])
    final_only = final_only and method.name in B.RETRAINS_FROM_SCRATCH and not joint   # its last model alone counts
    config["evaluated"] = "final" if final_only else "every experience"
    units = [(None, stream.train_stream)] if joint else [(e, exps[e]) for e in range(start, n_exp)]

    def train(e, unit):
        label = "all" if joint else f"{e + 1}/{n_exp}"
        prog.bar = progress_bar(None, f"{method.name} seed {seed} exp {label}", unit="batch", leave=False,
                                enabled=progress)
        if on_batch is not None:
            prog.on_batch = lambda p, e=e: on_batch({"method": method.name, "seed": seed, "experience": e, **p})
        torch.manual_seed(B.experience_seed(seed, 0 if joint else e))
        skip = final_only and e < n_exp - 1     # the buffer is filled; the model is reset at the next experience
        kept, strategy.train_epochs = strategy.train_epochs, 0 if skip else strategy.train_epochs
        try:
            with B.avalanche_deprecations_hidden():
                train_metrics = strategy.train(unit, **B.train_kwargs(method.name, stream, settings))
        finally:
            strategy.train_epochs = kept
        if prog.bar is not None:
            prog.bar.close()
        return (None if skip else train_metrics), mm.records[-1]

    def after(e):
        if ck is not None:
            arrays, doc = BS.strategy_state(strategy, e + 1)
            ck.save(arrays, e + 1, config=checked, extra={"exp": e, "results": results, "baseline": doc})
        if on_experience is not None:
            on_experience({"method": method.name, "seed": seed, "experience": e, "stream": stream,
                           "strategy": strategy})

    try:
        _experience_loop(results, units, n_exp, train=train, evaluate=lambda: strategy.eval(stream.test_stream),
                         after=after, prequential=config["epochs"] == 1)   # one pass: Avalanche's accuracy is prequential
    finally:
        if ck is not None:
            ck.close()
    return _finish(results, stream=stream, method=method, seed=seed, config=config, budget=budget,
                   square=not (joint or final_only), resumed=resumed)


# ----------------------------------------------------------------------------- the runner

def run_continual(stream: Union[str, Any] = "drifting_teacher", methods: Optional[Sequence[str]] = None,
                  seeds: Sequence[int] = (0,), budget_bytes: Union[int, str, None] = None, online: bool = False,
                  checkpoint_dir=None, resume: bool = False, *, growmem: Union[GrowmemConfig, str, None] = None,
                  stream_options: Optional[dict] = None, data_dir=None, download: bool = False,
                  epochs: Union[int, Dict[str, int], None] = None, growmem_loop: str = "fast",
                  checkpoint_every: int = 500, out=None, progress: bool = True, loggers=None,
                  on_batch: Optional[Callable[[dict], None]] = None,
                  on_experience: Optional[Callable[[dict], None]] = None, baseline_settings: Optional[dict] = None,
                  method_settings: Optional[Dict[str, dict]] = None, split: str = "test",
                  replay_dtype: str = "uint8", eval_mb_size: int = 256, threads: int = 1,
                  prequential: Optional[bool] = None, verbose: bool = True, name: str = "continual",
                  final_only: bool = False) -> dict:
    """Run growmem methods and Avalanche baselines on one stream; returns (and with ``out`` writes
    ``<out>/<name>.json`` + PNGs) ``{"config", "stream", "runs", "summary"}``.

    ``stream``: a name (``drifting_teacher``, ``split_mnist``, ...; see ``STREAMS``) or any
    Avalanche benchmark object. ``methods``: names of :mod:`growmem.continual.methods` (``target:dct``,
    ``net:<preset>``, ``knn:dct``, ``growmem``, ``growmem:<preset>``, Avalanche's strategies; default:
    growmem (+ its decay and window variants on the drifting stream), naive, replay_1000), reported under
    the name that says what each is. ``seeds``: one run per seed and method. ``budget_bytes``: caps
    growmem's memory (int or a size such as ``"15.7MB"``: 1 MB = 10^6 B, 1 MiB = 2^20 B, as ``growmem
    train --ram-budget``) and sizes ``replay_bytes``; every method's peak bytes are checked against it
    (``within_budget``). ``online``: one pass over each experience for every method.
    ``checkpoint_dir`` / ``resume``: see the module docstring. ``growmem``: the config or preset of the
    method named ``growmem`` (default: the stream's, ``methods.STREAM_DEFAULTS``).
    ``stream_options``: ``make_stream`` options (``n_experiences``, ``train_limit``, ...). ``split``:
    ``"test"``, or ``"validation"`` to evaluate on held-out training data (for tuning; the test split is
    then never read). ``replay_dtype``: how stored samples are counted (``memory_bytes.stored_sample_bytes``).
    ``epochs``: epochs per experience, for every method (int) or per method (dict); default:
    the preset's (growmem methods) or the recipe's (baselines). ``baseline_settings``: settings for
    every Avalanche baseline; ``method_settings``: ``{method name: settings}`` for one method (a
    baseline's recipe values, or a growmem method's ``{"overrides": {...}}``). ``growmem_loop``:
    ``fast`` (native loop) or ``template`` (:class:`GrowmemStrategy` in Avalanche's template).
    ``on_batch(info)`` is called after every training batch; ``on_experience(info)`` after each experience
    (and its evaluation), ``info`` naming the method, seed, experience (``None``: ``joint``'s whole stream) and
    stream with the ``learner`` (a growmem method's :class:`GrowmemLearner`) or the Avalanche ``strategy``
    (a baseline) as it stands then — to measure what a model holds between experiences. ``threads``: PyTorch's threads during the call
    (``torch.set_num_threads``, restored after; default 1: the baselines' MLPs are too small for a second
    thread to pay, and its synchronisation dominates their steps on a busy machine; 0: PyTorch's own default).
    ``prequential``: record each batch's accuracy before training on it (default: on the
    drifting stream). ``final_only``: a baseline that retrains its model from scratch at every experience
    (GDumb: ``baselines.RETRAINS_FROM_SCRATCH``) trains and is evaluated after the last experience only —
    its final accuracy is bitwise the full run's (the earlier models are discarded), the accuracy matrix
    has its last row only (no forgetting), and it costs one training instead of one per experience.
    """
    if growmem_loop not in LOOPS:
        raise unknown("growmem loop", growmem_loop, LOOPS)
    from growmem.units import byte_budget
    budget_bytes = byte_budget(budget_bytes)
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds must be a non-empty list of distinct integers, got {seeds}")
    if isinstance(stream, str) and stream not in STREAMS:
        raise unknown("stream", stream, STREAMS)
    stream_name = stream if isinstance(stream, str) else "user"
    base = growmem if isinstance(growmem, GrowmemConfig) else GrowmemConfig(preset=growmem) if growmem else None
    resolved = resolve_all(methods if methods is not None else default_methods(stream_name), stream_name,
                           None if base is None else base.preset)
    method_settings = dict(method_settings or {})
    unknown_settings = set(method_settings) - {m.name for m in resolved}
    if unknown_settings:
        raise ConfigError(f"method_settings for methods not in the run: {sorted(unknown_settings)}; methods: "
                          f"{[m.name for m in resolved]}")
    configs = {m.name: learner_config(m, base, method_settings.get(m.name)) for m in resolved if m.kind == "learner"}
    for cfg in configs.values():
        cfg.load()   # an unknown preset or a bad override fails here, before anything runs
    methods = [m.name for m in resolved]
    if isinstance(epochs, dict):
        bad = set(epochs) - set(methods)
        if bad:
            raise ConfigError(f"epochs given for methods not in the run: {sorted(bad)}; methods: {methods}")
    if prequential is None:
        prequential = stream_name == "drifting_teacher"
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ConfigError(f"threads must be an integer >= 0 (0: PyTorch's own default), got {threads!r}")
    stream_options = dict(stream_options or {})
    config = {"stream": stream_name, "stream_options": stream_options, "methods": methods, "seeds": seeds,
              "budget_bytes": None if budget_bytes is None else int(budget_bytes), "online": bool(online),
              "epochs": epochs, "split": split, "replay_dtype": replay_dtype,
              "growmem": {m: c.describe() for m, c in configs.items()}, "growmem_loop": growmem_loop,
              "baseline_settings": {**B.SETTINGS, **(baseline_settings or {})}, "method_settings": method_settings,
              "eval_mb_size": eval_mb_size, "prequential": bool(prequential), "final_only": bool(final_only),
              "data": "download" if download else "local"}
    root, folders = _prepare_checkpoints(checkpoint_dir, config, resume, out)
    failed, torch_threads = True, torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    # recorded, not part of the resume check: a run may resume on another thread count
    config["torch_threads"] = torch.get_num_threads()
    try:

        def method_epochs(m):
            if online:
                return 1
            if isinstance(epochs, dict):
                return epochs.get(m)
            return epochs

        t0 = time.perf_counter()
        runs, stream_info = [], None
        for seed in seeds:
            st = make_stream(stream, seed=seed, data_dir=data_dir, download=download, split=split, **stream_options) \
                if isinstance(stream, str) else make_stream(stream)
            sample_bytes = sample_bytes_of(st, replay_dtype)
            if stream_info is None:
                stream_info = {"name": st.name, "n_experiences": st.n_experiences, "n_classes": st.n_classes,
                               "input_shape": list(st.input_shape), "task_labels": list(st.task_labels),
                               "scenario": st.scenario, "info": st.info, "split": split,
                               "train_sizes": [len(e.dataset) for e in st.train_stream],
                               "test_sizes": [len(e.dataset) for e in st.test_stream],
                               "sample_bytes": sample_bytes, "replay_dtype": replay_dtype}
            for m in resolved:
                run_dir = None if root is None else root / _safe(m.name) / f"seed{seed}"
                if run_dir is not None and resume and (run_dir / RESULT_FILE).exists():
                    runs.append(json.loads((run_dir / RESULT_FILE).read_text()))
                    if verbose:
                        print(f"{m.name} seed {seed}: already done in {run_dir}", file=sys.stderr)
                    continue
                if run_dir is not None:
                    run_dir.mkdir(parents=True, exist_ok=True)
                common = dict(budget=config["budget_bytes"], epochs=method_epochs(m.name), run_dir=run_dir,
                              resume=resume, progress=progress, loggers=loggers, on_batch=on_batch,
                              on_experience=on_experience)
                if m.kind == "learner":
                    res = _run_learner(st, m, configs[m.name], seed, loop=growmem_loop,
                                       checkpoint_every=checkpoint_every, eval_mb_size=eval_mb_size,
                                       prequential=prequential, **common)
                else:
                    res = _run_baseline(st, m, seed, settings={**(baseline_settings or {}),
                                                               **method_settings.get(m.name, {})},
                                        sample_bytes=sample_bytes, final_only=final_only, **common)
                res = _jsonable(res)
                if run_dir is not None:
                    write_json(run_dir / RESULT_FILE, res)
                runs.append(res)
                if verbose:
                    s = res["summary"]
                    print(f"{m.name} seed {seed}: acc_mean_over_experiences {s['acc_mean_over_experiences']:.4f}, "
                          f"acc_stream_weighted {s['acc_stream_weighted']:.4f}, peak bytes in use "
                          f"{s['bytes_in_use_peak']}, {s['wall_seconds']:.0f} s", file=sys.stderr)
        summary = aggregate(runs)
        doc = {"name": name, "config": config, "stream": stream_info, "budget_bytes": config["budget_bytes"],
               "methods": {m.name: {"description": m.description, "alias": m.alias, "kind": m.kind, "family": m.family}
                           for m in resolved},
               "runs": runs, "summary": summary, "seconds": time.perf_counter() - t0}
        if out is not None:
            out = Path(out)
            doc["files"] = [str(out / f"{name}.json")] + [str(p) for p in plot(doc, out, name)]
            write_json(out / f"{name}.json", doc)
        failed = False
    finally:
        # released on every path: a failed call leaves its folders free for the next one at once
        folders.close(failed=failed)
        torch.set_num_threads(torch_threads)
    if verbose:
        print(table(summary, drift=stream_name == "drifting_teacher"))
        if out is not None:
            print("wrote " + ", ".join(doc["files"]))
    return doc
