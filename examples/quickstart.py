"""growmem in 40 lines: a growing weighted-softmax layer learns a teacher network.

    .venv/bin/python examples/quickstart.py
"""
import jax
import jax.numpy as jnp

import growmem as gm
from growmem.data.teacher_student import TeacherStudent

task = TeacherStudent(seed=0)                      # y* = teacher(x), x on the unit sphere in R^100
x_test, y_test = task.test_set(2048)

# one growing layer on RMSNorm(x): weighted softmax (Eq. 8) grown by Alg. 3
spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=30.0, beta=0.3,
                           momentum=0.6,               # timestamp momentum (Eq. 23/91)
                           init="random", init_rows=64)  # D0 of App. F.3
model = gm.ResidualGrowingNet(d_out=1, n_blocks=0, readout=spec)
trainer = gm.Trainer(model, loss="squared_error", sample_input=x_test[:64], rng=jax.random.key(0))

for step in range(1, 201):
    x, y = task.batch(step, 64)                    # fresh samples every step
    metrics = trainer.step(x, y)                   # forward, one backward, append 64 rows
    if step % 50 == 0:
        mse = float(jnp.mean((trainer.predict(x_test) - y_test) ** 2))
        print(f"step {step:4d}  rows {trainer.rows_in_use()['readout']:6d}  test MSE {mse:.3e}")

# the memory is a pytree of rows (w, k, ṽ, born) you can look at
mem = trainer.memories()[("readout",)]
rows = mem.rows()
print("stored rows:", {name: a.shape for name, a in rows.items()}, "clock t =", int(mem.t))
