"""Write your own growth policy in a few lines and chain it with the built-ins.

    .venv/bin/python examples/custom_policy.py
"""
import jax
import jax.numpy as jnp

import growmem as gm
from growmem import policies
from growmem.data.teacher_student import TeacherStudent


def min_error(threshold):
    """Admit a candidate only if its value (the scaled error) is large; count the refusals."""
    def admit(g, state):
        big = jnp.linalg.norm(g.rows.v, axis=-1) > threshold
        return g._replace(mask=g.mask & big), state + jnp.sum(g.mask & ~big)
    return policies.policy(f"min_error({threshold})", init=lambda mem: jnp.zeros((), jnp.int32), admit=admit)


# stages run policy by policy in chain order: min_error filters, then momentum weights the rows
# at retrieval, weight decay fades them and prunes, and the capacity cap (last) bounds the table
policy = policies.chain(min_error(0.05), policies.momentum(0.6),
                        policies.weight_decay(0.001, prune_below=1e-4),
                        policies.capacity(4000, on_full="evict_smallest"))

task = TeacherStudent(seed=0)
x_test, y_test = task.test_set(1024)
spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=30.0, beta=0.3, init="random", init_rows=64)
trainer = gm.Trainer(gm.ResidualGrowingNet(d_out=1, readout=spec), loss="squared_error",
                     sample_input=x_test[:64], rng=jax.random.key(0), policy=policy)  # passed like an optax tx
for step in range(1, 201):
    trainer.step(*task.batch(step, 64))
    if step % 50 == 0:
        mse = float(jnp.mean((trainer.predict(x_test) - y_test) ** 2))
        refused = int(trainer.state.policy_state["readout"][0])  # min_error's state
        print(f"step {step:4d}  rows {trainer.rows_in_use()['readout']:5d}  refused {refused:5d}  test MSE {mse:.3e}")
