"""Presets as TOML files: a model's growing layers and their policy chain.

A preset (``policies/NAME.toml``) looks like::

    description = "one line shown by `growmem policies`"

    [model]                   # ResidualGrowingNet (Eq. 13): L blocks + a growing readout
    n_blocks = 3
    nonlinearity = "none"     # none | relu | gelu
    normalize = true          # RMSNorm before every layer
    capacity = 256            # initial rows per memory (grown geometrically)

    [layer]                   # every growing layer (GrowingSpec fields + rule hyperparameters)
    kernel = "weighted_softmax"
    rule = "weighted_softmax"
    temperature = 5.0
    eta = 1.0
    beta = 30.0
    init = "zeros"            # empty | random | zeros ; init_rows defaults to train.batch_size
    hybrid = true

    [readout]                 # optional: overrides of [layer] for the readout layer only

    [[policy]]                # the chain, in order (see growmem.policies)
    name = "novelty"
    tau = 0.72
    relative = true           # tau in units of ||q|| = sqrt(d)

    [[policy]]
    name = "capacity"
    max_rows = 50016
    on_full = "reject"
                              # any entry may add layer = "block" or "readout": it then
                              # applies to the residual blocks only, or to the readout only

    [hybrid]                  # the optimizer of the stored rows (layers with hybrid = true)
    optimizer = "adam"
    learning_rate = 0.001

    [train]
    batch_size = 16
    epochs = 1

:func:`load` validates everything and raises :class:`ConfigError` naming the file, the key
and the allowed values. :func:`available` lists the presets shipped in ``policies/``.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import optax

from . import keyspaces, kernels, layers, memory, nadaraya, policies, rules, train, units
from .errors import ConfigError


class UnknownPresetError(ConfigError):
    """No preset of that name or path; the message lists the shipped presets."""


def _preset_dir() -> Path:
    """Where the shipped presets live: the package ``growmem.presets`` (the repository's
    ``policies/`` folder, installed into the wheel under that name; see pyproject.toml)."""
    import importlib.resources

    return Path(str(importlib.resources.files("growmem.presets")))


#: where the shipped presets live
PRESET_DIR = _preset_dir()


# ------------------------------------------------------------------------------------- schema

@dataclasses.dataclass(frozen=True)
class Field:
    kind: str                      # "int" | "float" | "bool" | "str"
    allowed: str                   # human description of the allowed values
    check: Callable[[Any], bool] = lambda v: True
    default: Any = None


def _num(lo=None, hi=None, lo_open=False, hi_open=False, kind="float"):
    def check(v):
        if lo is not None and (v <= lo if lo_open else v < lo):
            return False
        if hi is not None and (v >= hi if hi_open else v > hi):
            return False
        return True
    lo_s = "" if lo is None else (f"> {lo}" if lo_open else f">= {lo}")
    hi_s = "" if hi is None else (f"< {hi}" if hi_open else f"<= {hi}")
    if lo is not None and hi is not None:
        desc = f"a number in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    else:
        desc = f"a number {lo_s or hi_s}".strip()
    if kind == "int":
        desc = desc.replace("a number", "an integer")
    return Field(kind, desc, check)


def _rule(rule, kind, allowed):
    """A field checked by the one rule of its quantity (:mod:`growmem.units`), as every entry point checks it."""
    def check(v):
        try:
            rule(v)
            return True
        except ConfigError:
            return False
    return Field(kind, allowed, check)


#: a kernel temperature T (:func:`growmem.units.check_temperature`)
TEMPERATURE = _rule(units.check_temperature, "float", f"a finite number >= {units.MIN_TEMPERATURE}")


def _enum(*values, default=None):
    return Field("str", "one of " + ", ".join(repr(v) for v in values), lambda v: v in values, default)


MODEL = {
    "n_blocks": _num(0, kind="int"),
    "nonlinearity": _enum("none", "relu", "gelu"),
    "normalize": Field("bool", "true or false"),
    "capacity": _num(1, kind="int"),
    "replay_memory": Field("bool", "true or false"),
}
LAYER = {
    "kernel": _enum(*kernels.KERNELS),
    "rule": _enum(*sorted(rules.RULES)),
    "temperature": TEMPERATURE,
    "eta": _num(0),
    "beta": _num(),
    "alpha": _num(),
    "clip": _num(0, lo_open=True),
    "eps": _num(0, lo_open=True),
    "grad_unit": _enum(*layers.GRAD_UNITS),
    "momentum": _num(0, 1, hi_open=True),
    "init": _enum(*layers.INITS),
    "init_rows": _num(1, kind="int"),
    "chunk": _num(1, kind="int"),
    "hybrid": Field("bool", "true or false"),
    "row_dtype": _enum(*memory.ROW_DTYPES),
}
POLICIES = {
    "novelty": {"tau": _num(0), "relative": Field("bool", "true or false"),
                "within_batch": Field("bool", "true or false"),
                "admit_replayed": Field("bool", "true or false"), "chunk": _num(1, kind="int")},
    "capacity": {"max_rows": _num(1, kind="int"), "on_full": _enum(*policies.ON_FULL)},
    "weight_decay": {"gamma": _num(0, 1, hi_open=True), "prune_below": _num(0)},
    "momentum": {"mu": _num(0, 1, hi_open=True)},
    "labels": {},
    "drift_discount": {"factor": _num(0, 1, lo_open=True), "threshold": _num(0, lo_open=True),
                       "gamma": _num(0, 1, hi_open=True),
                       "fast": _num(0, 1, lo_open=True), "slow": _num(0, 1, lo_open=True),
                       "warmup": _num(0, kind="int"), "cooldown": _num(0, kind="int")},
}
REQUIRED_POLICY_KEYS = {"novelty": ("tau",), "capacity": ("max_rows",), "weight_decay": ("gamma",),
                        "momentum": ("mu",), "labels": (), "drift_discount": ()}
HYBRID = {
    "optimizer": _enum("adam", "adamw", "sgd"),
    "learning_rate": _num(0, lo_open=True),
    "b1": _num(0, 1, hi_open=True),
    "b2": _num(0, 1, hi_open=True),
    "eps": _num(0, lo_open=True),
    "weight_decay": _num(0),
}
TRAIN = {
    "batch_size": _num(1, kind="int"),
    "epochs": _num(0, lo_open=True),
    "loss": _enum(*sorted(train.LOSSES)),
    "seed": _num(0, kind="int"),
}
#: [replay]: the network rehearses its own rows (growmem.train.SelfReplay)
REPLAY = {"samples": _num(0, kind="int")}   # 0: no replay
TOP = {"description", "model", "layer", "readout", "policy", "hybrid", "train", "inputs", "replay"}
#: a target-memory preset (growmem.nadaraya): [target] + [keys] + [train]
TARGET = {
    "temperature": TEMPERATURE,
    "learn_temperature": Field("bool", "true or false"),
    "lr": _num(0),
    "clip": _num(0, lo_open=True),
    "row_dtype": _enum(*memory.ROW_DTYPES),
    "evict": _enum(*nadaraya.EVICTIONS),
    "candidates": _num(1, kind="int"),
    "budget": _rule(units.byte_budget, "str", "a size such as '15.7MB'"),
}
KEYS = {
    "kind": _enum(*keyspaces.KEY_SPACES),
    "normalise": Field("bool", "true or false"),
    "n": _num(1, kind="int"),
    "deskew": Field("bool", "true or false"),
    "dim": _num(1, kind="int"),
    "n_fit": _num(1, kind="int"),
    "rho": _num(0, 1, lo_open=True, hi_open=True),
    "param_dtype": _enum("float16", "float32"),
    "buffer_dtype": _enum("float16", "float32"),
    "max_regimes": _num(1, kind="int"),
    "seed": _num(0, kind="int"),
}
#: which [keys] entries each key space takes
KEY_ARGS = {"identity": {"normalise"}, "dct": {"n", "deskew"}, "projection": {"dim", "seed"},
            "subspaces": {"dim", "n_fit", "rho", "param_dtype", "buffer_dtype", "max_regimes"}}
TARGET_TOP = {"description", "target", "keys", "train"}


def _type_ok(kind, v):
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    if isinstance(v, bool):
        return False
    if kind == "int":
        return isinstance(v, int)
    return isinstance(v, (int, float)) and math.isfinite(v)


def _validate(path, section: str, table, schema: Dict[str, Field]) -> dict:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: key '{section}' must be a table ([{section}])")
    out = {}
    for key, value in table.items():
        where = f"{section}.{key}"
        if key not in schema:
            raise ConfigError(f"{path}: unknown key '{where}'; allowed keys in [{section.split('[')[0]}]: "
                              f"{', '.join(sorted(schema))}")
        f = schema[key]
        if not _type_ok(f.kind, value) or not f.check(value):
            raise ConfigError(f"{path}: key '{where}' = {value!r} is not allowed; allowed: {f.allowed}")
        out[key] = float(value) if f.kind == "float" else value
    return out


# ------------------------------------------------------------------------------------- preset

@dataclasses.dataclass(frozen=True)
class Preset:
    """A validated preset: build its model with :meth:`model`, its policies with :meth:`policies`
    and its trainer with :meth:`trainer`.

    ``policy_chain`` is the ``[[policy]]`` chain; layers with ``hybrid = true`` get it followed by
    :func:`growmem.policies.hybrid` with the ``[hybrid]`` optimizer. A new policy is built on every
    call (policies are passed to the trainer like an optax ``tx``).
    """

    path: str
    description: str
    block: layers.GrowingSpec
    readout: layers.GrowingSpec
    n_blocks: int = 0
    nonlinearity: str = "none"
    normalize: bool = True
    capacity: int = 256
    #: [model] replay_memory: a layer of the inputs beside the network, what SelfReplay draws from
    replay_memory: bool = False
    hybrid: Tuple[Tuple[str, Any], ...] = ()
    train: Tuple[Tuple[str, Any], ...] = ()
    policy_entries: Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...] = ()
    hybrid_layers: Tuple[str, ...] = ()
    #: [inputs]: a fixed key space the network reads its inputs through (as [keys] of a target preset)
    inputs: Tuple[Tuple[str, Any], ...] = ()
    #: [replay]: SelfReplay's settings (samples per step)
    replay: Tuple[Tuple[str, Any], ...] = ()

    kind = "network"

    def input_space(self, d_in: int):
        """The key space of ``[inputs]`` for raw inputs of ``d_in`` features (None: the raw inputs)."""
        if not self.inputs:
            return None
        k = dict(self.inputs)
        return keyspaces.make(k.pop("kind"), d_in, **k)

    def features(self, space, x):
        """What the network reads for raw inputs ``x``: ``space.prepare(x)`` scaled to unit RMS
        (``‖z‖ = √d``, as RMSNorm leaves a query), or ``x`` itself without ``[inputs]``."""
        if space is None:
            return x
        import jax.numpy as jnp
        return space.prepare(x) * jnp.sqrt(jnp.float32(space.key_dim))

    def self_replay(self):
        """The trainer's ``replay`` (a :class:`growmem.train.SelfReplay`), or None."""
        n = int(dict(self.replay).get("samples", 0))
        return train.SelfReplay(n, layer="replay" if self.replay_memory else None,
                                seed=int(self.settings["seed"])) if n else None

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def settings(self) -> dict:
        """Training settings (batch_size, epochs, loss, seed) with their defaults."""
        return {"batch_size": 16, "epochs": 1.0, "loss": "cross_entropy", "seed": 0, **dict(self.train)}

    def policy_chain(self, layer: Optional[str] = None) -> Optional[policies.Policy]:
        """The ``[[policy]]`` chain of a ``"block"`` or the ``"readout"`` layer: the entries without a
        ``layer`` key and those naming it (``layer=None``: the entries without one); None when empty."""
        built = [policies.BUILTINS[name](**policy_params(params)) for name, params in self.policy_entries
                 if dict(params).get("layer") in (None, layer)]
        return policies.chain(*built) if built else None

    def hybrid_tx(self) -> Optional[optax.GradientTransformation]:
        """The optimizer of hybrid layers' stored rows (None when no layer is hybrid)."""
        if not self.hybrid_layers:
            return None
        h = {"optimizer": "adam", "learning_rate": 1e-3, **dict(self.hybrid)}
        lr = h["learning_rate"]
        if h["optimizer"] == "sgd":
            return optax.sgd(lr)
        kw = {k: h[k] for k in ("b1", "b2", "eps") if k in h}
        if h["optimizer"] == "adamw":
            return optax.adamw(lr, weight_decay=h.get("weight_decay", 1e-4), **kw)
        return optax.adam(lr, **kw)

    def policies(self):
        """The trainer's ``policy`` argument: one policy for every layer, or a function of the
        layer path when an entry names a ``layer`` or only the blocks or only the readout are hybrid."""
        per_layer = any("layer" in dict(p) for _, p in self.policy_entries)

        def chain_of(kind):
            chain = self.policy_chain(kind if per_layer else None)
            if kind not in self.hybrid_layers:
                return chain
            return policies.chain(*([] if chain is None else [chain]), policies.hybrid(self.hybrid_tx()))

        if not per_layer and not self.replay_memory and set(self.hybrid_layers) in (set(), {"block", "readout"}):
            return chain_of("readout")
        return lambda path: chain_of(path if path in ("readout", "replay") else "block")

    def model(self, d_out: int) -> layers.ResidualGrowingNet:
        act = {"none": None, **{k: layers.ACTIVATIONS[k] for k in ("relu", "gelu")}}[self.nonlinearity]
        return layers.ResidualGrowingNet(d_out=d_out, n_blocks=self.n_blocks, block=self.block,
                                         readout=self.readout, capacity=self.capacity, nonlinearity=act,
                                         normalize=self.normalize, replay_memory=self.replay_memory)

    def trainer(self, sample_input, d_out: int, rng=None, *, loss=None, **kwargs) -> train.Trainer:
        """A :class:`growmem.Trainer` of this preset's model and policies (``loss`` overrides
        the preset's; other keywords go to the Trainer, e.g. ``backend=``)."""
        import jax
        rng = jax.random.key(self.settings["seed"]) if rng is None else rng
        kwargs.setdefault("replay", self.self_replay())
        return train.Trainer(self.model(d_out), loss=loss or self.settings["loss"], sample_input=sample_input,
                             rng=rng, policy=self.policies(), **kwargs)


