"""Kept for existing imports: the teacher-student runs moved to :mod:`growmem.repro.teacher_student`
(``growmem repro teacher-student``)."""
from .repro.teacher_student import (_loop, growing_ws_spec, run_growing_ws, run_parametric_softmax,  # noqa: F401
                                    run_reference_mlp)

__all__ = ["growing_ws_spec", "run_growing_ws", "run_parametric_softmax", "run_reference_mlp"]
