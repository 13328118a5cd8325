"""What a memory budget buys each baseline: the bytes of one stored sample, the model a budget-matched
method (``replay_bytes``, ``gdumb_bytes``, online replay) keeps beside its buffer, and the buffer the rest
of the budget holds — the settings :func:`~growmem.continual.runner.run_continual` hands the baseline."""
from __future__ import annotations

from typing import Optional

from . import baselines as B
from .errors import ConfigError
from .memory_bytes import module_bytes, stored_sample_bytes
from .methods import BUDGET_MATCHED, Method
from .streams import MNIST_FAMILY, Stream


def sample_bytes_of(stream: Stream, replay_dtype: str) -> Optional[int]:
    """Bytes of one stored training sample of ``stream`` (``memory_bytes.stored_sample_bytes``): the MNIST
    family and the CIFAR streams hold 8-bit images."""
    uint8 = stream.name in MNIST_FAMILY or stream.name.startswith("split_cifar")
    return stored_sample_bytes(stream.input_size, stream.n_classes, uint8_inputs=uint8,
                               task_labels=stream.task_incremental, replay_dtype=replay_dtype)


def budget_fixed_bytes(name: str, stream, budget_bytes: int, settings: Optional[dict] = None):
    """``(settings, fixed)`` of a budget-matched method (``replay_bytes``, ``gdumb_bytes``): ``settings`` with
    the hidden width its model takes at ``budget_bytes``, and the bytes it keeps beside its buffer — the
    model, its SGD momentum (one buffer per parameter) and GDumb's copy of the initial model. The recipe's
    width where these take at most half the budget (or the width ``settings`` names), else the widest of
    :data:`baselines.ER_WIDTHS` that does."""
    def fixed(s):
        r = B.recipe(name, stream.name, s)
        copies = (2 if r["momentum"] else 1) + (1 if BUDGET_MATCHED.get(name, name) == "gdumb" else 0)
        return module_bytes(B.make_model(stream, r)) * copies

    settings = dict(settings or {})
    own = fixed(settings)
    if "hidden_size" in settings or own <= int(budget_bytes) // 2:
        return settings, own
    for h in B.ER_WIDTHS:
        narrow = {**settings, "hidden_size": h}
        size = fixed(narrow)
        if size <= int(budget_bytes) // 2:
            return narrow, size
    raise ConfigError(f"a memory budget of {budget_bytes} B does not hold {name}'s model of {B.ER_WIDTHS[-1]} hidden "
                      f"units and its optimizer state in half of it: raise --memory-budget")


def baseline_settings_for(method: Method, stream: Stream, settings: dict, budget, sample_bytes) -> dict:
    """``settings`` plus, for ``replay_bytes`` and ``gdumb_bytes``, the buffer the budget holds beside the
    model and its state (:func:`budget_fixed_bytes`) at ``sample_bytes`` a sample; for online
    replay the same beside its one-hidden-layer MLP."""
    if B.is_online_replay(method.name):
        if budget is None:
            raise B.needs_budget(method.name)
        codes = B.er_codes(method.name, stream.input_size)
        n_in = stream.input_size if codes is None else codes.key_dim
        s = {"hidden_size": B.er_width(budget, n_in, stream.n_classes), **settings}
        r = B.recipe(method.name, stream.name, s)
        fixed = module_bytes(B.make_model(stream, {**r, "input_size": n_in})) * (2 if r["momentum"] else 1)
        per = B.OnlineReplay.sample_bytes(stream.input_size, codes, stream.task_incremental) \
            if codes is not None or sample_bytes is not None else 4 * stream.input_size + 8
        return {**s, "mem_size": B.replay_capacity(budget, fixed, per)}
    if method.name not in BUDGET_MATCHED:
        return settings
    if budget is None:
        raise B.needs_budget(method.name)
    settings, fixed = budget_fixed_bytes(method.name, stream, budget, settings)
    per = sample_bytes if sample_bytes is not None else 4 * stream.input_size + 8 * (2 if stream.task_incremental
                                                                                    else 1)
    return {**settings, "mem_size": B.replay_capacity(budget, fixed, per)}