@dataclasses.dataclass(frozen=True)
class TargetPreset:
    """A validated target-memory preset (:mod:`growmem.nadaraya`): build its memory with
    :meth:`memory`. ``[target]`` holds the :class:`~growmem.nadaraya.TargetMemory` settings (and an
    optional default ``budget``), ``[keys]`` the key space (``kind`` + its arguments)."""

    path: str
    description: str
    target: Tuple[Tuple[str, Any], ...] = ()
    keys: Tuple[Tuple[str, Any], ...] = ()
    train: Tuple[Tuple[str, Any], ...] = ()

    kind = "target"

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def settings(self) -> dict:
        """Training settings (batch_size, epochs, seed) with their defaults."""
        return {"batch_size": 32, "epochs": 1.0, "seed": 0, **dict(self.train)}

    @property
    def budget_bytes(self) -> Optional[int]:
        b = dict(self.target).get("budget")
        return units.byte_budget(b, "target.budget")

    def key_space(self, d_in: int):
        k = dict(self.keys)
        kind = k.pop("kind", "identity")
        return keyspaces.make(kind, d_in, **k)

    def memory(self, d_in: int, d_out: int, *, budget_bytes: Optional[int] = None, seed: Optional[int] = None,
               **overrides) -> nadaraya.TargetMemory:
        """A :class:`~growmem.nadaraya.TargetMemory` for inputs of ``d_in`` features and ``d_out``
        classes (``budget_bytes`` overrides the preset's budget)."""
        t = dict(self.target)
        budget = self.budget_bytes if budget_bytes is None else int(budget_bytes)
        t.pop("budget", None)
        t.update(overrides)
        return nadaraya.TargetMemory(self.key_space(d_in), d_out, budget_bytes=budget,
                                     seed=self.settings["seed"] if seed is None else int(seed), **t)


