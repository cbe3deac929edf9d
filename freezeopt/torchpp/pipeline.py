"""One rank's share of a job's pipeline: the plan, the model chunks, torch's stages, the optimizer.

Why a module of its own: `freezeopt profile` measures a job and `freezeopt train` trains it; both
must build exactly the same pipeline from a `Job` — same seed, same stage split, same parameter
groups, same stock `PipelineStage`s and optimizer — or the profile would describe another run
than the one the schedule is replayed in.

* `plan_pipeline(job)`: the pipeline shape the job implies (who runs which stage, in what order),
  from torch's own schedule classes or the job's CSV;
* `preflight(job, plan)`: build the model on the meta device (no memory) to catch a bad model
  function, or a stage split that does not fit, before any process starts; returns the groups
  (`preflight_model`: and their fingerprints, which `freezeopt train` holds to the schedule's);
* `build_rank_pipeline(job, plan, rank, device)`: on a rank, after `torch.manual_seed(job.seed)`,
  build every stage (so all ranks agree on the weights), keep this rank's, load a trained run's
  weights into them where the job says `init:` (`freezeopt.torchpp.weights`), resolve the parameter
  groups, wrap the stages in `PipelineStage`s and make the AdamW optimizer; `make_schedule` then
  builds torch's schedule object around a loss function of the caller's choosing;
* `RankPipeline.sync_tied_grads()`: for weights the model shares between stages
  (`ModelParts.tied`, e.g. tied input and output embeddings), sum the copies' gradients across
  the stages and ranks that hold them before the optimizer step, so the copies stay equal;
* `validation_loss`: the mean loss on the held-out batches as a plain forward pass, stage by stage
  across ranks (torch's `schedule.eval()` fails on V schedules in 2.13);
* `Clock`: action cost — thread CPU time on CPU, CUDA events on GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freezeopt.actions import Action
from freezeopt.errors import InputError
from freezeopt.formats.fingerprint import fingerprint
from freezeopt.torchpp.job import (
    DataParts,
    Job,
    ModelParts,
    resolve_data,
    resolve_groups,
    resolve_model,
)
from freezeopt.torchpp.weights import check_init, load_init

if TYPE_CHECKING:
    import torch

__all__ = [
    "Clock",
    "Fingerprints",
    "Groups",
    "ModelCheck",
    "PipelinePlan",
    "RankPipeline",
    "build_rank_pipeline",
    "check_parts",
    "device_name",
    "group_fingerprints",
    "make_schedule",
    "plan_pipeline",
    "preflight",
    "preflight_model",
    "probe_loss",
    "to_device",
    "validation_loss",
]

Groups = dict[int, tuple[tuple[str, tuple[str, ...]], ...]]
"""Per stage: ((group name, parameter names), ...) in model order."""
Fingerprints = dict[int, tuple[str, ...]]
"""Per stage: its groups' fingerprints (`freezeopt.formats.fingerprint`), in group order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    """The pipeline shape a job implies: who runs which stage, in what order."""

    label: str
    """The schedule's name in files: a torch schedule name or `csv:<file name>`."""
    rank_actions: tuple[tuple[Action, ...], ...]
    composites: tuple[tuple[tuple[Action, ...], ...], ...]
    """Per rank, the runs of its actions torch executes as one unit (`adapter.schedule_composites`)."""
    n_stages: int
    stage_rank: tuple[int, ...]
    csv_path: str | None

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages `rank` runs, in stage order."""
        return tuple(s for s in range(self.n_stages) if self.stage_rank[s] == rank)


def plan_pipeline(job: Job) -> PipelinePlan:
    """The job's pipeline shape; raise InputError when torch rejects it or a rank or stage is idle."""
    from freezeopt.torchpp import adapter as torch_pp

    if job.is_csv:
        acts = torch_pp.csv_schedule_actions(
            job.schedule, world_size=job.ranks, n_microbatches=job.microbatches
        )
        label, csv_path = f"csv:{Path(job.schedule).name}", job.schedule
        composites: tuple[tuple[tuple[Action, ...], ...], ...] = tuple(() for _ in acts)
    else:
        spr = job.stages_per_rank or torch_pp.default_stages_per_rank(job.schedule)
        shape = dict(world_size=job.ranks, stages_per_rank=spr, n_microbatches=job.microbatches)
        acts = torch_pp.schedule_actions(job.schedule, **shape)
        composites = torch_pp.schedule_composites(job.schedule, **shape)
        label, csv_path = job.schedule, None
    stage_rank: dict[int, int] = {}
    for r, row in enumerate(acts):
        for a in row:
            stage_rank.setdefault(a.stage, r)
    n_stages = max(stage_rank) + 1 if stage_rank else 0
    missing = [s for s in range(n_stages) if s not in stage_rank]
    if missing or n_stages == 0:
        raise InputError(
            f"schedule {label}: no rank runs stage {missing[0] if missing else 0}; every stage needs a rank"
        )
    idle = [r for r, row in enumerate(acts) if not row]
    if idle:
        raise InputError(
            f"schedule {label}: rank {idle[0]} runs no actions; use fewer ranks or give it stages"
        )
    if job.is_csv and job.stages_per_rank is not None:
        for r in range(job.ranks):
            k = sum(1 for s in stage_rank if stage_rank[s] == r)
            if k != job.stages_per_rank:
                raise InputError(
                    f"schedule CSV {Path(job.schedule).name} puts {k} stage(s) on rank {r}, but stages_per_rank is "
                    f"{job.stages_per_rank}; fix the CSV or drop stages_per_rank"
                )
    return PipelinePlan(
        label=label,
        rank_actions=tuple(tuple(r) for r in acts),
        composites=composites,
        n_stages=n_stages,
        stage_rank=tuple(stage_rank[s] for s in range(n_stages)),
        csv_path=csv_path,
    )


