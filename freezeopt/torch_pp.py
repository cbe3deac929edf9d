"""The one door to torch's private pipelining code (`torch.distributed.pipelining.schedules`).

freezeopt optimises what torch executes, so per-rank action orders come from torch's own schedule
classes, never from a re-implementation. torch's names (`_Action`, `_ComputationType`,
`pipeline_order`, `_step_microbatches`) are private and have changed between releases; nothing
else in freezeopt touches them.

Where torch's helpers are wrong we work around them here, with tests:

* For single-stage schedules (`GPipe`, `1F1B`) the `pipeline_order` attribute is only a
  description, and for `Schedule1F1B` it is wrong on the last rank in torch 2.13 (it skips
  microbatch 0 and invents microbatch M). `_schedule_visualizer.get_schedule_ops` inherits the
  error and also builds every rank's stage with `group_rank = 0`. We therefore *run* the
  schedule's own `_step_microbatches` loop on a recording stand-in stage, one per rank, and keep
  the order in which it calls forward/backward: that is exactly what executes.
* Multi-stage schedules execute `pipeline_order` as written (`_PipelineScheduleRuntime`), with
  `OVERLAP_F_B` actions running their sub-actions in order; we expand those.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from unittest import mock

from freezeopt.actions import Action, Kind
from freezeopt.errors import InputError

__all__ = [
    "SCHEDULE_NAMES",
    "V_SCHEDULES",
    "default_stages_per_rank",
    "schedule_actions",
    "torch_version",
]

SCHEDULE_NAMES: tuple[str, ...] = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
V_SCHEDULES = frozenset({"ZBVZeroBubble", "DualPipeV"})
_SINGLE = frozenset({"GPipe", "1F1B"})


def torch_version() -> str:
    """The installed torch version (imports torch)."""
    import torch

    return str(torch.__version__)


def default_stages_per_rank(schedule: str) -> int:
    """1 for single-stage schedules, 2 for the multi-stage ones."""
    return 1 if schedule in _SINGLE else 2


def schedule_actions(
    schedule: str, *, world_size: int, stages_per_rank: int, n_microbatches: int
) -> tuple[tuple[Action, ...], ...]:
    """Per rank, the compute actions torch executes for `schedule`, in order."""
    if schedule not in SCHEDULE_NAMES:
        raise InputError(
            f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULE_NAMES)} or a CSV file"
        )
    if world_size < 1 or n_microbatches < 1 or stages_per_rank < 1:
        raise InputError("ranks, stages per rank and microbatches must all be at least 1")
    if schedule in _SINGLE and stages_per_rank != 1:
        raise InputError(
            f"{schedule} runs one stage per rank; drop --stages-per-rank or set it to 1"
        )
    if schedule in V_SCHEDULES and stages_per_rank != 2:
        raise InputError(
            f"{schedule} needs exactly 2 stages per rank (a V shape); set --stages-per-rank 2"
        )
    if schedule not in _SINGLE and stages_per_rank < 2:
        raise InputError(f"{schedule} is a multi-stage schedule; use --stages-per-rank 2 or more")
    return _schedule_actions_cached(schedule, world_size, stages_per_rank, n_microbatches)


@lru_cache(maxsize=64)
def _schedule_actions_cached(
    schedule: str, world_size: int, stages_per_rank: int, n_microbatches: int
) -> tuple[tuple[Action, ...], ...]:
    try:
        if schedule in _SINGLE:
            return tuple(
                _record_single(schedule, rank, world_size, n_microbatches)
                for rank in range(world_size)
            )
        return _multi(schedule, world_size, stages_per_rank, n_microbatches)
    except InputError:
        raise
    except (ValueError, AssertionError, NotImplementedError) as e:  # torch rejects the shape
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(
            f"torch rejects {schedule} with {world_size} ranks, {stages_per_rank} stages per rank and "
            f"{n_microbatches} microbatches: {msg}"
        ) from None


def _kind(ctype: Any) -> Kind:
    from torch.distributed.pipelining.schedules import _ComputationType as C

    kinds: dict[Any, Kind] = {
        C.FORWARD: "F",
        C.FULL_BACKWARD: "B",
        C.BACKWARD_INPUT: "I",
        C.BACKWARD_WEIGHT: "W",
    }
    return kinds[ctype]


def _multi(
    schedule: str, world_size: int, stages_per_rank: int, n_microbatches: int
) -> tuple[tuple[Action, ...], ...]:
    from torch.distributed.pipelining.schedules import _ComputationType as C
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torch.distributed.pipelining.stage import PipelineStage

    n_stages = world_size * stages_per_rank
    stages = []
    for _ in range(stages_per_rank):
        st = mock.create_autospec(PipelineStage, instance=True)
        st.group_rank = 0  # every rank computes the whole pipeline_order; rank 0's view is enough
        st.group_size = world_size
        st.num_stages = n_stages
        st.submod = None
        stages.append(st)
    sched = get_schedule_class(schedule)(stages, n_microbatches)
    order = sched.pipeline_order
    compute = {C.FORWARD, C.FULL_BACKWARD, C.BACKWARD_INPUT, C.BACKWARD_WEIGHT}
    out: list[tuple[Action, ...]] = []
    for rank in range(world_size):
        acts: list[Action] = []
        for a in order[rank]:
            if a is None:
                continue
            subs = a.sub_actions if a.computation_type == C.OVERLAP_F_B else (a,)
            for s in subs or ():
                if s.computation_type in compute:
                    acts.append(
                        Action(s.stage_index, _kind(s.computation_type), s.microbatch_index)
                    )
        out.append(tuple(acts))
    return tuple(out)


def _record_single(
    schedule: str, rank: int, world_size: int, n_microbatches: int
) -> tuple[Action, ...]:
    """Run torch's own `_step_microbatches` for one rank on a stand-in stage and record its calls."""
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torch.distributed.pipelining.stage import PipelineStage

    log: list[Action] = []
    st = mock.create_autospec(PipelineStage, instance=True)
    st.stage_index = rank
    st.num_stages = world_size
    st.group_rank = rank
    st.group_size = world_size
    st.is_first = rank == 0
    st.is_last = rank == world_size - 1
    st.submod = None
    for name in ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops"):
        getattr(st, name).return_value = []
    st.forward_one_chunk.side_effect = lambda mb, *a, **k: log.append(Action(rank, "F", mb))

    def _bwd(mb: int, *a: Any, full_backward: bool = True, **k: Any) -> None:
        log.append(Action(rank, "B" if full_backward else "I", mb))

    st.backward_one_chunk.side_effect = _bwd
    st.backward_weight_one_chunk.side_effect = lambda mb, *a, **k: log.append(Action(rank, "W", mb))
    sched = get_schedule_class(schedule)(st, n_microbatches, loss_fn=lambda out, tgt: out)
    with (
        mock.patch.object(sched, "_initialize_stage", lambda *a, **k: None),
        mock.patch.object(sched, "_maybe_compute_loss", lambda *a, **k: None),
        mock.patch.object(sched, "_maybe_get_loss", lambda *a, **k: None),
        mock.patch.object(sched, "_update_losses", lambda *a, **k: None),
    ):
        mbs = [()] * n_microbatches
        sched._step_microbatches(mbs, [{}] * n_microbatches, [None] * n_microbatches, [])
    return tuple(log)
