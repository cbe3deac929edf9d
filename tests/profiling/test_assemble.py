"""What the profile stores of a stage's measured group costs and truncation gains fits its fastest
weight-gradient action, as the file stores them — so the DAG never refuses a profile freezeopt wrote;
and a stage whose group costs all fell within the timing noise is said, not silently frozen nowhere."""

from __future__ import annotations

import statistics

import pytest

from freezeopt.formats.profile import GroupProfile, StageProfile
from freezeopt.profiling.assemble import _stat, fit_scales, unmeasured_stages


def _stored(samples: list[list[float]], scale: float) -> float:
    return sum(_stat(xs, scale=scale).median for xs in samples)


def test_negative_samples_count_as_the_file_stores_them() -> None:
    # under load a difference of two timings can be negative: the raw median of [-0.3, 0.2] is
    # -0.05, but the file stores the clipped samples' median, 0.1
    groups = [[-0.3, 0.2], [0.2, 0.2]]
    trunc = [[0.0, 0.05], [-0.1, 0.1]]
    cap = 0.32
    assert sum(max(0.0, statistics.median(g)) for g in groups) < cap  # the old fit saw room
    scale, t_scale = fit_scales(groups, trunc, cap)
    assert _stored(groups, scale) + _stored(trunc, t_scale) <= cap
    assert scale == 1.0 and 0 < t_scale < 1  # the groups fit; the gains take what is left


@pytest.mark.parametrize("cap", [0.05, 0.3, 1.0])
def test_groups_first_then_gains_always_fit(cap: float) -> None:
    groups = [[0.1, 0.12, -0.02], [0.05, 0.07, 0.06]]
    trunc = [[0.02, -0.01, 0.03]] * 3
    scale, t_scale = fit_scales(groups, trunc, cap)
    assert _stored(groups, scale) + _stored(trunc, t_scale) <= cap
    assert t_scale <= scale <= 1.0
    # no truncation measured: only the groups are fitted
    assert fit_scales(groups, None, cap)[0] == scale


def _stage(stage: int, medians: list[float]) -> StageProfile:
    return StageProfile(
        stage=stage,
        rank=stage,
        groups=tuple(
            GroupProfile(
                name=f"g{i}",
                params=(f"p{i}",),
                numel=10,
                weight_grad_ms=_stat([m, m, m, m]),
            )
            for i, m in enumerate(medians)
        ),
    )


def test_a_stage_whose_group_costs_all_measured_zero_is_warned_about() -> None:
    # noise clips to 0 (`_stat`); one group above it is enough for the stage to count as measured
    stages = [_stage(0, [0.0, 0.02]), _stage(1, [-0.01, 0.0]), _stage(2, [])]
    (w,) = unmeasured_stages(stages)
    assert w.startswith("stage 1: every group's weight-gradient cost measured 0 ms")
    assert "4 rounds" in w and "raise cost_samples" in w
    assert unmeasured_stages(stages[:1]) == []
