"""An Avalanche baseline's learning state as named arrays and JSON, saved through growmem's ``Checkpointer``.

A continual run saves a baseline after each experience (and its evaluation) and resumes it from there
(:mod:`growmem.continual.runner`); the checkpoint is the one format of every growmem model — Orbax, host arrays
checked by CRC32, the run's config compared on resume — not a pickle: loading it runs no code.

What is saved (:func:`strategy_state`), each part by name:

* the model's ``state_dict`` (parameters and buffers) and the optimizer's per-parameter state (SGD's momentum),
  by parameter name, with its hyperparameters;
* each plugin that learns: Avalanche's ``Clock`` and ``PeriodicEval`` (their counters), EWC's saved
  parameters and importances, LwF's previous model and classes, the replay and GDumb buffers (each group's
  samples, its reservoir weights, the classes seen), GDumb's initial model, online replay's buffer
  (:class:`growmem.continual.baselines.OnlineReplay`: the stored rows, the slots' counts, the generator's state);
  plugins marked ``transient`` (progress, the training recipe rebuilt from the settings) are not state;
* Cumulative's dataset.

A buffer holds samples of the stream, not copies: every training sample carries its place in the stream
(:func:`tag_samples`: a data attribute Avalanche keeps through its subsets and concatenations), a buffer is
saved as those places, and rebuilt on resume from the same stream, rebuilt from its seed. Any other plugin
is refused by name (it would be lost).
"""
from __future__ import annotations

import copy
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from growmem.errors import CheckpointError
from growmem.reservoir import rng_state, set_rng_state

#: the data attribute holding a training sample's place in the stream
SAMPLE_ATTR = "growmem_sample"
#: the plugins whose whole state is a few numbers (their ``__dict__`` of JSON scalars)
_SCALAR_PLUGINS = ("Clock", "PeriodicEval")


def tag_samples(experiences: Sequence) -> None:
    """Give every sample of the training ``experiences`` its place in the stream (experience after
    experience), kept by Avalanche through the subsets and concatenations its buffers make of them."""
    offset = 0
    for exp in experiences:
        data = exp.dataset
        if not hasattr(exp, "_dataset"):
            raise CheckpointError(f"cannot save a baseline trained on {type(exp).__name__} experiences (they hold "
                                  f"no dataset growmem can tag); run it without a checkpoint folder")
        exp._dataset = data.update_data_attribute(SAMPLE_ATTR, list(range(offset, offset + len(data))))
        offset += len(data)


def _places(dataset) -> np.ndarray:
    if dataset is None or len(dataset) == 0:
        return np.zeros(0, np.int64)
    if not hasattr(dataset, SAMPLE_ATTR):
        raise CheckpointError("a buffer holds samples that are not the stream's (no place in the stream): it "
                              "cannot be saved")
    return np.asarray(list(getattr(dataset, SAMPLE_ATTR)), np.int64)


class _Stream:
    """The tagged training experiences, read back as datasets of given places."""

    def __init__(self, experiences: Sequence):
        self.experiences = list(experiences)
        self._all = None

    def dataset(self, places: np.ndarray):
        if self._all is None:
            from avalanche.benchmarks.utils import concat_datasets

            self._all = concat_datasets([e.dataset for e in self.experiences])
        if len(places) and (places.min() < 0 or places.max() >= len(self._all)):
            raise CheckpointError(f"the checkpoint's buffer holds sample {int(places.max())} of a stream of "
                                  f"{len(self._all)} training samples: the stream differs from the saved run's")
        return self._all.subset(places.tolist())


# ----------------------------------------------------------------------------- tensors and modules

def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def _put_module(arrays: dict, prefix: str, module: torch.nn.Module) -> List[str]:
    names = []
    for name, t in module.state_dict().items():
        arrays[f"{prefix}/{name}"] = _np(t)
        names.append(name)
    return names


