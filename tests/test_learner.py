"""growmem.learner: the target memory, the order-free models and a growing network answer the one
protocol a continual run asks of a model, and GrowmemLearner counts and reports them through it."""
import numpy as np
import pytest

from growmem.continual.learner import GrowmemLearner, NetworkLearner
from growmem.learner import Learner


@pytest.mark.parametrize("preset, kind", [("target_dct", "TargetMemory"), ("knn:dct", "KNN"),
                                          ("continual_growmem", "NetworkLearner")])
def test_every_kind_of_model_is_a_learner_and_is_counted_through_the_protocol(preset, kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=48)
    lrn = GrowmemLearner(preset, num_classes=10, seed=0)
    for i in range(0, 48, 16):
        lrn.step(x[i:i + 16], y[i:i + 16])
    model = lrn.trainers["task0"]
    assert type(model).__name__ == kind and isinstance(model, Learner)
    assert model.fixed_shapes == isinstance(model, NetworkLearner)
    # the learner's counts are its model's: rows per part, bytes summed (a network's input space once, beside)
    assert lrn.rows_in_use() == {f"task0/{k}": n for k, n in model.rows().items()} and sum(model.rows().values()) > 0
    space = 0 if lrn._space is None else int(lrn._space.nbytes())
    assert lrn.memory_bytes()["bytes_in_use"] == model.nbytes()["bytes_in_use"] + space
    # predict through the protocol is the learner's predict for one task
    np.testing.assert_array_equal(lrn.predict(x), np.asarray(model.predict(x), np.float32))


def test_what_lacks_a_call_of_the_protocol_is_not_a_learner():
    class NoRows:
        fixed_shapes = False

        def observe(self, x, y): ...

        def predict(self, x, batch_size=1024): ...

        def state(self): ...

        def load_state(self, state): ...

        def nbytes(self): ...

    assert not isinstance(NoRows(), Learner) and not isinstance(object(), Learner)
