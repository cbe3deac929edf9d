"""Shared fixtures: small synthetic profiles built through the real torch adapter."""

from __future__ import annotations

import pytest

from freezeopt.formats.profile import Profile
from freezeopt.model.dag import PipelineDag, build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.profiling.synth import SynthOptions, synth_profile
from freezeopt.solver import FreezeProblem, SolveOptions

SHAPES = [
    ("1F1B", 2, 4),
    ("1F1B", 4, 8),
    ("GPipe", 3, 6),
    ("Interleaved1F1B", 2, 4),
    ("ZBVZeroBubble", 2, 6),
    ("DualPipeV", 2, 4),
]
"""(schedule, ranks, microbatches): small pipelines of every schedule the synthesiser builds."""


def make_profile(**kw: object) -> Profile:
    """A synthetic profile; keyword arguments override SynthOptions defaults (small sizes)."""
    base: dict[str, object] = {
        "schedule": "1F1B",
        "ranks": 2,
        "microbatches": 4,
        "groups": 2,
        "seed": 0,
    }
    base.update(kw)
    return synth_profile(SynthOptions(**base))  # type: ignore[arg-type]


@pytest.fixture
def small_profile() -> Profile:
    return make_profile()


@pytest.fixture
def small_dag(small_profile: Profile) -> PipelineDag:
    return build_dag(small_profile)


def solve_model(profile: Profile, **kw: object) -> tuple[PipelineDag, FreezeProblem]:
    """The DAG of `profile` and the solver's problem of it (`freezeopt.solver.FreezeProblem`) under
    `SolveOptions(**kw)`, for tests of the steps inside a solve."""
    opts = SolveOptions(**kw)  # type: ignore[arg-type]
    dag = build_dag(profile)
    return dag, FreezeProblem(dag, estimate_signal(profile, opts.sensitivity), opts)