def _description(path, doc) -> str:
    """A preset's one-line ``description`` (required)."""
    desc = doc.get("description")
    if not isinstance(desc, str) or not desc.strip():
        raise ConfigError(f"{path}: key 'description' is missing; allowed: a one-line string")
    return desc


def _load_target(path, doc) -> TargetPreset:
    unknown = set(doc) - TARGET_TOP
    if unknown:
        raise ConfigError(f"{path}: unknown key '{sorted(unknown)[0]}'; a target-memory preset ([target]) allows "
                          f"the top-level keys {', '.join(sorted(TARGET_TOP))}")
    desc = _description(path, doc)
    target = _validate(path, "target", doc.get("target", {}), TARGET)
    if "temperature" not in target:
        raise ConfigError(f"{path}: key 'target.temperature' is missing; allowed: {TARGET['temperature'].allowed}")
    keys = _key_table(path, "keys", doc.get("keys", {}))
    tr = _validate(path, "train", doc.get("train", {}), {k: TRAIN[k] for k in ("batch_size", "epochs", "seed")})
    if "candidates" in target:
        target["candidates"] = int(target["candidates"])
    return TargetPreset(path=str(path), description=desc.strip().splitlines()[0], target=tuple(sorted(target.items())),
                        keys=tuple(sorted(keys.items())), train=tuple(sorted(tr.items())))


