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
  `OVERLAP_F_B` actions running their sub-actions in order; we expand those and keep each such
  composite as a run of actions (`schedule_composites`): torch's send/recv lowering
  (`_add_send_recv`) issues a composite's sends only after all of it, so its forward's output
  leaves at the end of its backward. tests/torchpp/test_torch_timing.py holds the DAG's timing to
  torch's runtime run on stand-in stages in virtual time, for every schedule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any
from unittest import mock

from freezeopt.actions import Action, Kind
from freezeopt.errors import InputError
from freezeopt.fileio import read_text_file

__all__ = [
    "CSV_MAX_BYTES",
    "SCHEDULE_NAMES",
    "V_SCHEDULES",
    "default_stages_per_rank",
    "enable_freezing",
    "scale_group_grads",
    "schedule_actions",
    "schedule_composites",
    "schedule_microbatches",
    "schedule_stages",
    "torch_version",
    "wrap_schedule_loss",
    "wrapped_by",
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
CSV_MAX_BYTES = 16 * 2**20
"""A schedule CSV lists each rank's actions once: 64 ranks × 256 microbatches is under 1 MiB."""
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
    return _checked(schedule, world_size, stages_per_rank, n_microbatches)[0]


def schedule_composites(
    schedule: str, *, world_size: int, stages_per_rank: int, n_microbatches: int
) -> tuple[tuple[tuple[Action, ...], ...], ...]:
    """Per rank, the runs of its actions that torch executes as one unit (`OVERLAP_F_B`), in order.

    Each run is consecutive in `schedule_actions`' order; torch sends the run's outputs to other
    ranks only after its last action. Empty for every schedule but DualPipeV (torch 2.13).
    """
    return _checked(schedule, world_size, stages_per_rank, n_microbatches)[1]


_Order = tuple[tuple[tuple[Action, ...], ...], tuple[tuple[tuple[Action, ...], ...], ...]]


def _checked(schedule: str, world_size: int, stages_per_rank: int, n_microbatches: int) -> _Order:
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
    return _order_cached(schedule, world_size, stages_per_rank, n_microbatches)


@lru_cache(maxsize=64)
def _order_cached(
    schedule: str, world_size: int, stages_per_rank: int, n_microbatches: int
) -> _Order:
    try:
        if schedule in _SINGLE:
            acts = tuple(
                _record_single(schedule, rank, world_size, n_microbatches)
                for rank in range(world_size)
            )
            return acts, tuple(() for _ in acts)
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


def _multi(schedule: str, world_size: int, stages_per_rank: int, n_microbatches: int) -> _Order:
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
    runs: list[tuple[tuple[Action, ...], ...]] = []
    for rank in range(world_size):
        acts: list[Action] = []
        mine: list[tuple[Action, ...]] = []
        for a in order[rank]:
            if a is None:
                continue
            subs = a.sub_actions if a.computation_type == C.OVERLAP_F_B else (a,)
            run = tuple(
                Action(s.stage_index, _kind(s.computation_type), s.microbatch_index)
                for s in subs or ()
                if s.computation_type in compute
            )
            acts.extend(run)
            if a.computation_type == C.OVERLAP_F_B and len(run) > 1:
                mine.append(run)
        out.append(tuple(acts))
        runs.append(tuple(mine))
    return tuple(out), tuple(runs)


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


# --- Running a schedule (used by `freezeopt.profiling.run`) -------------------------------------------
#
# The profiler needs three more things from torch's private code, kept here with the rest:
# building a schedule object for a rank (a `_PipelineScheduleRuntime` loaded from CSV for custom
# orders), checking a CSV order the way torch will (`_validate_schedule` and the send/recv
# lowering, which is where a deadlocking order fails), and routing a stage's compute methods
# (`forward_one_chunk`, `backward_one_chunk`, `backward_weight_one_chunk`) through a timer.
#
# torch 2.13 facts these rely on (each covered by tests/profiling/test_run.py):
# * in split-backward schedules stage 0's `backward_one_chunk(full_backward=False)` computes
#   nothing and its `backward_weight_one_chunk` runs the whole backward (I ≈ 0, W ≈ B);
# * `_PipelineScheduleRuntime` runs OVERLAP_F_B sub-actions in order through the same methods;
# * `schedule.eval()` fails on V schedules (ZBVZeroBubble, DualPipeV: "can't steal_bwd_input if
#   this stage doesn't have backward"), so validation forwards are run outside the schedule.


def csv_schedule_actions(
    path: str, *, world_size: int, n_microbatches: int
) -> tuple[tuple[Action, ...], ...]:
    """Per-rank compute actions of a CSV schedule, checked the way torch will check it at run time.

    Raises InputError (one line) when the rows do not match `world_size`, when torch's own
    validation rejects the order, or when its send/recv lowering finds the order deadlocks.
    """
    import csv

    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule
    from torch.distributed.pipelining.schedules import _ComputationType as C

    text = read_text_file(
        Path(path),
        what="schedule CSV",
        limit=CSV_MAX_BYTES,
        missing_hint="give a path relative to the job file",
    )
    rows = [[c.strip() for c in row if c.strip()] for row in csv.reader(text.splitlines())]
    if len(rows) != world_size:
        raise InputError(
            f"schedule CSV {path} has {len(rows)} rows but the job has {world_size} ranks; write one row per rank"
        )
    try:
        order = {r: [_Action.from_str(c) for c in row] for r, row in enumerate(rows)}
    except (ValueError, RuntimeError, AssertionError) as e:
        raise InputError(
            f"schedule CSV {path}: {str(e).splitlines()[0]}; write actions like 0F0,0B0 or 1I2,1W2"
        ) from None
    compute = {C.FORWARD, C.FULL_BACKWARD, C.BACKWARD_INPUT, C.BACKWARD_WEIGHT}
    out: list[tuple[Action, ...]] = []
    for r in range(world_size):
        acts = []
        for a in order[r]:
            if a.computation_type not in compute or a.microbatch_index is None:
                raise InputError(
                    f"schedule CSV {path}, row {r + 1}: {a} is not a compute action; list only F, B, I and W actions"
                )
            acts.append(Action(a.stage_index, _kind(a.computation_type), a.microbatch_index))
        out.append(tuple(acts))
    n_stages = 1 + max((a.stage for acts in out for a in acts), default=-1)
    try:
        stage_to_rank = _validate_schedule(dict(order), world_size, n_stages, n_microbatches)
        _add_send_recv(
            {r: list(v) for r, v in order.items()},
            stage_to_rank=lambda s: stage_to_rank[s],
            num_stages=n_stages,
        )
    except (AssertionError, ValueError, KeyError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Malformed compute schedule" in msg:
            msg = (
                "the order deadlocks (a rank waits for an action that comes later on another rank)"
            )
        raise InputError(
            f"torch rejects schedule CSV {path} ({world_size} ranks, {n_microbatches} microbatches): {msg}"
        ) from None
    return tuple(out)


def build_schedule(
    schedule: str,
    stages: list[Any],
    *,
    n_microbatches: int,
    loss_fn: Any,
    scale_grads: bool,
    csv_path: str | None = None,
) -> Any:
    """torch's schedule object for one rank's `stages` (PipelineStage objects, in stage order).

    `schedule` is a torch schedule name; with `csv_path` it is ignored and a
    `_PipelineScheduleRuntime` runs the CSV's order (torch inserts the sends and receives).
    """
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime, get_schedule_class

    if csv_path is not None:
        rt = _PipelineScheduleRuntime(
            stages, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads
        )
        rt._load_csv(csv_path)
        return rt
    cls = get_schedule_class(schedule)
    if schedule in _SINGLE:
        if len(stages) != 1:
            raise InputError(f"{schedule} runs one stage per rank; set stages_per_rank to 1")
        return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
    return cls(stages, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads)


def instrument_stage(stage: Any, around: Any) -> None:
    """Route `stage`'s compute calls through `around(kind, microbatch, run)`, which must call `run()`.

    `kind` is `F` (forward_one_chunk), `B` or `I` (backward_one_chunk with full_backward True or
    False) or `W` (backward_weight_one_chunk). Patches the instance only; the class is untouched.
    """
    import inspect

    for meth in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        orig = getattr(stage, meth)
        sig = inspect.signature(orig)

        def wrapped(
            *args: Any, _orig: Any = orig, _meth: str = meth, _sig: Any = sig, **kwargs: Any
        ) -> Any:
            bound = _sig.bind(*args, **kwargs)
            mb = int(bound.arguments[next(iter(_sig.parameters))])
            if _meth == "forward_one_chunk":
                kind: Kind = "F"
            elif _meth == "backward_weight_one_chunk":
                kind = "W"
            else:
                kind = "B" if bound.arguments.get("full_backward", True) else "I"
            return around(kind, mb, lambda: _orig(*args, **kwargs))

        setattr(stage, meth, wrapped)


def split_backward(
    outputs: list[Any], output_grads: list[Any] | None, inputs: list[Any], params: list[Any]
) -> Any:
    """Run torch's backward-input step (`I`) on a fresh graph; return `weight(active)`, its `W` step.

    `weight(active)` runs torch's `stage_backward_weight` for `params[i]`, i in `active`, only —
    the way a runtime skips frozen groups in `W` (torch's own parameter groups, restricted to the
    active parameters; empty groups dropped, as `autograd.grad` rejects empty inputs). Call it once.
    Gradients accumulate into `.grad` as in the pipeline.
    """
    from torch.distributed.pipelining._backward import (
        _get_grad_fn_or_grad_acc,
        stage_backward_input,
        stage_backward_weight,
    )

    _, groups = stage_backward_input(outputs, output_grads, inputs, iter(params))
    nodes = [_get_grad_fn_or_grad_acc(p) for p in params]

    def weight(active: Any) -> None:
        keep = {nodes[i] for i in active}
        restricted = []
        for g in groups:
            sub = dict(g)
            sub["params"] = {n for n in g["params"] if n in keep}
            if sub["params"]:
                restricted.append(sub)
        if restricted:
            stage_backward_weight(iter(params), restricted)

    return weight


# --- Skipping frozen groups' weight-gradient work (used by `freezeopt.training.train`) -------------------
#
# A stock `PipelineStage` computes every parameter's gradient in each backward. To freeze parameter
# groups per microbatch we patch one stage instance (the class is untouched; no vendored fork):
# `backward_one_chunk` / `backward_weight_one_chunk` record which microbatch runs, and
# `backward_maybe_with_nosync` — the single place torch 2.13 dispatches every backward — restricts
# the work to the active parameters:
# * "full" (B, and stage 0's W in split schedules): `autograd.backward(..., inputs=stage inputs +
#   active params)`, so frozen params' dW kernels never run (toggling `requires_grad` after the
#   forward saves nothing: AccumulateGrad drops the result but the GEMMs still run); where the
#   stage before is frozen whole in the microbatch, without the stage inputs (truncation: autograd
#   stops below the lowest active parameter) and zeros sent down;
# * "input" (I): torch's `stage_backward_input` with only the active params as weights, so the
#   parameter groups handed to W hold only active params and W skips the frozen ones. The frozen set
#   of a microbatch's W is thereby the one its I saw;
# * "weight" (W): torch's own path, over those restricted groups.
# DDP/FSDP-wrapped stage modules are not supported (their no_sync/reshard hooks are bypassed).


def schedule_stages(schedule: Any) -> list[Any]:
    """The `PipelineStage`s a built torch schedule runs on this rank, in its order (a schedule
    built by someone else, e.g. torchtitan's trainer)."""
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stages = [schedule._stage]
    return list(stages)


def schedule_microbatches(schedule: Any) -> int:
    """The number of microbatches a built torch schedule splits each step into."""
    return int(schedule._n_microbatches)


def wrap_schedule_loss(
    schedule: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    """Replace the loss function a built torch schedule calls on the last stage with
    `wrap(loss_fn)` (torch reads it at each call: `_PipelineSchedule._compute_loss`)."""
    schedule._loss_fn = wrap(schedule._loss_fn)


def wrapped_by(module: Any) -> str | None:
    """The data-parallel wrapper on `module` or one of its submodules — FSDP2 (`fully_shard`),
    FSDP or DDP — or None. `enable_freezing` handles FSDP2 exactly and refuses
    the other two; freezeopt's own jobs take unwrapped stages only."""
    import torch

    kinds: list[tuple[type, str]] = [(torch.nn.parallel.DistributedDataParallel, "DDP")]
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        kinds += [(FSDPModule, FSDP2), (FullyShardedDataParallel, "FSDP")]
    except ImportError:  # a torch built without distributed
        pass
    for m in module.modules():
        for cls, name in kinds:
            if isinstance(m, cls):
                return name
    return None


FSDP2 = "FSDP2 (fully_shard)"


def _fsdp_index(module: Any) -> dict[int, Any]:
    """Every form of each FSDP2 parameter in `module` — the registered sharded parameter, the
    unsharded copy forward and backward run on, the sharded copy kept after forward — by `id`, to
    its `FSDPParam`; empty without FSDP2."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError:  # a torch built without distributed
        return {}
    out: dict[int, Any] = {}
    for m in module.modules():
        if not isinstance(m, FSDPModule):
            continue
        state = fully_shard.state(m)  # type: ignore[attr-defined]
        if state is None:  # torch's replicate(), an FSDPModule of another kind
            raise InputError(
                f"{type(m).__name__} is wrapped by torch's replicate(): freezing cannot skip "
                "weight gradients exactly there; shard it with fully_shard instead"
            )
        for group in state._fsdp_param_groups:
            for fp in group.fsdp_params:
                for t in (
                    fp.sharded_param,
                    getattr(fp, "_unsharded_param", None),
                    getattr(fp, "_sharded_post_forward_param", None),
                ):
                    if t is not None:
                        out[id(t)] = fp
    return out


def enable_freezing(
    stage: Any,
    groups: Sequence[Sequence[Any]],
    frozen: Callable[[int, int], frozenset[int]],
    input_grad: Callable[[int, int], bool] | None = None,
) -> None:
    """Make `stage` skip the weight gradients of `groups[g]` for g in `frozen(stage_index, mb)`.

    `groups` are lists of the stage module's parameters; parameters in no group are never frozen.
    With `frozen` returning an empty set the stage runs torch's own code paths unchanged. With
    `input_grad` (e.g. `FreezeController.input_grad_needed`) returning False for a microbatch,
    a stage whose backward runs whole (`B`, or stage 0's `W`) truncates it: no gradient for its
    input (the stage before is frozen whole there; it is sent zeros, as torch must send a tensor),
    so autograd stops below the first group still trained. Under FSDP2 (`fully_shard`, any
    shard degree) `groups` hold the module's registered (sharded) parameters; the restricted
    backward names their unsharded copies, so trainable groups get exactly the unfrozen run's
    gradients once FSDP2 reduces them and frozen ones none. A stage wrapped by FSDP (version 1)
    or DDP is refused (`wrapped_by`). When `frozen` is a
    `FreezeController`'s `frozen_groups`, the controller first holds `groups` to its schedule
    (`FreezeController.check_groups`: the groups' fingerprints, so a schedule solved for another
    model is refused with a MismatchError).
    """
    import torch
    from torch.distributed.pipelining._backward import stage_backward_input

    wrapper = wrapped_by(stage.submod)
    if wrapper is not None and wrapper != FSDP2:
        raise InputError(
            f"stage {stage.stage_index}'s module is wrapped by {wrapper}: freezing cannot skip "
            "weight gradients exactly there (the wrapper reduces the stage's gradients in hooks "
            "of its own); wrap it with FSDP2 (fully_shard) instead, or leave it unwrapped"
        )
    # the controller's own check, looked up by name: this layer does not import training's
    check = getattr(getattr(frozen, "__self__", None), "check_groups", None)
    if getattr(frozen, "__name__", None) == "frozen_groups" and callable(check):
        check(stage.stage_index, groups)

    current: dict[str, int] = {}
    # FSDP2 (`fully_shard`) registers sharded DTensor parameters; forward runs on an unsharded
    # copy of each (a persistent `nn.Parameter` it all-gathers into), and the backward's gradients
    # land there before FSDP2 reduce-scatters them into the sharded parameters' `.grad`. A
    # backward restricted to some parameters must name the unsharded copies. Each FSDP2
    # parameter, whatever form it has, is keyed by its `FSDPParam` (which lives as long as the
    # module); without FSDP2 every parameter is its own key and its own graph tensor.
    index = _fsdp_index(stage.submod)

    def key(p: Any) -> int:
        fp = index.get(id(p))
        return id(p) if fp is None else id(fp)

    def graph(p: Any) -> Any:
        """The tensor autograd accumulates `p`'s gradient into, or None for an FSDP2 parameter
        never all-gathered (in no graph yet)."""
        fp = index.get(id(p))
        return p if fp is None else getattr(fp, "_unsharded_param", None)

    grouped = {key(p) for g in groups for p in g}
    always = [p for p in stage.submod.parameters() if p.requires_grad and key(p) not in grouped]
    sharded = False  # torch's dispatch sets FSDP2's flags only on a stage module sharded whole
    if wrapper == FSDP2:
        from torch.distributed.fsdp import FSDPModule

        sharded = isinstance(stage.submod, FSDPModule)
    orig_b, orig_w = stage.backward_one_chunk, stage.backward_weight_one_chunk
    orig_dispatch = stage.backward_maybe_with_nosync

    # functools.wraps keeps torch's signatures visible (inspect.signature follows __wrapped__), so
    # a timer wrapped around these (`instrument_stage`) still tells I from B by `full_backward`.
    @functools.wraps(orig_b)
    def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        current["mb"] = bwd_chunk_id
        return orig_b(bwd_chunk_id, *args, **kwargs)

    @functools.wraps(orig_w)
    def backward_weight_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        current["mb"] = bwd_chunk_id
        return orig_w(bwd_chunk_id, *args, **kwargs)

    def dispatch(
        backward_type: str, bwd_kwargs: dict[str, Any], last_backward: bool = False
    ) -> Any:
        off = frozen(stage.stage_index, current["mb"]) if backward_type != "weight" else frozenset()
        cut = (
            backward_type == "full"
            and input_grad is not None
            and not input_grad(stage.stage_index, current["mb"])
        )
        if not off and not cut:
            return orig_dispatch(backward_type, bwd_kwargs, last_backward=last_backward)
        if sharded:
            # as torch's own dispatch does: accumulate unsharded, reduce once after the last
            # backward (`perform_reduce_grad`); left at their defaults, FSDP2 would reduce-scatter
            # and reshard after this microbatch alone
            stage.submod.set_is_last_backward(False)
            stage.submod.set_reshard_after_backward(False)
            stage.submod.set_requires_gradient_sync(False)
        trained = always + [p for i, g in enumerate(groups) if i not in off for p in g]
        active = [t for t in map(graph, trained) if t is not None]
        if backward_type == "input":
            return stage_backward_input(
                bwd_kwargs["stage_output"],
                bwd_kwargs["output_grads"],
                bwd_kwargs["input_values"],
                iter(active),
            )
        outs, grads = _tensors_with_grads(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"])
        inputs = [
            v
            for v in bwd_kwargs["input_values"]
            if isinstance(v, torch.Tensor) and v.requires_grad and not cut
        ]
        if outs and (inputs or active):
            torch.autograd.backward(outs, grad_tensors=grads, inputs=inputs + active)
        grad_inputs: list[Any] = []
        for v in bwd_kwargs["input_values"]:  # as torch's stage_backward returns them
            if isinstance(v, torch.Tensor):
                if cut and v.requires_grad:  # the stage before skips this microbatch's backward
                    grad_inputs.append(torch.zeros_like(v))
                else:
                    grad_inputs.append(v.grad)
                v.grad = None
            else:
                grad_inputs.append(None)
        return tuple(grad_inputs), None

    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk
    stage.backward_maybe_with_nosync = dispatch


def _tensors_with_grads(output: Any, grad: Any) -> tuple[list[Any], list[Any]]:
    """Flatten (output, gradient) pairs the way torch's `stage_backward` does."""
    import torch

    outs: list[Any] = []
    grads: list[Any] = []

    def walk(o: Any, g: Any) -> None:
        if isinstance(o, torch.Tensor):
            if o.requires_grad or o.grad_fn is not None:
                outs.append(o)
                grads.append(g)
        elif isinstance(o, tuple | list) and g is not None:
            for oo, gg in zip(o, g, strict=True):
                walk(oo, gg)
        elif isinstance(o, dict) and g is not None:
            for k in o:
                walk(o[k], g[k])

    walk(output, grad)
    return outs, grads


def scale_group_grads(groups: Sequence[Sequence[Any]], scales: dict[int, float | None]) -> None:
    """Multiply group g's accumulated gradients by `scales[g]`; `None` leaves them `None` (frozen in all)."""
    for g, factor in scales.items():
        for p in groups[g]:
            if factor is None:
                p.grad = None
            elif p.grad is not None:
                p.grad.mul_(factor)
