"""growmem.continual: the Avalanche strategy and its metrics, the fast loop, bytes, task labels,
online streams, and the errors on bad input. Tiny generated streams; seconds each."""
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
from avalanche.benchmarks import tensors_benchmark  # noqa: E402
from avalanche.evaluation.metrics import accuracy_metrics, bwt_metrics, forgetting_metrics  # noqa: E402
from avalanche.logging import TextLogger  # noqa: E402
from avalanche.logging.base_logger import BaseLogger  # noqa: E402
from avalanche.training.plugins import EvaluationPlugin  # noqa: E402

from growmem.continual import errors  # noqa: E402
from growmem.continual.drifting import DriftingTeacher  # noqa: E402
from growmem.continual.learner import GrowmemConfig, GrowmemLearner  # noqa: E402
from growmem.continual.metrics import forgetting_and_bwt, summarize  # noqa: E402
from growmem.continual.runner import run_continual  # noqa: E402
from growmem.continual.streams import make_stream  # noqa: E402
from growmem.continual.strategy import GrowmemStrategy  # noqa: E402

torch.set_num_threads(1)
TINY = dict(n_experiences=3, train_limit=96, test_limit=64)


class Recorder(BaseLogger):
    """An Avalanche logger that keeps every value it is given, in order."""

    def __init__(self):
        super().__init__()
        self.values = []

    def log_single_metric(self, name, value, x_plot):
        self.values.append((name, value))

    def last(self, name):
        return [v for n, v in self.values if n == name][-1]


def _tiny_drift(**kw):
    return make_stream("drifting_teacher", seed=kw.pop("seed", 3), **{**TINY, **kw})