def _key_table(path, section: str, table) -> dict:
    """A validated key-space table (``[keys]`` of a target preset, ``[inputs]`` of a network)."""
    keys = _validate(path, section, table, KEYS)
    kind = keys.setdefault("kind", "identity")
    bad = set(keys) - {"kind"} - KEY_ARGS[kind]
    if bad:
        raise ConfigError(f"{path}: key '{section}.{sorted(bad)[0]}' does not apply to key space {kind!r}; allowed: "
                          f"{', '.join(sorted(KEY_ARGS[kind]))}")
    for k in ("n", "dim", "n_fit", "max_regimes", "seed"):
        if k in keys:
            keys[k] = int(keys[k])
    return keys


#: the kinds of growing layer a ``[[policy]]`` entry's ``layer`` names: the residual blocks, the readout, or the
#: rehearsal layer of ``[model] replay_memory``
LAYER_KINDS = ("block", "readout", "replay")
#: a ``[[policy]]`` entry's ``layer``: the entry applies to those layers only
POLICY_LAYER = _enum(*LAYER_KINDS)


def policy_params(params) -> dict:
    """A ``[[policy]]`` entry's parameters for its policy function (without the entry's ``layer``)."""
    return {k: v for k, v in dict(params).items() if k != "layer"}


def _build_policy(path, entries) -> tuple:
    """The validated ``[[policy]]`` entries ``((name, ((key, value), ...)), ...)``; each is built
    once here so that impossible combinations fail at load time. An entry's optional ``layer``
    (``"block"`` or ``"readout"``) restricts it to those layers; the chain of each is checked."""
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: key 'policy' must be an array of tables ([[policy]])")
    built, entries_out = [], []
    for i, entry in enumerate(entries):
        where = f"policy[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: key '{where}' must be a table ([[policy]])")
        name = entry.get("name")
        if name not in POLICIES:
            raise ConfigError(f"{path}: key '{where}.name' = {name!r} is not allowed; allowed: "
                              f"one of {', '.join(repr(n) for n in POLICIES)}")
        params = _validate(path, where, {k: v for k, v in entry.items() if k != "name"},
                           {**POLICIES[name], "layer": POLICY_LAYER})
        for req in REQUIRED_POLICY_KEYS[name]:
            if req not in params:
                raise ConfigError(f"{path}: key '{where}.{req}' is missing; {name} needs "
                                  f"{POLICIES[name][req].allowed}")
        for k in ("max_rows", "warmup", "cooldown"):
            if k in params:
                params[k] = int(params[k])
        try:
            built.append((params.get("layer"), policies.BUILTINS[name](**policy_params(params))))
        except ValueError as e:
            raise ConfigError(f"{path}: key '{where}': {e}") from None
        entries_out.append((name, tuple(sorted(params.items()))))
    for kind in LAYER_KINDS:
        try:
            policies.chain(*[p for layer, p in built if layer in (None, kind)])
        except ValueError as e:
            raise ConfigError(f"{path}: key 'policy' ({kind} layers): {e}") from None
    return tuple(entries_out)