def _load_module(arrays: dict, prefix: str, names: List[str], module: torch.nn.Module, what: str) -> None:
    have = list(module.state_dict())
    if sorted(have) != sorted(names):
        raise CheckpointError(f"the checkpoint's {what} has the tensors {sorted(set(names) - set(have))} this "
                              f"strategy's has not, and lacks {sorted(set(have) - set(names))}: it was saved by "
                              f"another baseline or model")
    module.load_state_dict({n: torch.from_numpy(np.array(arrays[f"{prefix}/{n}"])) for n in names}, strict=True)


# ----------------------------------------------------------------------------- plugins

def _buffer_policy(policy, arrays: dict, prefix: str) -> dict:
    """A balanced buffer (Avalanche's ExperienceBalancedBuffer / ClassBalancedBuffer): each group's places and
    reservoir weights, in the groups' order."""
    groups = []
    for i, (key, g) in enumerate(policy.buffer_groups.items()):
        arrays[f"{prefix}/group{i}/places"] = _places(g.buffer)
        arrays[f"{prefix}/group{i}/weights"] = _np(g._buffer_weights)
        groups.append({"key": int(key), "max_size": int(g.max_size)})
    doc = {"groups": groups, "max_size": int(policy.max_size)}
    if hasattr(policy, "_num_exps"):
        doc["num_exps"] = int(policy._num_exps)
    if hasattr(policy, "seen_classes"):
        doc["seen_classes"] = [int(c) for c in policy.seen_classes]
    return doc


def _load_buffer_policy(policy, doc: dict, arrays: dict, prefix: str, stream: _Stream) -> None:
    from avalanche.training.storage_policy import ReservoirSamplingBuffer

    policy.max_size = int(doc["max_size"])
    if "num_exps" in doc:
        policy._num_exps = int(doc["num_exps"])
    if "seen_classes" in doc:
        policy.seen_classes = set()
        for c in doc["seen_classes"]:
            policy.seen_classes.add(int(c))
    policy.buffer_groups = {}
    for i, g in enumerate(doc["groups"]):
        buf = ReservoirSamplingBuffer(int(g["max_size"]))
        buf.buffer = stream.dataset(np.asarray(arrays[f"{prefix}/group{i}/places"], np.int64))
        buf._buffer_weights = torch.from_numpy(np.array(arrays[f"{prefix}/group{i}/weights"]))
        policy.buffer_groups[int(g["key"])] = buf


def _param_data(arrays: dict, prefix: str, table: Dict) -> dict:
    doc = {}
    for exp, params in table.items():
        doc[str(exp)] = []
        for name, pd in params.items():
            arrays[f"{prefix}/{exp}/{name}"] = _np(pd.data)
            doc[str(exp)].append(name)
    return doc


def _load_param_data(doc: dict, arrays: dict, prefix: str) -> dict:
    from avalanche.training.utils import ParamData

    out = {}
    for exp, names in doc.items():
        out[int(exp)] = {}
        for name in names:
            t = torch.from_numpy(np.array(arrays[f"{prefix}/{exp}/{name}"]))
            out[int(exp)][name] = ParamData(name, shape=t.shape, init_tensor=t)
    return out


