"""The adapter returns what torch executes, for every schedule, and works around torch's 1F1B bug."""

from __future__ import annotations

import pytest

from freezeopt.actions import Action
from freezeopt.errors import InputError
from freezeopt.torchpp.adapter import SCHEDULE_NAMES, default_stages_per_rank, schedule_actions

SIZES = [(2, 4), (2, 8), (4, 8), (4, 12)]


@pytest.mark.parametrize("schedule", SCHEDULE_NAMES)
@pytest.mark.parametrize(("ranks", "mbs"), SIZES)
def test_every_action_exactly_once(schedule: str, ranks: int, mbs: int) -> None:
    spr = default_stages_per_rank(schedule)
    per_rank = schedule_actions(schedule, world_size=ranks, stages_per_rank=spr, n_microbatches=mbs)
    assert len(per_rank) == ranks
    flat = [a for r in per_rank for a in r]
    assert len(flat) == len(set(flat))
    n_stages = ranks * spr
    for s in range(n_stages):
        for m in range(mbs):
            assert Action(s, "F", m) in flat
            has_b = Action(s, "B", m) in flat
            has_iw = Action(s, "I", m) in flat and Action(s, "W", m) in flat
            assert has_b != has_iw, f"{schedule}: stage {s} mb {m} needs B or I+W"
    # a stage lives on one rank
    owner: dict[int, int] = {}
    for r, acts in enumerate(per_rank):
        for a in acts:
            assert owner.setdefault(a.stage, r) == r


def test_1f1b_last_rank_is_what_torch_executes() -> None:
    """torch's Schedule1F1B.pipeline_order skips 1F0 and invents 1F4 on the last rank (torch 2.13);
    its _step_microbatches runs F0 B0 F1 B1 … there. We record the latter."""
    last = schedule_actions("1F1B", world_size=2, stages_per_rank=1, n_microbatches=4)[1]
    assert [str(a) for a in last] == ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]
    first = schedule_actions("1F1B", world_size=2, stages_per_rank=1, n_microbatches=4)[0]
    assert [str(a) for a in first] == ["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"]


def test_torch_pipeline_order_bug_still_present_or_fixed() -> None:
    """Pins the torch behaviour the workaround exists for; if torch fixes it, this says so."""
    from unittest import mock

    from torch.distributed.pipelining.schedules import Schedule1F1B
    from torch.distributed.pipelining.stage import PipelineStage

    st = mock.create_autospec(PipelineStage, instance=True)
    st.num_stages = 2
    order = Schedule1F1B(st, 4).pipeline_order
    assert order is not None
    described = [str(a) for a in order[1] if a is not None and "REDUCE" not in str(a)]
    executed = [
        str(a)
        for a in schedule_actions("1F1B", world_size=2, stages_per_rank=1, n_microbatches=4)[1]
    ]
    assert described != executed, (
        "torch fixed Schedule1F1B.pipeline_order: the recording workaround may go"
    )


def test_dualpipev_overlaps_are_expanded() -> None:
    ranks = schedule_actions("DualPipeV", world_size=2, stages_per_rank=2, n_microbatches=4)
    kinds = {a.kind for r in ranks for a in r}
    assert kinds <= {"F", "B", "I", "W"}
    assert "B" in kinds and "W" in kinds


@pytest.mark.parametrize(
    ("schedule", "spr", "msg"),
    [
        ("Nope", 1, "unknown schedule"),
        ("1F1B", 2, "one stage per rank"),
        ("ZBVZeroBubble", 3, "exactly 2 stages"),
        ("Interleaved1F1B", 1, "multi-stage"),
    ],
)
def test_bad_shapes_are_input_errors(schedule: str, spr: int, msg: str) -> None:
    with pytest.raises(InputError, match=msg):
        schedule_actions(schedule, world_size=2, stages_per_rank=spr, n_microbatches=4)


def test_torch_rejections_become_input_errors() -> None:
    with pytest.raises(InputError, match="torch rejects"):
        schedule_actions("1F1B", world_size=4, stages_per_rank=1, n_microbatches=2)