def _class_benchmark(task_labels=(0, 0), n=80, d=6, seed=0):
    """Two experiences of two classes each (class-incremental), or task-incremental."""
    rs = np.random.RandomState(seed)
    centers = rs.randn(4, d) * 3

    def exp(classes, m):
        y = rs.choice(classes, m)
        x = centers[y] + rs.randn(m, d)
        return [torch.tensor(x, dtype=torch.float32), torch.tensor(y)]

    train = [exp([0, 1], n), exp([2, 3], n)]
    test = [exp([0, 1], n // 2), exp([2, 3], n // 2)]
    return tensors_benchmark(train, test, task_labels=list(task_labels)), train, test


# ----------------------------------------------------------------------------- the strategy in Avalanche

def test_strategy_inside_evaluation_plugin_logs_accuracies_equal_to_an_independent_count():
    st = _tiny_drift()
    rec, text = Recorder(), io.StringIO()
    ev = EvaluationPlugin(accuracy_metrics(experience=True, stream=True, epoch=True),
                          forgetting_metrics(experience=True, stream=True), bwt_metrics(stream=True),
                          loggers=[rec, TextLogger(text)])
    strategy = GrowmemStrategy(num_classes=st.n_classes, evaluator=ev, seed=1, eval_mb_size=64)
    # the same stream, regenerated as plain numpy arrays: the independent reference
    _, test = DriftingTeacher(seed=3, n_experiences=3, samples_per_experience=96, test_samples=64).arrays()
    matrix = []
    for i, exp in enumerate(st.train_stream):
        strategy.train(exp, shuffle=False)
        strategy.eval(st.test_stream)
        row, correct, total = [], 0, 0
        for j, (x, y) in enumerate(test):
            pred = strategy.learner.predict(x).argmax(-1)
            row.append(float(np.mean(pred == y)))
            correct, total = correct + int(np.sum(pred == y)), total + len(y)
            logged = rec.last(f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{j:03d}")
            assert logged == pytest.approx(row[-1], abs=1e-12), (i, j)
        assert rec.last("Top1_Acc_Stream/eval_phase/test_stream/Task000") == pytest.approx(correct / total, abs=1e-12)
        matrix.append(row)
    # Avalanche's plugin forgetting / BWT equal our summary of the matrix and the hand formula
    f_hand = np.mean([matrix[j][j] - matrix[-1][j] for j in range(2)])
    s = summarize(matrix, correct / total)
    assert s["forgetting"] == pytest.approx(f_hand, abs=1e-12)
    assert rec.last("StreamForgetting/eval_phase/test_stream") == pytest.approx(f_hand, abs=1e-12)
    assert rec.last("StreamBWT/eval_phase/test_stream") == pytest.approx(-f_hand, abs=1e-12)
    assert s["acc_mean_over_experiences"] == pytest.approx(np.mean(matrix[-1]))
    assert "Top1_Acc_Stream/eval_phase/test_stream" in text.getvalue()  # the text logger printed them too
    # every training sample became one row (no policy), after the D0 rows of the preset
    assert sum(strategy.learner.rows_in_use().values()) == 16 + 3 * 96


def test_training_accuracy_is_prequential():
    st = _tiny_drift(n_experiences=1)
    rec = Recorder()
    strategy = GrowmemStrategy(num_classes=st.n_classes, seed=0, train_mb_size=32,
                               evaluator=EvaluationPlugin(accuracy_metrics(epoch=True), loggers=[rec]))
    ref = GrowmemLearner(num_classes=st.n_classes, seed=0)
    (x, y), _ = [a[0] for a in DriftingTeacher(seed=3, n_experiences=1, samples_per_experience=96,
                                              test_samples=64).arrays()]
    correct = 0
    for lo in range(0, 96, 32):  # predict each batch, then learn it
        correct += int(np.sum(ref.predict(x[lo:lo + 32]).argmax(-1) == y[lo:lo + 32]))
        ref.step(x[lo:lo + 32], y[lo:lo + 32])
    strategy.train(st.train_stream[0], shuffle=False)
    assert rec.last("Top1_Acc_Epoch/train_phase/train_stream/Task000") == pytest.approx(correct / 96, abs=1e-12)


def test_a_plugin_may_change_the_batch_or_stop_the_epoch_inside_the_one_loop():
    """The template's epoch runs through growmem.train.fit: the learner steps on the mini-batch as the
    plugins left it (here: labels shifted in before_training_iteration), and a plugin's stop_training()
    ends the epoch after the batch it was called in — the same rows as stepping a learner by hand."""
    from avalanche.core import SupervisedPlugin

    class Shift(SupervisedPlugin):
        def before_training_iteration(self, strategy, **kw):
            strategy.mbatch[1] = (strategy.mbatch[1] + 1) % strategy.learner.num_classes

    class StopAfter(SupervisedPlugin):
        def __init__(self, n):
            super().__init__()
            self.n, self.seen = n, 0

        def after_training_iteration(self, strategy, **kw):
            self.seen += 1
            if self.seen == self.n:
                strategy.stop_training()

    st = _tiny_drift(n_experiences=1)
    stop = StopAfter(2)
    strategy = GrowmemStrategy(num_classes=st.n_classes, seed=0, train_mb_size=32, plugins=[Shift(), stop],
                               evaluator=EvaluationPlugin(loggers=[]))
    strategy.train(st.train_stream[0], shuffle=False)
    ref = GrowmemLearner(num_classes=st.n_classes, seed=0)
    (x, y), _ = [a[0] for a in DriftingTeacher(seed=3, n_experiences=1, samples_per_experience=96,
                                              test_samples=64).arrays()]
    for lo in (0, 32):          # two batches of three, their labels shifted
        ref.step(x[lo:lo + 32], (y[lo:lo + 32] + 1) % st.n_classes)
    assert stop.seen == 2 and sum(strategy.learner.rows_in_use().values()) == 16 + 64
    np.testing.assert_array_equal(strategy.learner.predict(x), ref.predict(x))


def test_accuracy_matrix_forgetting_and_bwt_on_a_hand_computed_example():
    a = [[0.9, 0.1, 0.0],
         [0.6, 0.8, 0.2],
         [0.5, 0.7, 0.95]]
    s = summarize(a, stream_weighted=0.66)
    # forgetting_j = a[j][j] - a[T-1][j] for j < T-1: 0.4 and 0.1
    assert s["forgetting"] == pytest.approx(0.25)
    assert s["bwt"] == pytest.approx(-0.25)
    assert s["forgetting_per_experience"] == {0: pytest.approx(0.4), 1: pytest.approx(0.1)}
    assert s["acc_mean_over_experiences"] == pytest.approx((0.5 + 0.7 + 0.95) / 3)
    assert s["acc_stream_weighted"] == 0.66  # reported as given, never recomputed from the mean
    assert s["acc_current_mean"] == pytest.approx((0.9 + 0.8 + 0.95) / 3)
    assert forgetting_and_bwt([[0.7]]) == (None, None, {})
    joint = summarize([[0.9, 0.8, 0.7]], 0.8, square=False)  # evaluated once at the end
    assert joint["forgetting"] is None and joint["acc_mean_over_experiences"] == pytest.approx(0.8)


# ----------------------------------------------------------------------------- fast loop vs template

@pytest.mark.parametrize("stream_kind", ["drift_in_order", "shuffled_two_epochs"])
def test_fast_loop_and_template_give_the_same_metrics(stream_kind):
    if stream_kind == "drift_in_order":
        kw = dict(stream="drifting_teacher", stream_options=TINY, epochs=None)
    else:
        kw = dict(stream=_class_benchmark()[0], epochs=2)
    out = {}
    for loop in ("fast", "template"):
        doc = run_continual(methods=["growmem"], seeds=[2], growmem_loop=loop, progress=False, verbose=False,
                            eval_mb_size=24, prequential=True, **kw)
        out[loop] = doc["runs"][0]
    a, b = out["fast"], out["template"]
    for key in ("accuracy_matrix", "acc_stream_weighted_after", "prequential_acc", "bytes"):
        assert a[key] == b[key], key
    assert a["summary"]["forgetting"] == b["summary"]["forgetting"]
    assert len(a["accuracy_matrix"]) == a["n_experiences"]


@pytest.mark.parametrize("stop_at", [(0, 3), (0, 10), (1, 10)])   # 10 batches an epoch: (0, 10) ends epoch 0
def test_the_fast_loop_stopped_at_a_batch_and_resumed_there_ends_as_the_uninterrupted_loop(stop_at):
    """FastLoop.train stopped after batch (epoch, batch) and resumed from that position with the running bytes
    record and prequential accuracy saved there (as the runner's checkpoints do): the same prequential
    accuracy, bytes record and learner as one uninterrupted call; an epoch's last batch included."""
    from growmem.continual.fast import FastLoop
    from growmem.continual.metrics import accuracy_state

    bm, _, test = _class_benchmark(n=80)
    exp = bm.train_stream[0]

    def loop(learner):
        return FastLoop(learner, train_mb_size=8, train_epochs=2, seed=1, train_outputs=True, memory_every=4)

    ref_learner = GrowmemLearner(num_classes=4, seed=0)
    ref = loop(ref_learner)
    ref_out = ref.train(exp)

    class Stop(Exception):
        pass

    learner, saved = GrowmemLearner(num_classes=4, seed=0), {}
    first = loop(learner)

    def hook(pos):
        if (pos["epoch"], pos["batch"]) == stop_at:
            saved.update(bytes=dict(first.bytes.current), acc=accuracy_state(first.epoch_acc))
            raise Stop

    with pytest.raises(Stop):
        first.train(exp, hook=hook)
    second = loop(learner)
    seen = []
    out = second.train(exp, resume={"epoch": stop_at[0], "batch": stop_at[1]}, bytes_resume=saved["bytes"],
                       acc_resume=saved["acc"], hook=lambda p: seen.append((p["epoch"], p["batch"])))
    assert out == ref_out and second.last_bytes == ref.last_bytes
    assert seen[0] == ((stop_at[0], stop_at[1] + 1) if stop_at[1] < 10 else (stop_at[0] + 1, 1)) if seen else \
        stop_at == (1, 10)
    x = test[0][0].numpy()
    assert np.array_equal(learner.predict(x), ref_learner.predict(x))


# ----------------------------------------------------------------------------- bytes

def _expected_rows_bytes(rows, d_in, d_out):
    arrays = [np.zeros((rows,), np.float32), np.zeros((rows, d_in), np.float32),
              np.zeros((rows, d_out), np.float32), np.zeros((rows,), np.int32)]
    return sum(a.nbytes for a in arrays)


def test_growmem_bytes_match_an_independent_count_of_array_sizes():
    learner = GrowmemLearner(num_classes=5, seed=0)  # continual_growmem: no blocks, D0 of 16 rows, capacity 256
    rs = np.random.RandomState(0)
    for _ in range(3):
        learner.step(rs.randn(16, 8).astype(np.float32), rs.randint(0, 5, 16))
    b = learner.memory_bytes()
    scalars = sum(a.nbytes for a in (np.zeros((), np.int32),) * 3)  # size, t of the memory; the step counter
    assert b["rows_in_use"] == 16 + 48 and b["rows_allocated"] == 256
    assert b["rows_in_use_bytes"] == _expected_rows_bytes(64, 8, 5)
    assert b["rows_allocated_bytes"] == _expected_rows_bytes(256, 8, 5)
    assert b["bytes_in_use"] == _expected_rows_bytes(64, 8, 5) + scalars
    assert b["bytes_allocated"] == _expected_rows_bytes(256, 8, 5) + scalars
    # past the first capacity the allocation grows geometrically, rows in use one per sample
    for _ in range(15):
        learner.step(rs.randn(16, 8).astype(np.float32), rs.randint(0, 5, 16))
    b = learner.memory_bytes()
    assert b["rows_in_use_bytes"] == _expected_rows_bytes(16 + 18 * 16, 8, 5)
    assert b["rows_allocated"] == 512 and b["rows_allocated_bytes"] == _expected_rows_bytes(512, 8, 5)


def test_memory_budget_caps_growmem_rows_in_use_and_allocated():
    per_row = _expected_rows_bytes(1, 8, 5)
    budget = 600 * per_row + 12  # 600 rows + the three int32 scalars
    learner = GrowmemLearner(num_classes=5, seed=0, budget_bytes=budget)
    rs = np.random.RandomState(1)
    for _ in range(40):
        learner.step(rs.randn(16, 8).astype(np.float32), rs.randint(0, 5, 16))
    b = learner.memory_bytes()
    # the memory allocates exactly the 600 rows the budget holds: 584 kept + one batch of 16 candidates
    assert learner.rows_allocated == 600 and learner.max_rows == 584
    assert b["rows_in_use"] == 584 and b["rows_allocated"] == 600
    assert b["bytes_in_use"] == _expected_rows_bytes(584, 8, 5) + 12 <= budget
    assert b["bytes_allocated"] == _expected_rows_bytes(600, 8, 5) + 12 == budget
    # a budget that holds no more than a batch keeps what it holds
    small = GrowmemLearner(num_classes=5, seed=0, budget_bytes=16 * per_row + 12)
    for _ in range(12):
        small.step(rs.randn(16, 8).astype(np.float32), rs.randint(0, 5, 16))
    assert small.max_rows == 16 and small.memory_bytes()["bytes_allocated"] == 16 * per_row + 12
    with pytest.raises(ValueError, match="budget"):
        GrowmemLearner(num_classes=5, budget_bytes=10).step(rs.randn(16, 8).astype(np.float32), np.zeros(16))


def test_a_budget_below_the_models_initial_rows_is_refused_naming_what_it_needs():
    """The default network starts with D0 = 16 rows: a budget that allocates fewer is refused (it used to
    run past the budget), and the bytes the message names are enough."""
    from growmem.errors import ConfigError

    per_row = _expected_rows_bytes(1, 8, 5)
    rs = np.random.RandomState(2)
    x, y = rs.randn(16, 8).astype(np.float32), rs.randint(0, 5, 16)
    with pytest.raises(ConfigError, match=r"holds 10 rows per layer .* fewer than its 16 initial rows") as e:
        GrowmemLearner(num_classes=5, seed=0, budget_bytes=10 * per_row + 12).step(x, y)
    need = int(re.search(r"at least (\d+) B", str(e.value)).group(1))
    ok = GrowmemLearner(num_classes=5, seed=0, budget_bytes=need)
    for _ in range(4):
        ok.step(x, y)
    assert ok.memory_bytes()["bytes_allocated"] <= need and ok.rows_allocated >= 16


def _mlp_arrays(d_in, hidden, n_out):
    shapes = [(hidden, d_in), (hidden,), (hidden, hidden), (hidden,), (n_out, hidden), (n_out,)]
    return sum(np.zeros(s, np.float32).nbytes for s in shapes)


def test_baseline_bytes_match_an_independent_count_of_array_sizes():
    from growmem.continual import baselines as B
    from growmem.continual.memory_bytes import torch_strategy_bytes
    from growmem.continual.metrics import make_evaluator

    st = make_stream(_class_benchmark()[0])
    params = _mlp_arrays(6, 400, 4)
    sample = np.zeros(6, np.float32).nbytes + np.zeros((), np.int64).nbytes * 2  # x, class, task label
    expect = {"naive": 2 * params,  # parameters + SGD momentum buffers
              "replay_50": 2 * params + 50 * sample,
              "ewc": 2 * params + 2 * params,  # saved parameters + importances of one experience
              "lwf": 2 * params + params,  # the previous model
              "cumulative": 2 * params + 80 * sample}
    for name, want in expect.items():
        s = B.make_baseline(name, st, seed=0, evaluator=make_evaluator(), epochs=1)
        s.train(st.train_stream[0])
        assert torch_strategy_bytes(s)["bytes_in_use"] == want, name


# ----------------------------------------------------------------------------- task labels, online

def test_task_incremental_stream_gets_one_readout_per_task():
    bm, _, test = _class_benchmark(task_labels=(0, 1))
    st = make_stream(bm)
    assert st.task_labels == (0, 1) and st.task_incremental
    strategy = GrowmemStrategy(num_classes=st.n_classes, seed=0, evaluator=EvaluationPlugin(loggers=[]))
    strategy.train(st.train_stream[0])
    assert sorted(strategy.learner.trainers) == ["task0"]
    strategy.train(st.train_stream[1])
    assert sorted(strategy.learner.trainers) == ["task0", "task1"]
    x1 = test[1][0].numpy()
    own = strategy.learner.trainers["task1"].predict(x1)
    routed = strategy.model(torch.from_numpy(x1), torch.ones(len(x1), dtype=torch.long)).numpy()
    assert np.array_equal(routed, np.asarray(own))  # task-1 samples are answered by the task-1 readout
    assert np.all(strategy.learner.predict(x1, np.full(len(x1), 7)) == 0)  # a task never trained: zeros


def test_baselines_get_a_head_per_task_on_a_task_incremental_stream(tmp_path):
    from avalanche.models import MultiTaskModule

    from growmem.continual import baseline_state as BS
    from growmem.continual import baselines as B
    from growmem.continual.metrics import accuracy_row, make_evaluator

    st = make_stream(_class_benchmark(task_labels=(0, 1))[0])
    assert not isinstance(B.make_model(make_stream(_class_benchmark()[0])), MultiTaskModule)
    s = B.make_baseline("ewc", st, seed=0, evaluator=make_evaluator(), epochs=1)
    assert isinstance(s.model, MultiTaskModule)
    exps = [st.train_stream[e] for e in range(2)]
    BS.tag_samples(exps)
    s.train(exps[0])
    arrays, doc = BS.strategy_state(s, 1)
    s.train(exps[1])
    after = accuracy_row(s.eval(st.test_stream), 2)
    resumed = B.make_baseline("ewc", st, seed=0, evaluator=make_evaluator(), epochs=1)
    BS.load_strategy_state(resumed, arrays, doc, exps)  # a multi-head model goes through a checkpoint
    assert sorted(resumed.model.classifier.classifiers) == ["0"]    # the head of the task it had seen
    resumed.train(exps[1])
    assert len(after) == 2 and all(0 <= a <= 1 for a in after)
    assert sorted(resumed.model.classifier.classifiers) == ["0", "1"]  # one head per task label
    with pytest.raises(errors.ConfigError, match="GDumb's MLP ends in batch norm"):   # not a traceback
        B.make_baseline("gdumb", st, seed=0, evaluator=make_evaluator(), epochs=1)


def test_online_stream_without_task_boundaries_trains_like_the_whole_experience():
    from avalanche.benchmarks.scenarios.online import split_online_stream

    st = _tiny_drift(n_experiences=2)
    whole = GrowmemStrategy(num_classes=5, seed=4, train_mb_size=16, evaluator=EvaluationPlugin(loggers=[]))
    for exp in st.train_stream:
        whole.train(exp, shuffle=False)
    online = GrowmemStrategy(num_classes=5, seed=4, train_mb_size=16, evaluator=EvaluationPlugin(loggers=[]))
    subs = list(split_online_stream(st.train_stream, experience_size=32, shuffle=False,
                                    access_task_boundaries=False))
    assert len(subs) == 6
    for sub in subs:
        online.train(sub, shuffle=False)
    x = np.concatenate([DriftingTeacher(seed=3, n_experiences=2, samples_per_experience=96,
                                        test_samples=64).arrays()[1][j][0] for j in range(2)])
    assert np.array_equal(whole.learner.predict(x), online.learner.predict(x))


# ----------------------------------------------------------------------------- bad input

def test_inputs_that_do_not_fit_the_model_name_both_shapes():
    st = _tiny_drift()
    strategy = GrowmemStrategy(num_classes=5, input_size=784, evaluator=EvaluationPlugin(loggers=[]))
    with pytest.raises(errors.InputShapeError, match=r"\(8,\).*784"):
        strategy.train(st.train_stream[0])
    learner = GrowmemLearner(num_classes=5)
    learner.step(np.zeros((4, 1, 28, 28), np.float32), np.zeros(4))
    with pytest.raises(errors.InputShapeError, match=r"\(3, 32, 32\).*3072.*\(1, 28, 28\).*784"):
        learner.step(np.zeros((4, 3, 32, 32), np.float32), np.zeros(4))


def test_labels_outside_the_model_name_num_classes():
    with pytest.raises(ValueError, match="num_classes"):
        GrowmemLearner(num_classes=3).step(np.zeros((4, 8), np.float32), np.array([0, 1, 2, 5]))


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(errors.UnknownNameError, match="split_mnist.*drifting_teacher"):
        run_continual("split_mnsit", progress=False)
    with pytest.raises(errors.UnknownNameError, match="naive.*replay_4400"):
        run_continual("drifting_teacher", methods=["growmem", "replay"], progress=False)
    with pytest.raises(errors.UnknownNameError, match="continual_growmem"):
        run_continual("drifting_teacher", methods=["growmem:no_such_preset"], progress=False)
    with pytest.raises(errors.UnknownNameError, match="weighted_softmax"):
        GrowmemConfig(preset="no_such_preset").load()
    with pytest.raises(errors.UnknownNameError, match="fast.*template"):
        run_continual("drifting_teacher", growmem_loop="slow", progress=False)


def test_a_missing_dataset_names_the_paths_searched_and_how_to_get_it(tmp_path, monkeypatch):
    import avalanche.benchmarks.datasets.dataset_utils as du

    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("GROWMEM_DATA", str(empty))
    monkeypatch.setattr(du, "default_dataset_location", lambda name: tmp_path / "avalanche" / name)
    with pytest.raises(errors.DatasetNotFoundError) as e:
        make_stream("split_cifar10", data_dir=str(empty))
    msg = str(e.value)
    assert str(empty) in msg and str(tmp_path / "avalanche" / "cifar10") in msg and "--download" in msg
    # MNIST: the message of the data module (its folders searched) plus how to get the files
    from growmem.data import mnist

    def missing(split, data_dir=None, **kw):
        raise FileNotFoundError(f"mnist not found. Searched:\n  {empty}/mnist  (does not exist)")

    monkeypatch.setattr(mnist, "load", missing)
    with pytest.raises(errors.DatasetNotFoundError) as e:
        make_stream("split_mnist", data_dir=str(empty))
    msg = str(e.value)
    assert f"{empty}/mnist" in msg and "--data-dir" in msg and "--download" in msg


def test_missing_avalanche_raises_an_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "avalanche", None)
    with pytest.raises(errors.MissingExtraError, match=r"pip install 'growmem\[continual\]'"):
        errors.require_avalanche()
    import growmem.continual as gc

    with pytest.raises(errors.MissingExtraError, match="growmem\\[continual\\]"):
        gc.make_stream  # noqa: B018  (a lazy name needs the extra)


def test_growmem_imports_without_avalanche_and_the_cli_names_the_extra():
    code = ("import sys; import growmem, growmem.continual; "
            "assert 'avalanche' not in sys.modules and 'torch' not in sys.modules, 'imported eagerly'; "
            "sys.modules['avalanche'] = None; "
            "from growmem.app.continual import main; main(['--stream', 'drifting_teacher'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode != 0
    assert "imported eagerly" not in r.stderr
    assert "pip install 'growmem[continual]'" in r.stderr, r.stderr[-2000:]


def test_online_mode_is_one_pass_for_every_method_and_epochs_per_method_are_checked():
    bm = _class_benchmark()[0]
    doc = run_continual(bm, methods=["growmem", "naive"], seeds=[0], online=True, epochs={"naive": 3},
                        progress=False, verbose=False)
    assert [r["config"]["epochs"] for r in doc["runs"]] == [1, 1]
    doc = run_continual(bm, methods=["naive"], seeds=[0], epochs={"naive": 3}, progress=False, verbose=False)
    assert doc["runs"][0]["config"]["epochs"] == 3
    with pytest.raises(ValueError, match="ewc"):
        run_continual(bm, methods=["naive"], epochs={"ewc": 2}, progress=False)
    with pytest.raises(TypeError, match="train_stream"):
        make_stream(object())


@pytest.mark.parametrize("threads, during", [(None, 1), (2, 2), (0, 3)])
def test_baselines_train_on_the_torch_threads_asked_and_the_count_is_restored(threads, during):
    """Default one PyTorch thread (a small MLP's steps are dominated by a second thread's synchronisation);
    0 keeps PyTorch's own count; the caller's count is back after the call, also after a failure."""
    bm = _class_benchmark()[0]
    seen = []
    torch.set_num_threads(3)
    try:
        kw = {} if threads is None else {"threads": threads}
        doc = run_continual(bm, methods=["naive"], seeds=[0], online=True, progress=False, verbose=False,
                            on_batch=lambda info: seen.append(torch.get_num_threads()), **kw)
        assert seen and set(seen) == {during}
        assert doc["config"]["torch_threads"] == during and doc["runs"][0]["config"]["torch_threads"] == during
        assert torch.get_num_threads() == 3

        def boom(info):
            raise RuntimeError("stop here")

        with pytest.raises(RuntimeError, match="stop here"):
            run_continual(bm, methods=["naive"], seeds=[0], online=True, progress=False, verbose=False,
                          on_batch=boom, **kw)
        assert torch.get_num_threads() == 3
        with pytest.raises(errors.ConfigError, match="threads must be an integer >= 0"):
            run_continual(bm, methods=["naive"], seeds=[0], threads=-1, progress=False, verbose=False)
        with pytest.raises(errors.ConfigError, match="got None"):
            run_continual(bm, methods=["naive"], seeds=[0], threads=None, progress=False, verbose=False)
    finally:
        torch.set_num_threads(1)


def test_a_failing_call_leaves_its_folders_free_for_the_next_one_at_once(tmp_path):
    """The folder locks are released in a ``finally``, not when the failed call's frame is collected: the
    same --out and checkpoint folder take the next call at once, while the exception's traceback (and so
    the failed frame) is still alive."""
    bm = _class_benchmark()[0]
    out, ck = tmp_path / "out", tmp_path / "ck"

    def boom(info):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here") as failure:
        run_continual(bm, methods=["growmem"], seeds=[0], out=out, checkpoint_dir=ck, on_batch=boom,
                      progress=False, verbose=False)
    assert failure.value.__traceback__ is not None                      # the failed frames are still referenced
    doc = run_continual(bm, methods=["growmem"], seeds=[0], out=out, checkpoint_dir=tmp_path / "ck2",
                        progress=False, verbose=False)
    assert (out / "continual.json").is_file() and doc["runs"][0]["seed"] == 0
    # its checkpoint folder is free too: the failed run is resumed from it at once
    doc = run_continual(bm, methods=["growmem"], seeds=[0], out=tmp_path / "out2", checkpoint_dir=ck, resume=True,
                        progress=False, verbose=False)
    assert len(doc["runs"]) == 1


def test_rotated_experiences_hold_each_image_rotated_as_the_per_sample_transform_would():
    """Rotated-MNIST rotates each experience's images once, as one tensor; every image must equal what
    torchvision's RandomRotation of that one angle gives it alone (the transform Avalanche's RotatedMNIST
    freezes into each item), bitwise, at angles that need interpolation and at the edges of the range."""
    from torchvision.transforms import RandomRotation

    from growmem.continual.streams import ArrayDataset, _rotated

    rs = np.random.RandomState(0)
    x = (rs.rand(40, 784) * (rs.rand(40, 784) > 0.6)).astype(np.float32)
    ds = ArrayDataset(x, rs.randint(0, 10, 40), (1, 28, 28), "noise")
    for a in (-180, -97, 13, 90, 180):
        t = RandomRotation(degrees=(a, a))
        out = _rotated(ds, t)
        alone = torch.stack([t(ds[i][0]) for i in range(len(ds))])
        assert torch.equal(out.data, alone), a
        assert torch.equal(out.targets, ds.targets) and len(out) == len(ds)
        if a not in (-180, 180):
            assert not torch.equal(out.data, ds.data)  # something did rotate


def test_a_network_with_an_input_key_space_allocates_within_its_budget():
    """A preset with ``[inputs]`` (DCT keys) keeps the key space's state (the DCT factor) beside its rows: the
    rows it allocates leave room for it, so the bytes allocated, not only those in use, stay within the
    budget."""
    from growmem.continual.learner import GrowmemConfig

    rs = np.random.RandomState(0)
    for preset in ("readout_replay_dct_merge", "replay_dct"):
        learner = GrowmemLearner(GrowmemConfig(preset=preset), num_classes=10, seed=0, budget_bytes=100_000)
        for _ in range(3):
            learner.step(rs.rand(16, 784).astype(np.float32), rs.randint(0, 10, 16))
        b = learner.memory_bytes()
        space = learner._space.nbytes()
        assert space > 0 and b["bytes_allocated"] <= 100_000
        other, per_row = learner._sizes
        assert 100_000 - b["bytes_allocated"] < per_row          # and no more than a row's worth is left unused


def test_avalanches_own_deprecation_warnings_are_hidden_during_a_baselines_training_only():
    """Avalanche's decorator puts a "once" filter first on every call, so only the display can drop them;
    any other warning, and the same warning outside the context, still comes through."""
    import warnings

    from avalanche._annotations import deprecated

    from growmem.continual.baselines import avalanche_deprecations_hidden

    @deprecated(0.7, "switch to post_adapt")
    def update():
        return 1

    def shown(call):
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            call()
        return [str(w.message) for w in log]

    def inside():
        with avalanche_deprecations_hidden():
            update()
            update()
            warnings.warn("kept", DeprecationWarning)

    assert shown(inside) == ["kept"]
    assert shown(update)[0].startswith("Call to deprecated function update (removal in version 0.7")