def preflight(job: Job, plan: PipelinePlan, *, in_torchrun: bool = False) -> Groups | None:
    """Catch a bad model function before any process starts (built on the meta device: no memory).

    Returns the parameter groups per stage, or None when the model function does not support the
    meta device (the ranks then check it for real).
    """
    checked = preflight_model(job, plan, in_torchrun=in_torchrun)
    return None if checked is None else checked.groups


@dataclass(frozen=True, slots=True)
class ModelCheck:
    """What `preflight_model` learnt of the model built on the meta device."""

    groups: Groups
    fingerprints: Fingerprints


def preflight_model(
    job: Job, plan: PipelinePlan, *, in_torchrun: bool = False
) -> ModelCheck | None:
    """`preflight`, returning the groups' fingerprints too (None where `preflight` returns None)."""
    import torch

    if job.device == "cuda":
        if not torch.cuda.is_available():
            raise InputError(
                "the job asks for device cuda, but torch sees no CUDA device; set device: cpu"
            )
        n_gpu = torch.cuda.device_count()
        if not in_torchrun and job.ranks > n_gpu:
            raise InputError(
                f"nccl needs one GPU per rank: the job has {job.ranks} ranks but torch sees {n_gpu} GPU(s); "
                f"set ranks to at most {n_gpu} (or run under torchrun across hosts)"
            )
    model_fn = resolve_model(job)
    resolve_data(job)
    try:
        with torch.device("meta"):
            parts = model_fn(n_stages=plan.n_stages, seq_len=job.seq_len, **job.model_args)
    except InputError:
        raise
    except TypeError as e:
        raise InputError(
            f"model {job.model!r}: calling it with n_stages, seq_len and model_args failed ({e}); "
            "check model_args against the function's parameters"
        ) from None
    except (
        Exception
    ):  # the function may not support the meta device; the ranks will check it for real
        return None
    groups = check_parts(job, plan, parts)
    check_init(job, dict(enumerate(parts.stages)))
    return ModelCheck(
        groups=groups,
        fingerprints={s: group_fingerprints(parts.stages[s], groups[s]) for s in groups},
    )


def group_fingerprints(
    module: Any, groups: tuple[tuple[str, tuple[str, ...]], ...]
) -> tuple[str, ...]:
    """The fingerprint of each of a stage module's `groups` ((name, parameter names), ...)."""
    named = dict(module.named_parameters())
    return tuple(fingerprint(named[n] for n in members) for _, members in groups)


