"""An Avalanche baseline saved through growmem's Checkpointer after one experience and put back into a strategy
built afresh trains the next experience to the same model, bit for bit, as the strategy that went on; what it
cannot put back is refused by name."""
import numpy as np
import pytest

pytest.importorskip("avalanche")
import torch  # noqa: E402

from growmem.checkpoint import Checkpointer  # noqa: E402
from growmem.continual import baseline_state as BS  # noqa: E402
from growmem.continual import baselines as B  # noqa: E402
from growmem.continual.metrics import make_evaluator  # noqa: E402
from growmem.continual.streams import make_stream  # noqa: E402
from growmem.errors import CheckpointError  # noqa: E402
from test_continual import _class_benchmark  # noqa: E402

BUFFERED = {"replay_50": None, "gdumb_bytes": {"mem_size": 30}, "er_balanced:raw": {"mem_size": 30},
            "er_reservoir:raw": {"mem_size": 30}}
NAMES = ["naive", "ewc", "lwf", "cumulative", *BUFFERED]


def _build(name, task_labels=(0, 0)):
    st = make_stream(_class_benchmark(task_labels=task_labels)[0])
    s = B.make_baseline(name, st, seed=0, evaluator=make_evaluator(), epochs=2, settings=BUFFERED.get(name))
    exps = [st.train_stream[e] for e in range(2)]
    BS.tag_samples(exps)
    return s, exps


def _same(a, b) -> bool:
    pa, pb = a.model.state_dict(), b.model.state_dict()
    return sorted(pa) == sorted(pb) and all(torch.equal(pa[k], pb[k]) for k in pa)


def _buffer_places(s):
    for p in s.plugins:
        if hasattr(p, "storage_policy"):
            return [BS._places(g.buffer).tolist() for g in p.storage_policy.buffer_groups.values()]
        if type(p).__name__ == "OnlineReplay":
            return [p.x.tolist(), p.y.tolist()]
    return None


@pytest.mark.parametrize("name", NAMES)
def test_a_baseline_resumed_from_its_checkpoint_trains_on_as_the_one_that_went_on(name, tmp_path):
    went_on, exps = _build(name)
    torch.manual_seed(1)
    went_on.train(exps[0])
    arrays, doc = BS.strategy_state(went_on, 1)
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(arrays, 1, extra={"baseline": doc})
    torch.manual_seed(2)
    went_on.train(exps[1])

    resumed, exps2 = _build(name)
    with Checkpointer(tmp_path / "ck") as ck:
        r = ck.restore_leaves()
    BS.load_strategy_state(resumed, r.state, r.extra["baseline"], exps2)
    torch.manual_seed(2)
    resumed.train(exps2[1])
    assert _same(went_on, resumed)
    assert _buffer_places(went_on) == _buffer_places(resumed)
    assert int(resumed.clock.train_exp_counter) == 2

    # the control: a strategy that starts the second experience without the saved state ends elsewhere
    fresh, exps3 = _build(name)
    torch.manual_seed(2)
    fresh.train(exps3[1])
    assert not _same(went_on, fresh)
    # and no file of the checkpoint is a pickle: every array is read with allow_pickle=False
    for f in (tmp_path / "ck").rglob("*.npy"):
        np.load(f, allow_pickle=False)
    assert not list((tmp_path / "ck").rglob("*.pkl"))


def test_a_buffer_is_saved_as_the_places_of_its_samples_in_the_stream():
    s, exps = _build("replay_50")
    s.train(exps[0])
    s.train(exps[1])
    arrays, doc = BS.strategy_state(s, 2)
    n0 = len(exps[0].dataset)
    groups = [np.asarray(arrays[f"plugins/0/storage_policy/group{i}/places"]) for i in range(2)]
    # Avalanche's experience-balanced buffer: one group per experience, its samples from that experience alone
    assert [len(g) for g in groups] == [25, 25]
    assert groups[0].max() < n0 <= groups[1].min()
    # the places are the samples: the inputs the buffer holds are those of the stream at these places
    x_buf = np.stack([np.asarray(it[0]) for it in s.plugins[0].storage_policy.buffer_groups[1].buffer])
    x_exp = np.stack([np.asarray(exps[1].dataset[int(i) - n0][0]) for i in groups[1]])
    assert np.array_equal(x_buf, x_exp)


def test_what_cannot_be_put_back_is_refused_by_name(tmp_path):
    from avalanche.core import SupervisedPlugin

    class Counter(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.seen = []

    s, exps = _build("naive")
    s.plugins.append(Counter())
    with pytest.raises(CheckpointError, match="plugin Counter"):
        BS.strategy_state(s, 0)

    replay, exps = _build("replay_50")
    replay.train(exps[0])
    replay.train(exps[1])
    arrays, doc = BS.strategy_state(replay, 2)
    naive, exps2 = _build("naive")
    with pytest.raises(CheckpointError, match="ReplayPlugin"):
        BS.load_strategy_state(naive, arrays, doc, exps2)
    other, exps3 = _build("replay_50")
    with pytest.raises(CheckpointError, match="stream differs"):     # a shorter stream: the places point past it
        BS.load_strategy_state(other, arrays, doc, exps3[:1])
    untagged = B.make_baseline("replay_50", make_stream(_class_benchmark()[0]), seed=0, evaluator=make_evaluator(),
                               epochs=1)
    st = make_stream(_class_benchmark()[0])
    untagged.train(st.train_stream[0])
    with pytest.raises(CheckpointError, match="not the stream's"):
        BS.strategy_state(untagged, 1)