def _spec(path, section: str, table: dict, batch_size: int) -> layers.GrowingSpec:
    table = dict(table)
    table.pop("hybrid", None)
    if table.get("init", "empty") != "empty":
        table.setdefault("init_rows", batch_size)
    kernel = table.pop("kernel", "weighted_softmax")
    rule = table.pop("rule", None)
    rule = rule or kernels.get(kernel).rules[0]
    extra = set(table) & (set(LAYER) - {"temperature", "grad_unit", "momentum", "init", "init_rows", "chunk",
                                        "row_dtype"})
    bad = extra - rules.RULE_HYPER[rule]
    if bad:
        key = sorted(bad)[0]
        raise ConfigError(f"{path}: key '{section}.{key}' does not apply to rule {rule!r}; allowed: "
                          f"{', '.join(sorted(rules.RULE_HYPER[rule]))}")
    try:
        return layers.GrowingSpec.make(kernel, rule, **table)
    except ValueError as e:
        raise ConfigError(f"{path}: [{section}] {e}") from None


def resolve(name_or_path) -> Path:
    """A preset path: the name of a shipped preset (``hybrid``), or a path to a file.

    Anything that looks like a path (it has a folder part or ends in ``.toml``) must exist: it
    is never replaced by a shipped preset of the same name."""
    text = str(name_or_path)
    p = Path(text)
    looks_like_path = p.suffix == ".toml" or len(p.parts) > 1 or text.startswith(".")
    if looks_like_path:
        if p.is_file():
            return p
        if p.is_dir():
            raise ConfigError(f"{text}: is a folder, not a preset file; pass policies/NAME.toml or a shipped "
                              f"preset name ({', '.join(n for n, _, _ in available())})")
        raise UnknownPresetError(f"{text}: no such preset file; check the path, or use a shipped preset by name: "
                          f"{', '.join(n for n, _, _ in available()) or 'none'}")
    cand = PRESET_DIR / f"{p.name}.toml"
    if cand.is_file():
        return cand
    if p.is_file():
        return p
    raise UnknownPresetError(f"{text}: no shipped preset of that name ({PRESET_DIR}); choose one of: "
                      f"{', '.join(n for n, _, _ in available()) or 'none'}, or pass a path to a .toml file")