def _plugin_state(p, arrays: dict, prefix: str) -> dict:
    kind = type(p).__name__
    if kind in _SCALAR_PLUGINS:
        return {k: v for k, v in vars(p).items() if isinstance(v, (bool, int, float, str, type(None)))}
    if kind == "EWCPlugin":
        return {"saved_params": _param_data(arrays, f"{prefix}/saved_params", p.saved_params),
                "importances": _param_data(arrays, f"{prefix}/importances", p.importances)}
    if kind == "LwFPlugin":
        lwf = p.lwf
        prev = None if lwf.prev_model is None else _put_module(arrays, f"{prefix}/prev_model", lwf.prev_model)
        return {"prev_model": prev, "expcount": int(lwf.expcount),
                "prev_classes_by_task": {str(t): sorted(int(c) for c in cs) for t, cs in lwf.prev_classes_by_task.items()}}
    if kind in ("ReplayPlugin", "GDumbPlugin"):
        doc = {"storage_policy": _buffer_policy(p.storage_policy, arrays, f"{prefix}/storage_policy")}
        if kind == "GDumbPlugin":
            doc["init_model"] = None if p.init_model is None else _put_module(arrays, f"{prefix}/init_model",
                                                                              p.init_model)
        return doc
    if kind == "OnlineReplay":
        if p.x is not None:
            arrays[f"{prefix}/x"] = p.x.copy()
        arrays[f"{prefix}/y"], arrays[f"{prefix}/t"] = p.y.copy(), p.t.copy()
        arrays[f"{prefix}/rng"] = rng_state(p.rng)
        for k, a in p.slots.state().items():
            arrays[f"{prefix}/{k}"] = a
        return {"has_rows": p.x is not None}
    raise CheckpointError(f"cannot save the state of the plugin {kind} (growmem saves Clock, PeriodicEval, EWC, LwF, "
                          f"Replay, GDumb and online replay): mark it transient = True if it holds no learning state, "
                          f"or run without a checkpoint folder")


def _load_plugin(p, doc: dict, arrays: dict, prefix: str, strategy, stream: _Stream) -> None:
    kind = type(p).__name__
    if kind in _SCALAR_PLUGINS:
        for k, v in doc.items():
            setattr(p, k, v)
    elif kind == "EWCPlugin":
        p.saved_params = _load_param_data(doc["saved_params"], arrays, f"{prefix}/saved_params")
        p.importances = _load_param_data(doc["importances"], arrays, f"{prefix}/importances")
    elif kind == "LwFPlugin":
        from collections import defaultdict

        lwf = p.lwf
        if doc["prev_model"] is not None:
            lwf.prev_model = copy.deepcopy(strategy.model)
            _load_module(arrays, f"{prefix}/prev_model", doc["prev_model"], lwf.prev_model, "LwF previous model")
        lwf.expcount = int(doc["expcount"])
        lwf.prev_classes_by_task = defaultdict(set, {int(t): set(cs) for t, cs in doc["prev_classes_by_task"].items()})
    elif kind in ("ReplayPlugin", "GDumbPlugin"):
        _load_buffer_policy(p.storage_policy, doc["storage_policy"], arrays, f"{prefix}/storage_policy", stream)
        if kind == "GDumbPlugin" and doc["init_model"] is not None:
            p.init_model = copy.deepcopy(strategy.model)
            _load_module(arrays, f"{prefix}/init_model", doc["init_model"], p.init_model, "GDumb initial model")
    elif kind == "OnlineReplay":
        p.x = np.array(arrays[f"{prefix}/x"]) if doc["has_rows"] else None
        p.y, p.t = np.array(arrays[f"{prefix}/y"]), np.array(arrays[f"{prefix}/t"])
        set_rng_state(p.rng, arrays[f"{prefix}/rng"])
        p.slots.load_state({k: arrays[f"{prefix}/{k}"] for k in p.slots.state()}, p.y[:int(
            np.asarray(arrays[f"{prefix}/slots_counts"]).reshape(-1)[0])])
    else:
        raise CheckpointError(f"the checkpoint holds the state of a plugin {kind} this strategy cannot take")


def _learning_plugins(strategy) -> Dict[int, object]:
    from avalanche.training.plugins import EvaluationPlugin

    # the evaluator (loggers, metric state) and run-time helpers (progress, the recipe) are not learning state
    return {i: p for i, p in enumerate(strategy.plugins)
            if not isinstance(p, EvaluationPlugin) and not getattr(p, "transient", False)}


# ----------------------------------------------------------------------------- the strategy

