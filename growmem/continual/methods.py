"""The methods of a continual run, named by what they are.

=================== ==========================================================================
``target:<keys>``   a target memory (:class:`growmem.nadaraya.TargetMemory`: Nadaraya–Watson, the
                    values are the labels) — the preset ``target_<keys>`` (``target:dct``,
                    ``target:subspaces``) or any target preset by name or path
``net:<preset>``    a growing network (error-driven rows, :class:`growmem.Trainer`) from a network
                    preset (``net:continual_growmem``, ...)
``knn:<keys>``      k nearest neighbours (:class:`growmem.order_free.KNN`) on ``dct`` keys (the
                    ``target_dct`` preset's key space), ``proj`` keys (``target_proj_merge``'s random
                    projections) or ``raw`` pixels
``ncm:<keys>``      nearest class mean (:class:`growmem.order_free.NCM`)
``slda:<keys>``     streaming linear discriminant analysis (:class:`growmem.order_free.SLDA`)
Avalanche's         ``naive``, ``ewc``, ``lwf``, ``gdumb``, ``gdumb_bytes``, ``replay_<N>``, ``replay_bytes``,
strategies          ``cumulative``, ``joint``, online replay ``er_<reservoir|balanced>:<raw|dct|proj>``
                    (:mod:`growmem.continual.baselines`)
=================== ==========================================================================

``growmem`` is the stream's default growmem method (:data:`STREAM_DEFAULTS`) and
``growmem:<preset>`` any preset; both resolve to the ``target:`` or ``net:`` name that says what
they are, under which they are reported. Resolving a name needs neither torch nor Avalanche.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import List, Optional, Sequence

from .errors import ConfigError, UnknownNameError, unknown

GROWMEM = "growmem"
#: the growmem method each stream runs by default: target memories on the image streams — fixed DCT keys
#: where classes arrive over time, novelty-opened subspaces where the inputs change — and the
#: growing network elsewhere
STREAM_DEFAULTS = {"split_mnist": "target:dct", "permuted_mnist": "target:subspaces",
                   "rotated_mnist": "target:subspaces"}
DEFAULT_NET = "net:continual_growmem"
#: the Avalanche strategies (see growmem.continual.baselines; replay_<N> for any N)
AVALANCHE = ("naive", "ewc", "lwf", "gdumb", "gdumb_bytes", "replay_1000", "replay_4400", "replay_bytes", "cumulative",
             "joint")
#: the budget-matched strategies (their buffer is what the budget holds beside the model) and the family of each
BUDGET_MATCHED = {"replay_bytes": "replay", "gdumb_bytes": "gdumb"}
#: online experience replay (growmem.continual.baselines.OnlineReplay): er_<buffer policy>:<what it stores>
#: what a baseline stores, by name: the target preset whose fixed key space it shares with growmem
#: (``dct``: target_dct's DCT codes; ``proj``: target_proj_merge's random projections), or None for raw pixels
KEY_SETS = {"dct": "target_dct", "proj": "target_proj_merge", "raw": None}
ONLINE_REPLAY = tuple(f"er_{p}:{k}" for p in ("reservoir", "balanced") for k in KEY_SETS)
ORDER_FREE = ("knn", "ncm", "slda")
_REPLAY = re.compile(r"^replay_(\d+)$")
_ORDER_FREE_NAMES = {"knn": "k nearest neighbours", "ncm": "nearest class mean",
                     "slda": "streaming linear discriminant analysis"}
_KEY_NAMES = {"dct": "the target_dct preset's DCT keys", "proj": "the target_proj_merge preset's random projections",
              "raw": "raw pixels"}
_AVALANCHE_NAMES = {
    "naive": "Avalanche Naive: fine-tuning an MLP, the lower bound",
    "ewc": "Avalanche EWC: an MLP with elastic weight consolidation",
    "lwf": "Avalanche LwF: an MLP with learning without forgetting (distillation)",
    "gdumb": "Avalanche GDumb: a class-balanced buffer, an MLP retrained from scratch on it (its authors' recipe)",
    "replay_bytes": "Avalanche Replay with as many stored samples as the memory budget holds",
    "gdumb_bytes": "Avalanche GDumb (its authors' recipe) with as many stored samples as the memory budget holds",
    "cumulative": "Avalanche Cumulative: an MLP retrained on every sample seen so far",
    "joint": "Avalanche JointTraining: an MLP trained on the whole stream at once (offline upper bound)",
}


@dataclasses.dataclass(frozen=True)
class Method:
    """A resolved method: ``name`` (how it is reported), ``kind`` (``"learner"``: a growmem model driven
    by :class:`growmem.continual.learner.GrowmemLearner`; ``"avalanche"``: one of Avalanche's
    strategies), ``family`` (``target``, ``net``, ``knn``, ``ncm``, ``slda``, or the strategy's name;
    ``replay`` for every buffer size), ``preset`` (what :class:`GrowmemConfig` loads: a preset name or
    path, or ``knn:dct`` for an order-free model), ``description`` (one line), ``alias`` (the name it
    was asked for, when that differs)."""

    name: str
    kind: str
    family: str
    preset: Optional[str] = None
    description: str = ""
    alias: Optional[str] = None


def valid_methods() -> List[str]:
    return ["growmem", "growmem:<preset>", "target:<keys>", "net:<preset>",
            *[f"{m}:{k}" for m in ORDER_FREE for k in KEY_SETS], *AVALANCHE, "replay_<N>", *ONLINE_REPLAY]


def _load(preset: str):
    from growmem import config

    try:
        return config.load(preset)
    except config.UnknownPresetError:
        names = [n for n, _, _ in config.available()]
        raise UnknownNameError(f"unknown growmem preset {preset!r}; valid presets: {', '.join(names)} "
                               f"(or a path to a preset TOML file)") from None


def _preset_method(preset: str, alias: Optional[str], want: Optional[str] = None) -> Method:
    p = _load(preset)
    kind = "target" if getattr(p, "kind", None) == "target" else "net"
    stem = Path(preset).stem
    name = f"target:{stem.removeprefix('target_')}" if kind == "target" else f"net:{stem}"
    if want is not None and kind != want:
        what = "a target memory (it has a [target] table)" if kind == "target" else "a growing network"
        raise UnknownNameError(f"preset {preset!r} is {what}: name the method {name}")
    return Method(name=name, kind="learner", family=kind, preset=preset, description=p.description, alias=alias)


def resolve(name: str, stream: str = "", growmem: Optional[str] = None) -> Method:
    """The :class:`Method` a name stands for on ``stream`` (module docstring); ``growmem``: the preset the
    name ``growmem`` stands for (default: the stream's). An unknown name raises :class:`UnknownNameError`
    listing the valid ones."""
    name = str(name).strip()
    alias = None
    if name == GROWMEM:
        if growmem is not None:
            return _preset_method(growmem, GROWMEM)
        alias, name = GROWMEM, STREAM_DEFAULTS.get(stream, DEFAULT_NET)
    if name.startswith(GROWMEM + ":"):
        m = _preset_method(name.split(":", 1)[1], name)
        return m
    if name.startswith("target:"):
        ref = name.split(":", 1)[1]
        from growmem import config
        preset = ref if ("/" in ref or ref.endswith(".toml")) else \
            f"target_{ref}" if (config.PRESET_DIR / f"target_{ref}.toml").is_file() else ref
        return dataclasses.replace(_preset_method(preset, None, "target"), alias=alias)
    if name.startswith("net:"):
        return dataclasses.replace(_preset_method(name.split(":", 1)[1], None, "net"), alias=alias)
    if name in ONLINE_REPLAY:
        policy, _, keys = name[len("er_"):].partition(":")
        what = "8-bit images" if keys == "raw" else f"{_KEY_NAMES[keys]} (bfloat16)"
        buffer = "a reservoir" if policy == "reservoir" else "a class-balanced reservoir"
        return Method(name=name, kind="avalanche", family="er",
                      description=f"online experience replay: an MLP, {buffer} of {what} at the budget")
    family, _, keys = name.partition(":")
    if family in ORDER_FREE:
        if keys not in KEY_SETS:
            raise unknown(f"key set of {family}", keys, tuple(KEY_SETS))
        return Method(name=name, kind="learner", family=family, preset=name,
                      description=f"{_ORDER_FREE_NAMES[family]} on {_KEY_NAMES[keys]}", alias=alias)
    if _REPLAY.match(name):
        return Method(name=name, kind="avalanche", family="replay",
                      description=f"Avalanche Replay with a buffer of {_REPLAY.match(name).group(1)} samples")
    if name in AVALANCHE:
        family = BUDGET_MATCHED.get(name, name)
        return Method(name=name, kind="avalanche", family=family,
                      description=_AVALANCHE_NAMES[name])
    raise unknown("method", name, valid_methods())


def preset_digest(method: Method) -> Optional[str]:
    """The first 16 hex digits of the SHA-256 of ``method``'s preset file (a ``target:`` or ``net:`` method),
    else None: a result tuned or run with another version of the file is not this method's (benchmarks
    compare it before reading a tried point back)."""
    if method.kind != "learner" or method.family not in ("target", "net"):
        return None
    import hashlib

    from growmem import config

    return hashlib.sha256(config.resolve(method.preset).read_bytes()).hexdigest()[:16]


def resolve_all(names: Sequence[str], stream: str = "", growmem: Optional[str] = None) -> List[Method]:
    """Every name resolved, in order; an empty list or a method named twice (also through an alias)
    is an error."""
    out: List[Method] = []
    for n in names:
        if not str(n).strip():
            continue
        m = resolve(n, stream, growmem)
        twin = next((o for o in out if o.name == m.name), None)
        if twin is not None:
            alias = m.alias or twin.alias
            raise ConfigError(f"method {m.name!r} is listed twice" + (f" ({alias!r} is {m.name})" if alias else ""))
        out.append(m)
    if not out:
        raise ConfigError(f"no methods to run; choose from {', '.join(valid_methods())}")
    return out