def check_parts(job: Job, plan: PipelinePlan, parts: Any) -> Groups:
    """Check what the model function returned against the plan; return the groups per stage."""
    if not isinstance(parts, ModelParts):
        raise InputError(
            f"model {job.model!r} returned {type(parts).__name__}; return freezeopt.ModelParts"
        )
    if len(parts.stages) != plan.n_stages:
        raise InputError(
            f"model {job.model!r} returned {len(parts.stages)} stages, but schedule {plan.label} with {job.ranks} ranks "
            f"needs {plan.n_stages}; build n_stages stages"
        )
    if parts.groups is not None and len(parts.groups) != plan.n_stages:
        raise InputError(
            f"model {job.model!r} returned groups for {len(parts.groups)} stages; give one mapping per stage"
        )
    from freezeopt.torchpp.adapter import wrapped_by

    out = {}
    for s, mod in enumerate(parts.stages):
        wrapper = wrapped_by(mod)
        if wrapper is not None:
            raise InputError(
                f"stage {s} of model {job.model!r} is wrapped by {wrapper}: freezeopt's own jobs "
                "run pipeline parallelism only and shard nothing; return unwrapped stage modules"
            )
        names, child_of = _param_names(mod)
        if not names:
            raise InputError(
                f"stage {s} of model {job.model!r} has no trainable parameters; every stage needs some"
            )
        out[s] = resolve_groups(
            job, s, names, parts.groups[s] if parts.groups is not None else None, child_of
        )
    _check_ties(job, parts)
    return out


def _check_ties(job: Job, parts: ModelParts) -> None:
    """Each tied set: two or more distinct trainable parameters of equal shape, on known stages."""
    for t in parts.tied:
        members = list(t)
        if len(members) < 2 or len(set(members)) != len(members):
            raise InputError(
                f"model {job.model!r}: tied set {members} needs two or more distinct (stage, name) pairs"
            )
        shapes = set()
        for s, n in members:
            if not 0 <= s < len(parts.stages):
                raise InputError(f"model {job.model!r}: tied set names stage {s}, which it lacks")
            p = dict(parts.stages[s].named_parameters()).get(n)
            if p is None or not p.requires_grad:
                raise InputError(
                    f"model {job.model!r}: tied set names {n!r} of stage {s}, not a trainable parameter of it"
                )
            shapes.add(tuple(p.shape))
        if len(shapes) != 1:
            raise InputError(f"model {job.model!r}: tied set {members} joins different shapes")


def _param_names(mod: Any) -> tuple[list[str], dict[str, str]]:
    names = [n for n, p in mod.named_parameters() if p.requires_grad]
    children = {n for n, _ in mod.named_children()}
    child_of = {n: (n.split(".")[0] if n.split(".")[0] in children else "") for n in names}
    return names, child_of