def strategy_state(strategy, experiences_trained: int) -> Tuple[Dict[str, np.ndarray], dict]:
    """``(arrays, doc)``: the learning state of an Avalanche ``strategy`` after ``experiences_trained``
    experiences, as named numpy arrays and a JSON description (module docstring)."""
    arrays: Dict[str, np.ndarray] = {}
    doc = {"experiences": int(experiences_trained), "model": _put_module(arrays, "model", strategy.model)}
    opt = strategy.optimizer
    if len(opt.param_groups) != 1:
        raise CheckpointError(f"cannot save an optimizer of {len(opt.param_groups)} parameter groups (Avalanche's "
                              f"strategies keep one)")
    by_id = {id(t): n for n, t in strategy.model.named_parameters()}
    params = opt.param_groups[0]["params"]
    missing = [i for i, t in enumerate(params) if id(t) not in by_id]
    if missing:
        raise CheckpointError(f"the optimizer updates {len(missing)} tensors that are not the model's parameters")
    names = [by_id[id(t)] for t in params]
    state = {}
    for n, t in zip(names, params):
        state[n] = []
        for k, v in opt.state.get(t, {}).items():
            arrays[f"optimizer/{n}/{k}"] = _np(v) if torch.is_tensor(v) else np.asarray(v)
            state[n].append(k)
    doc["optimizer"] = {"params": names, "state": state,
                        "group": {k: v for k, v in opt.param_groups[0].items() if k != "params"},
                        "optimized": list(getattr(strategy, "optimized_param_id", None) or [])}
    doc["plugins"] = {str(i): {"type": type(p).__name__, **_plugin_state(p, arrays, f"plugins/{i}")}
                      for i, p in _learning_plugins(strategy).items()}
    if getattr(strategy, "dataset", None) is not None:       # Cumulative: every sample seen so far
        arrays["dataset/places"] = _places(strategy.dataset)
        doc["dataset"] = True
    return arrays, doc


def load_strategy_state(strategy, arrays: Dict[str, np.ndarray], doc: dict, experiences: Sequence) -> None:
    """Install the state :func:`strategy_state` gave into ``strategy``, freshly built as the saved one (same
    baseline, settings and seed) on the same stream, whose tagged training ``experiences`` (:func:`tag_samples`)
    the saved buffers are rebuilt from."""
    from avalanche.models.utils import avalanche_model_adaptation

    stream = _Stream(experiences)
    n = int(doc["experiences"])
    for exp in stream.experiences[:n]:          # a model that grows with the experiences (a head per task) grows
        avalanche_model_adaptation(strategy.model, exp)
    _load_module(arrays, "model", doc["model"], strategy.model, "model")
    named = dict(strategy.model.named_parameters())
    o = doc["optimizer"]
    opt = strategy.optimizer
    opt.param_groups[0]["params"] = [named[n] for n in o["params"]]
    for k, v in o["group"].items():
        opt.param_groups[0][k] = tuple(v) if isinstance(v, list) else v
    opt.state.clear()
    for name, keys in o["state"].items():
        opt.state[named[name]] = {k: torch.from_numpy(np.array(arrays[f"optimizer/{name}/{k}"])) for k in keys}
    if o["optimized"]:
        strategy.optimized_param_id = {n: named[n] for n in o["optimized"]}
    plugins = _learning_plugins(strategy)
    saved = {int(i): d for i, d in doc["plugins"].items()}
    if sorted(saved) != sorted(plugins) or any(type(plugins[i]).__name__ != saved[i]["type"] for i in saved):
        raise CheckpointError(f"the checkpoint's plugins {[saved[i]['type'] for i in sorted(saved)]} are not this "
                              f"strategy's {[type(plugins[i]).__name__ for i in sorted(plugins)]}: it was saved by "
                              f"another baseline")
    for i, p in plugins.items():
        d = {k: v for k, v in saved[i].items() if k != "type"}
        _load_plugin(p, d, arrays, f"plugins/{i}", strategy, stream)
        if type(p).__name__ == "Clock":
            strategy.clock = p
    if doc.get("dataset"):
        strategy.dataset = stream.dataset(np.asarray(arrays["dataset/places"], np.int64))