def apply_overrides(path, doc: dict, overrides: Optional[Mapping[str, Any]]) -> dict:
    """``doc`` (a parsed preset) with ``overrides`` set: ``{"section.key": value}`` for a table
    (``"readout.temperature"``, ``"keys.n"``, ``"train.batch_size"``), ``{"section": {...}}`` for a whole
    table, or ``"policy.I.key"`` for the I-th ``[[policy]]`` entry. The result is validated like the file itself (an override is never a
    way around the checks); a section or entry that does not exist is an error."""
    if not overrides:
        return doc
    doc = {k: ([dict(e) for e in v] if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
           for k, v in doc.items()}
    for dotted, value in overrides.items():
        parts = str(dotted).split(".")
        if len(parts) == 3 and parts[0] == "policy" and parts[1].isdigit():
            entries = doc.get("policy", [])
            if int(parts[1]) >= len(entries):
                raise ConfigError(f"{path}: override {dotted!r}: the preset has {len(entries)} [[policy]] entries")
            entries[int(parts[1])][parts[2]] = value
        elif len(parts) == 1:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: override {dotted!r}: a whole section takes a table (a dict)")
            doc[parts[0]] = dict(value)
        elif len(parts) == 2:
            doc.setdefault(parts[0], {})
            if not isinstance(doc[parts[0]], dict):
                raise ConfigError(f"{path}: override {dotted!r}: {parts[0]!r} is not a table")
            doc[parts[0]][parts[1]] = value
        else:
            raise ConfigError(f"{path}: override {dotted!r}: expected 'section.key' or 'policy.I.key'")
    return doc


def load(name_or_path, overrides: Optional[Mapping[str, Any]] = None) -> Union[Preset, TargetPreset]:
    """Read and validate a preset TOML file (or a shipped preset by name): a growing network
    (:class:`Preset`), or a target memory (:class:`TargetPreset`, a file with a ``[target]`` table).
    ``overrides``: values that replace the file's before validation (:func:`apply_overrides`)."""
    path = resolve(name_or_path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); see `growmem policies --copy DIR` for examples") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the preset: {e.strerror or e}") from None
    doc = apply_overrides(path, doc, overrides)
    if "target" in doc:
        return _load_target(path, doc)
    unknown = set(doc) - TOP
    if unknown:
        raise ConfigError(f"{path}: unknown key '{sorted(unknown)[0]}'; allowed top-level keys: "
                          f"{', '.join(sorted(TOP))}")
    desc = _description(path, doc)
    model = _validate(path, "model", doc.get("model", {}), MODEL)
    layer = _validate(path, "layer", doc.get("layer", {}), LAYER)
    readout = {**layer, **_validate(path, "readout", doc.get("readout", {}), LAYER)}
    hybrid = _validate(path, "hybrid", doc.get("hybrid", {}), HYBRID)
    tr = _validate(path, "train", doc.get("train", {}), TRAIN)
    entries = _build_policy(path, doc.get("policy", []))
    bs = tr.get("batch_size", 16)
    hybrid_layers = tuple(n for n, t in (("block", layer), ("readout", readout)) if t.get("hybrid"))
    inputs = _key_table(path, "inputs", doc.get("inputs", {})) if "inputs" in doc else {}
    if inputs and inputs.get("kind") == "subspaces":
        raise ConfigError(f"{path}: key 'inputs.kind' = 'subspaces' is not allowed; allowed: 'dct' or 'identity' "
                          f"(fixed key spaces: the network's inputs must not move)")
    replay = _validate(path, "replay", doc.get("replay", {}), REPLAY)
    if "replay" in doc and "samples" not in replay:
        raise ConfigError(f"{path}: key 'replay.samples' is missing; allowed: {REPLAY['samples'].allowed}")
    # the layer SelfReplay draws from: the rehearsal layer, else the first one (its keys are the inputs)
    first = "replay" if model.get("replay_memory") else "block" if model.get("n_blocks", 0) else "readout"
    if any(dict(p).get("layer") == "replay" for _, p in entries) and not model.get("replay_memory"):
        raise ConfigError(f"{path}: a [[policy]] names layer = 'replay' but the model has no rehearsal layer; "
                          f"allowed: set replay_memory = true in [model]")
    if replay.get("samples") and not any(dict(p).get("layer") in (None, first) and (
            n == "labels" or (n == "capacity" and dict(p).get("on_full") in ("evict_balanced", "merge"))) for n, p in entries):
        raise ConfigError(f"{path}: key 'replay' needs the rows' labels; allowed: add a [[policy]] with name = "
                          f"'labels' (or a capacity with on_full = 'evict_balanced' or 'merge')")
    if hybrid and not hybrid_layers:
        raise ConfigError(f"{path}: key 'hybrid' configures an optimizer but no layer sets hybrid = true; "
                          f"allowed: add 'hybrid = true' to [layer] or remove [hybrid]")
    block_spec = _spec(path, "layer", layer, bs)
    readout_spec = _spec(path, "readout", readout, bs)
    if hybrid_layers and "float32" not in {block_spec.row_dtype, readout_spec.row_dtype}:
        raise ConfigError(f"{path}: hybrid rows are trained by an optimizer and must be float32; "
                          f"allowed: row_dtype = 'float32' with hybrid = true")
    return Preset(path=str(path), description=desc.strip().splitlines()[0], block=block_spec,
                  readout=readout_spec, hybrid=tuple(sorted(hybrid.items())), train=tuple(sorted(tr.items())),
                  policy_entries=entries, hybrid_layers=hybrid_layers, inputs=tuple(sorted(inputs.items())),
                  replay=tuple(sorted(replay.items())), **model)


def available(directory=None) -> List[Tuple[str, str, str]]:
    """``[(name, path, description)]`` of the presets in ``directory`` (default: shipped)."""
    d = Path(directory) if directory else PRESET_DIR
    out = []
    for p in sorted(d.glob("*.toml")):
        try:
            with open(p, "rb") as f:
                desc = str(tomllib.load(f).get("description", "")).strip().splitlines()[0]
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, IndexError, OSError):
            desc = "(invalid preset)"
        out.append((p.stem, str(p), desc))
    return out