# --- one rank's pipeline ------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class RankPipeline:
    """What one rank holds: its stage modules, their parameters and groups, torch's stages, AdamW."""

    job: Job
    plan: PipelinePlan
    rank: int
    device: Any
    stages: tuple[int, ...]
    """The stages this rank runs."""
    mods: dict[int, Any]
    """Stage index → stage module (on `device`)."""
    params: dict[int, list[Any]]
    """Stage index → trainable parameters in module order."""
    param_names: dict[int, list[str]]
    group_idx: dict[int, list[tuple[str, list[int]]]]
    """Stage index → (group name, positions in `params[s]`) in model order."""
    group_meta: list[tuple[int, str, tuple[str, ...], int, str]]
    """(stage, group, parameter names, numel, fingerprint) of every local group."""
    pstages: list[Any]
    """torch `PipelineStage`s, in stage order."""
    optimizer: Any
    loss_fn: Any
    data: DataParts
    ties: list[tuple[list[Any], Any]] = field(default_factory=list)
    """Per tied set with a copy on this rank: (this rank's copies, the process group of the
    ranks holding copies, or None when they all are on this rank)."""
    all_grouped: tuple[bool, ...] = ()
    """Per stage of the pipeline (every rank's): whether each of its trainable parameters is in
    one of its groups, so that with all its groups frozen it needs no gradient (backward
    truncation, `FreezeController.input_grad_needed`)."""

    def sync_tied_grads(self) -> None:
        """Give every copy of a tied weight the sum of the copies' gradients (None stays None
        where no copy has one), across the ranks holding copies; call it before the optimizer
        step, after any gradient scaling."""
        if not self.ties:
            return
        import torch
        import torch.distributed as dist

        for copies, pg in self.ties:
            grads = [p.grad for p in copies if p.grad is not None]
            total = torch.zeros_like(copies[0]) if not grads else grads[0].clone()
            for g in grads[1:]:
                total += g
            if pg is not None:
                have = torch.tensor([float(len(grads))], device=total.device)
                dist.all_reduce(have, group=pg)
                if float(have) == 0.0:
                    continue
                dist.all_reduce(total, group=pg)
            elif not grads:
                continue
            for p in copies:
                p.grad = total.clone() if p is not copies[-1] else total

    @property
    def has_first(self) -> bool:
        return 0 in self.stages

    @property
    def has_last(self) -> bool:
        return self.plan.n_stages - 1 in self.stages

    def group_params(self, stage: int) -> list[list[Any]]:
        """The parameters of each group of `stage`, in group order (for `enable_freezing`)."""
        ps = self.params[stage]
        return [[ps[i] for i in idx] for _, idx in self.group_idx[stage]]

    def step_inputs(
        self, x: Any, y: Any, losses: list[Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """`schedule.step` arguments for this rank: the batch on the first stage, target on the last."""
        args = (to_device(x, self.device),) if self.has_first else ()
        kwargs: dict[str, Any] = (
            {"target": to_device(y, self.device), "losses": losses} if self.has_last else {}
        )
        return args, kwargs


def build_rank_pipeline(job: Job, plan: PipelinePlan, rank: int, device: Any) -> RankPipeline:
    """Build `rank`'s stages, groups, `PipelineStage`s, AdamW and data (see the module docstring)."""
    import torch
    from torch.distributed.pipelining import PipelineStage

    torch.manual_seed(job.seed)
    parts = resolve_model(job)(n_stages=plan.n_stages, seq_len=job.seq_len, **job.model_args)
    groups = check_parts(job, plan, parts)
    data = resolve_data(job)(
        batch_size=job.batch_size, seq_len=job.seq_len, seed=job.seed, **job.data_args
    )
    my = plan.stages_of(rank)
    all_grouped = tuple(
        {n for _, names in groups[s] for n in names}
        >= {n for n, p in parts.stages[s].named_parameters() if p.requires_grad}
        for s in range(plan.n_stages)
    )
    mods = {s: parts.stages[s].to(device) for s in my}
    load_init(job, mods)  # fine-tuning: the weights of a trained run (`init:`)
    loss_fn, tied = parts.loss_fn, tuple(parts.tied)
    del parts
    params: dict[int, list[Any]] = {}
    names: dict[int, list[str]] = {}
    group_idx: dict[int, list[tuple[str, list[int]]]] = {}
    group_meta: list[tuple[int, str, tuple[str, ...], int, str]] = []
    for s in my:
        named = [(n, p) for n, p in mods[s].named_parameters() if p.requires_grad]
        params[s] = [p for _, p in named]
        names[s] = [n for n, _ in named]
        pos = {n: i for i, (n, _) in enumerate(named)}
        group_idx[s] = [(g, [pos[n] for n in members]) for g, members in groups[s]]
        for g, members in groups[s]:
            numel = sum(named[pos[n]][1].numel() for n in members)
            fp = fingerprint(named[pos[n]][1] for n in members)
            group_meta.append((s, g, tuple(members), int(numel), fp))
    ties = _rank_ties(tied, plan, rank, mods)
    pstages = [PipelineStage(mods[s], s, plan.n_stages, device) for s in my]
    all_params = [p for s in my for p in params[s]]
    opt = torch.optim.AdamW(all_params, lr=job.lr, weight_decay=job.weight_decay)
    return RankPipeline(
        job=job,
        plan=plan,
        rank=rank,
        device=device,
        stages=my,
        mods=mods,
        params=params,
        param_names=names,
        group_idx=group_idx,
        group_meta=group_meta,
        pstages=pstages,
        optimizer=opt,
        loss_fn=loss_fn,
        data=data,
        ties=ties,
        all_grouped=all_grouped,
    )


def _rank_ties(
    tied: Sequence[Sequence[tuple[int, str]]], plan: PipelinePlan, rank: int, mods: dict[int, Any]
) -> list[tuple[list[Any], Any]]:
    """This rank's share of the tied sets, with a process group per set spanning ranks. Every
    rank calls it with the same sets (all build the whole model), so the groups are made in the
    same order everywhere, as torch requires."""
    import torch.distributed as dist

    out: list[tuple[list[Any], Any]] = []
    for t in tied:
        ranks = sorted({plan.stage_rank[s] for s, _ in t})
        pg: Any = None
        if len(ranks) > 1:
            pg = dist.group.WORLD if len(ranks) == dist.get_world_size() else dist.new_group(ranks)
        if rank in ranks:
            copies = [dict(mods[s].named_parameters())[n] for s, n in t if s in mods]
            out.append((copies, pg))
    return out


def make_schedule(rp: RankPipeline, *, loss_fn: Any, scale_grads: bool) -> Any:
    """torch's schedule object for this rank's stages (the job's schedule name or CSV)."""
    from freezeopt.torchpp import adapter as torch_pp

    return torch_pp.build_schedule(
        rp.job.schedule,
        rp.pstages,
        n_microbatches=rp.job.microbatches,
        loss_fn=loss_fn,
        scale_grads=scale_grads,
        csv_path=rp.plan.csv_path,
    )


def validation_loss(rp: RankPipeline, beat: Any) -> float | None:
    """Mean loss on the held-out batches, on the last stage's rank (None elsewhere or with none)."""
    import torch
    import torch.distributed as dist

    job = rp.job
    if job.val_batches == 0:
        return None
    beat.set_phase("validation")
    sr = rp.plan.stage_rank
    last = rp.plan.n_stages - 1
    vals: list[float] = []
    for m in rp.mods.values():
        m.eval()
    try:
        with torch.no_grad():
            for i in range(job.val_batches):
                x, y = rp.data.val(i)
                act: tuple[Any, ...] = ()
                for s in rp.stages:
                    if s == 0:
                        inp: tuple[Any, ...] = (to_device(x, rp.device),)
                    elif sr[s - 1] == rp.rank:
                        inp = act
                    else:
                        box: list[Any] = [None]
                        dist.recv_object_list(box, src=sr[s - 1])
                        inp = tuple(to_device(t, rp.device) for t in box[0])
                    out = rp.mods[s](*inp)
                    if s == last:
                        vals.append(float(rp.loss_fn(out, to_device(y, rp.device))))
                        continue
                    act = out if isinstance(out, tuple) else (out,)
                    if sr[s + 1] != rp.rank:
                        dist.send_object_list(
                            [tuple(to_device(t, "cpu") for t in act)], dst=sr[s + 1]
                        )
                beat.tick()
    finally:
        for m in rp.mods.values():
            m.train()
    return sum(vals) / len(vals) if vals else None


def probe_loss(rp: RankPipeline, *, first: int, batches: int, grad: bool) -> float | None:
    """The mean loss on held-out batches `first`..`first + batches − 1` (the probe), as a plain
    pass stage by stage across ranks in eval mode; with `grad`, also its gradient, accumulated in
    this rank's parameters' `.grad` (the caller clears them before and after). Every rank must
    call it; the loss is known on the last stage's rank (None elsewhere)."""
    import torch
    import torch.distributed as dist

    sr = rp.plan.stage_rank
    last = rp.plan.n_stages - 1
    vals: list[float] = []
    for m in rp.mods.values():
        m.eval()
    try:
        with torch.set_grad_enabled(grad):
            for i in range(first, first + batches):
                x, y = rp.data.val(i)
                ins: dict[int, tuple[Any, ...]] = {}
                outs: dict[int, Any] = {}
                act: tuple[Any, ...] = ()
                for s in rp.stages:
                    if s == 0:
                        inp: tuple[Any, ...] = (to_device(x, rp.device),)
                    elif sr[s - 1] == rp.rank:
                        inp = tuple(_leaf(a, grad) for a in act)
                    else:
                        box: list[Any] = [None]
                        dist.recv_object_list(box, src=sr[s - 1])
                        inp = tuple(_leaf(to_device(t, rp.device), grad) for t in box[0])
                    ins[s] = inp
                    out = rp.mods[s](*inp)
                    if s == last:
                        loss = rp.loss_fn(out, to_device(y, rp.device)) / batches
                        vals.append(float(loss) * batches)
                        outs[s] = loss
                        continue
                    act = out if isinstance(out, tuple) else (out,)
                    outs[s] = act
                    if sr[s + 1] != rp.rank:
                        dist.send_object_list(
                            [tuple(to_device(_leaf(t, False), "cpu") for t in act)], dst=sr[s + 1]
                        )
                if not grad:
                    continue
                down: tuple[Any, ...] = ()
                for s in reversed(rp.stages):
                    if s == last:
                        torch.autograd.backward(outs[s])
                    else:
                        if sr[s + 1] != rp.rank:
                            box = [None]
                            dist.recv_object_list(box, src=sr[s + 1])
                            down = tuple(to_device(t, rp.device) for t in box[0])
                        pairs = [
                            (o, g) for o, g in zip(outs[s], down, strict=True) if g is not None
                        ]
                        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                    if s == 0:
                        continue
                    down = tuple(
                        a.grad if getattr(a, "requires_grad", False) else None for a in ins[s]
                    )
                    if sr[s - 1] != rp.rank:
                        dist.send_object_list(
                            [tuple(None if g is None else to_device(g, "cpu") for g in down)],
                            dst=sr[s - 1],
                        )
    finally:
        for m in rp.mods.values():
            m.train()
    return sum(vals) / len(vals) if vals else None


def _leaf(t: Any, grad: bool) -> Any:
    """`t` cut from its graph; a floating-point tensor requires grad when `grad` (others cannot)."""
    if not hasattr(t, "detach"):
        return t
    t = t.detach()
    return t.requires_grad_(True) if grad and t.is_floating_point() else t


# --- timing -------------------------------------------------------------------------------------


class Clock:
    """Cost timer: thread CPU time on CPU, CUDA events on GPU (resolved after a synchronize)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self) -> Any:
        """A token marking now."""
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.thread_time()

    def stop(self, tok: Any) -> Any:
        """The cost from `tok` to now (ms on CPU; an event pair on GPU, see `resolve`)."""
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return (tok, ev)
        return (time.thread_time() - tok) * 1e3

    def timed(self, run: Callable[[], Any]) -> tuple[Any, float, float, Any]:
        """`run()`'s result, its wall-clock start and end (`time.perf_counter`) and its cost (as
        `stop` gives it): how both profilers time an action."""
        c0 = self.start()
        t0 = time.perf_counter()
        out = run()
        t1 = time.perf_counter()
        return out, t0, t1, self.stop(c0)

    def extend(self, cost: Any, tok: Any) -> Any:
        """`cost` of an action, extended by the interval measured from `tok` (just after it) to now."""
        if self.cuda:
            return (cost[0], self.stop(tok)[1])
        return cost + self.stop(tok)

    def resolve(self, cost: Any) -> float:
        """A cost in ms (after `sync` on GPU)."""
        if self.cuda:
            return float(cost[0].elapsed_time(cost[1]))
        return float(cost)

    def sync(self) -> None:
        """Wait for the GPU (no-op on CPU)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def to_device(x: Any, device: Any) -> Any:
    """`x.to(device)` for tensors; anything else unchanged."""
    return x.to(device) if hasattr(x, "to") else x


def device_name(device: Any) -> str:
    """`cpu`, or `cuda:<GPU name>`."""
    if device.type == "cuda":
        import torch

        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"


def flat_groups(groups: Groups) -> Sequence[tuple[int, str]]:
    """Every (stage, group name), in stage then model order."""
    return [(s, g) for s in sorted(groups) for g, _ in groups[s]]
