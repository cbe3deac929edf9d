"""One rank of `freezeopt train`: a pipelined training loop that replays a schedule and watches it.

Why a module of its own: this is the code that runs inside each rank process (`freezeopt.torchpp.launch`
starts it); `freezeopt.training.train` is the parent side (checks, report). Per optimizer step:

1. `controller.begin_step(step)`; at a phase boundary into freezing (after warm-up, a full-update
   window or a fallback) a checkpoint of the state *before* the step is taken first: weights fresh
   from full updates, the target of a rollback;
2. `zero_grad(set_to_none=True)` (a group frozen in every microbatch keeps `grad = None`, so AdamW
   skips it: no momentum or weight-decay drift), barrier, `schedule.step` — the backward of each
   microbatch skips the frozen groups' weight-gradient work (`torch_pp.enable_freezing`) — and the
   step's wall time, first rank's start to last rank's end, as the profiler measures it;
3. `scale_group_grads` with `controller.grad_scales` (M/(M−k) for a group frozen in k of M);
   then tied weights' copies get the sum of their gradients (`RankPipeline.sync_tied_grads`);
4. the loss (last stage), every group's gradient norm and the step time are all-reduced so every
   rank's controller sees identical inputs and takes identical decisions (`end_step`);
5. `optimizer.step()` — skipped when the loss or a gradient is non-finite — then, on drift with
   rollback, the model and optimizer are restored from the last checkpoint and the controller takes
   back the checkpoint's loss trend (`rollback_to`) but keeps its fallback window; training
   continues with the next step's data (replaying the same batches could replay the same fault).

Each stage's compute calls are timed (`torch_pp.instrument_stage`: wall start/end and thread-CPU or
CUDA-event cost), classified as freezing or full-update steps; the last 16 of each kind keep their
full per-action timeline for the measured Gantt. Rank 0 appends events and per-step scalars to
`events.jsonl` and `metrics.jsonl` as they happen (and to TensorBoard when installed).

Online re-planning (`TrainSpec.replan`; the steps are `freezeopt.training.online`, the solve
`freezeopt.training.replan`): every measured step adds each action's
full-cost estimate (its measured cost plus the profile's cost of the groups it skipped) to a
window. When a re-plan is due — after every `every`-th step, or when the step-time drift rule
fires with `on_drift` — and none is in flight, the ranks all-gather their windows' medians and rank
0 solves in a background process (`freezeopt.training.replan_worker`: a thread would hold the GIL the
training loop needs) while training continues. Rank 0 folds "solve finished" into the
step's all-reduce, so every rank learns it after the same step; they then receive the outcome by
`broadcast_object_list` and switch to the new plan from the next step together. The plan version
goes through the same all-reduce as the phase: ranks that disagree raise. Rank 0 writes the new
plan to `replans/step-NNNNNNNN.yaml` (the first step it runs) and a `replan` event (or
`replan_rejected` when it is the same plan or predicted slower, `replan_failed` when the solve failed); a
re-plan still solving when the last step ends is waited for and reported at that step. The
active plan is part of every checkpoint, so a resume continues with it.

Adaptive freezing (`ReplanSpec.costs`, `freezeopt train --adaptive`): in the full-update steps
of warm-up and of each full-update window (by the schedule's cadence, whatever the current plan
freezes), every rank measures each of its groups' share of the held-out probe loss's change
(`freezeopt.profiling.loss_cost.LcaTracker`: the probe loss and its gradient before the last
`LCA_STEPS` steps of the window and after them, a plain pass stage by stage; one trapezoid over
the stretch); at the window's last step the ranks all-gather the shares and rank 0 starts a time-to-quality re-plan from them (reason `costs`), adopted
as any re-plan is. The probe passes' wall time is each step's `probe_ms` in `metrics.jsonl`, part
of the run's time (`freezeopt compare` adds it to the step's).

Test-only faults (`freezeopt.torchpp.faults`) hook in at the batch, the learning rate and each action.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from freezeopt.errors import MismatchError
from freezeopt.formats.schedule import Schedule, parse_schedule
from freezeopt.torchpp import checkpoint as ckpt
from freezeopt.torchpp.faults import Fault, corrupt, damage_file
from freezeopt.torchpp.job import Job
from freezeopt.torchpp.launch import RankContext
from freezeopt.torchpp.pipeline import (
    Clock,
    PipelinePlan,
    build_rank_pipeline,
    device_name,
    make_schedule,
    validation_loss,
)
from freezeopt.training.online import OnlinePlanning
from freezeopt.training.options import TrainOptions
from freezeopt.training.replan import ReplanSpec
from freezeopt.training.runlog import RunLog

__all__ = ["RankTrainResult", "TrainSpec", "train_rank"]

_PHASES = ("full", "warmup", "freeze", "full_window", "fallback")
TIMELINES_KEPT = 16
"""Per class (freezing, full-update): how many recent steps keep their whole action timeline."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainSpec:
    """Everything a rank needs to train (picklable)."""

    job: Job
    plan: PipelinePlan
    schedule: Schedule | None
    """The schedule replayed, its phases overridden as the options say."""
    options: TrainOptions
    """What the run was asked (`steps`: train until this step, exclusive; a resumed run starts at
    its checkpoint's step)."""
    resume_from: str | None = None
    resume_skipped: tuple[dict[str, str], ...] = ()
    """Newer checkpoints the resume passed over as corrupted (logged as events)."""
    measure_from: int = 0
    """Steps before this one are left out of timing statistics (torch's one-time setup)."""
    faults: tuple[Fault, ...] = ()
    replan: ReplanSpec | None = None
    """Online re-planning (None: off)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Written into every checkpoint's meta.json (what a resume must match)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTrainResult:
    """What one rank returns to the parent (plain picklable data)."""

    rank: int
    host: str
    device: str
    stages: tuple[int, ...]
    start_step: int
    steps: tuple[dict[str, Any], ...]
    """Per step run: step, phase, loss, step_ms, optimizer_ms (this rank), drift rules fired; with
    re-planning on, `plan`: the plan version (0: the schedule file, +1 per adopted re-plan)."""
    costs: dict[str, dict[str, tuple[float, ...]]]
    """Action → {"freeze": cost samples, "full": cost samples} (ms, measured steps only)."""
    timelines: dict[str, tuple[Any, ...]]
    """"freeze"/"full" → recent steps: (step, step ms, ((action, start ms, end ms, cost ms), ...),
    {action: what it skipped})."""
    frozen_plan: dict[str, tuple[str, ...]]
    """Weight-gradient action → what it skips in freezing steps (of the last plan drawn)."""
    val_loss: tuple[tuple[int, float], ...]
    events: tuple[dict[str, Any], ...]
    checkpoints: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def train_rank(spec: TrainSpec, ctx: RankContext) -> RankTrainResult:
    """What every rank runs (through `freezeopt.torchpp.launch.run_ranks`)."""
    return _Trainer(spec, ctx).run()


class _Trainer(OnlinePlanning):
    def __init__(self, spec: TrainSpec, ctx: RankContext) -> None:
        self.spec, self.job, self.plan = spec, spec.job, spec.plan
        self.rank, self.world, self.device, self.beat = ctx.rank, ctx.world, ctx.device, ctx.beat
        self.clock = Clock(ctx.device)
        self.out = Path(spec.options.out_dir)
        self.ckdir = self.out / "checkpoints"
        self.last = self.plan.n_stages - 1
        self.step_idx = -1
        self.records: list[list[Any]] = []
        self.pending_loss: list[Any] | None = None
        self.log = RunLog(self.out, writes=ctx.rank == 0)
        self.checkpoints: list[str] = []
        self.last_ckpt: str | None = spec.resume_from
        self.warnings: list[str] = []
        self.faults = list(spec.faults)
        self.units: dict[int, list[list[Any]]] = {}
        """Stage → the parameters of each freezing unit (groups, or single tensors)."""
        rs = spec.replan if spec.replan is not None and spec.replan.enabled else None
        self.replan_spec = rs if spec.schedule is not None else None
        self.init_online()

    # -- setup --------------------------------------------------------------------------------
    def setup(self) -> None:
        import torch.distributed as dist

        from freezeopt.torchpp import adapter as torch_pp
        from freezeopt.training.runtime import FreezeController

        self.beat.set_phase("setup")
        # a resume overwrites the weights with its checkpoint's: the `init` ones are not read
        job = self.job if self.spec.resume_from is None else replace(self.job, init=None)
        rp = self.rp = build_rank_pipeline(job, self.plan, self.rank, self.device)
        sched = self.spec.schedule
        self.ctrl: FreezeController | None = None
        if sched is not None:
            for s in rp.stages:
                have = tuple(g for g, _ in rp.group_idx[s])
                if have != tuple(sched.pipeline.groups[s]):
                    raise MismatchError(
                        f"the schedule does not fit this job: stage {s} has groups {', '.join(have)} in the job "
                        f"but {', '.join(sched.pipeline.groups[s])} in the schedule; re-profile and re-solve for this job"
                    )
            self.ctrl = FreezeController(
                sched,
                stages=rp.stages,
                rescale=self.spec.options.rescale,
                rollback=self.spec.options.checkpoints.rollback,
                tensors={s: [len(idx) for _, idx in rp.group_idx[s]] for s in rp.stages},
                replan_on_drift=self.replan_spec is not None and self.replan_spec.on_drift,
                all_grouped=rp.all_grouped,
            )
            for s in rp.stages:
                groups = rp.group_params(s)
                self.units[s] = (
                    groups if self.ctrl.unit == "group" else [[p] for g in groups for p in g]
                )
                # the real parameters (the parent checked the meta-device model, where it builds)
                self.ctrl.check_groups(s, groups)
            for st in rp.pstages:
                torch_pp.enable_freezing(
                    st, self.units[st.stage_index], self._frozen, self.ctrl.input_grad_needed
                )
        self.sched = make_schedule(rp, loss_fn=self._loss, scale_grads=True)
        for st in rp.pstages:
            torch_pp.instrument_stage(st, self._make_around(st.stage_index))
        gathered: list[Any] = [None] * self.world
        local = ([(s, g) for s in rp.stages for g, _ in rp.group_idx[s]], socket.gethostname())
        dist.all_gather_object(gathered, local)
        self.gkeys = sorted({k for groups, _ in gathered for k in groups})
        self.gindex = {k: i for i, k in enumerate(self.gkeys)}
        self.same_host = len({h for _, h in gathered}) == 1
        self.frozen_plan: dict[str, tuple[str, ...]] = self._frozen_labels()

    def _frozen_labels(self) -> dict[str, tuple[str, ...]]:
        """Weight-gradient action → what it skips in freezing steps of the current plan: group
        names, or `name[k/n]` (k of the group's n tensors) for tensor units."""
        out: dict[str, tuple[str, ...]] = {}
        if self.ctrl is None:
            return out
        acts = {str(a) for a in self.plan.rank_actions[self.rank]}
        for s in self.rp.stages:
            names = [g for g, _ in self.rp.group_idx[s]]
            sizes = [len(idx) for _, idx in self.rp.group_idx[s]]
            owner = [g for g, n in enumerate(sizes) for _ in range(n)]
            for m, units in self.ctrl.frozen_plan(s).items():
                act = f"{s}B{m}" if f"{s}B{m}" in acts else f"{s}W{m}"
                if self.ctrl.unit == "group":
                    out[act] = tuple(names[g] for g in sorted(units))
                else:
                    per = [sum(owner[u] == g for u in units) for g in range(len(names))]
                    out[act] = tuple(
                        names[g] if k == sizes[g] else f"{names[g]}[{k}/{sizes[g]}]"
                        for g, k in enumerate(per)
                        if k
                    )
        return out

    def _frozen(self, stage: int, mb: int) -> frozenset[int]:
        assert self.ctrl is not None
        return self.ctrl.frozen_groups(stage, mb)

    # -- instrumentation ----------------------------------------------------------------------
    def _make_around(self, s: int) -> Callable[[str, int, Callable[[], Any]], Any]:
        def around(kind: str, mb: int, run: Callable[[], Any]) -> Any:
            self._maybe_fail(s, kind, mb)
            self.beat.computing(s, kind, mb)
            c0 = self.clock.start()
            t0 = time.perf_counter()
            self._maybe_slow(s)
            out = run()
            t1 = time.perf_counter()
            cost = self.clock.stop(c0)
            self.beat.idle()
            rec = [s, kind, mb, t0, t1, cost]
            self.records.append(rec)
            self.pending_loss = rec if (kind == "F" and s == self.last) else None
            return out

        return around

    def _loss(self, output: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        """The job's loss; its time is counted in the last stage's F, as the profiler counts it."""
        tok = self.clock.start()
        loss = self.rp.loss_fn(output, target, *args, **kwargs)
        if any(
            f.kind == "nan_loss" and f.step <= self.step_idx < f.step + f.steps for f in self.faults
        ):
            loss = loss * float("nan")
        rec, self.pending_loss = self.pending_loss, None
        if rec is not None:
            rec[4] = time.perf_counter()
            rec[5] = self.clock.extend(rec[5], tok)
        return loss

    def _maybe_fail(self, s: int, kind: str, mb: int) -> None:
        for f in self.faults:
            if (
                f.kind in ("crash", "kill", "hang")
                and kind == "F"
                and f.rank == self.rank
                and f.step == self.step_idx
            ):
                self.faults.remove(f)
                self.beat.computing(s, kind, mb)
                if f.kind == "crash":
                    raise RuntimeError(
                        f"injected fault: rank {self.rank} crashes in {s}F{mb} of step {f.step}"
                    )
                if f.kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)  # injected: dies with no cleanup at all
                threading.Event().wait()  # injected hang: block forever

    def _maybe_slow(self, s: int) -> None:
        for f in self.faults:
            if f.kind == "slow" and f.stage == s and self.step_idx >= f.step:
                # busy for X ms of this thread's CPU: a slower stage (not an idle one), by as
                # much on a loaded host as on a quiet one
                end = time.thread_time() + f.ms / 1e3
                while time.thread_time() < end:
                    pass

    def _fault(self, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind and f.step == self.step_idx), None)

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> RankTrainResult:
        import torch.distributed as dist

        spec = self.spec
        self.setup()
        if self.rank == 0 and self.replan_spec is not None:
            self.solver.start()  # its Python starts beside the first steps, not at the first re-plan
        start = self._resume() if spec.resume_from else 0
        self.log.open(start)
        self.beat.tick(1)
        self.beat.set_phase("train")
        steps: list[dict[str, Any]] = []
        costs: dict[str, dict[str, list[float]]] = {}
        kept: dict[str, deque[Any]] = {
            "freeze": deque(maxlen=TIMELINES_KEPT),
            "full": deque(maxlen=TIMELINES_KEPT),
        }
        vals: list[tuple[int, float]] = []
        end, target = spec.options.steps, spec.options.stop_at_val_loss
        for step in range(start, spec.options.steps):
            self.step_idx = self.beat.step = step
            self._checkpoint_before(step, start)
            bad = self._fault("corrupt_checkpoint")
            newest = ckpt.latest_checkpoint(self.ckdir)
            if bad is not None and bad.rank == self.rank and newest is not None:
                damage_file(newest.path / f"rank{self.rank}.pt")
            events = self.ctrl.begin_step(step) if self.ctrl is not None else []
            self.log.add_events(events)
            freezing = self.ctrl is not None and self.ctrl.freezing
            phase = self.ctrl.phase if self.ctrl is not None else "full"
            if freezing:
                self.frozen_plan = self._frozen_labels()  # the plan of this redraw window
            rec = self._step(step, phase, freezing)
            steps.append(rec)
            if self.replan_spec is not None:
                if step >= spec.measure_from:
                    self._add_costs(freezing)
                self._replan_boundary(step)
            if step >= spec.measure_from:
                cls = "freeze" if freezing else "full"
                for r in self.records:
                    costs.setdefault(f"{r[0]}{r[1]}{r[2]}", {}).setdefault(cls, []).append(r[5])
                kept[cls].append(
                    (
                        step,
                        rec["step_ms"],
                        tuple(
                            (
                                f"{r[0]}{r[1]}{r[2]}",
                                (r[3] - self.g0) * 1e3,
                                (r[4] - self.g0) * 1e3,
                                r[5],
                            )
                            for r in self.records
                        ),
                        self.frozen_plan if freezing else {},
                    )
                )
            at = step + 1
            if at < spec.options.steps and (
                (spec.options.val_every and at % spec.options.val_every == 0)
                or (target is not None and at == spec.options.stop_from)
            ):
                v = self._validate(at)
                if v is not None:
                    vals.append((at, v))
                self.beat.set_phase("train")
                best = min((x for _, x in vals), default=math.inf)
                if target is not None and at >= spec.options.stop_from and best <= target:
                    end = at  # every rank sees the same broadcast validation losses
                    self.log.add_events(
                        [{"step": at, "event": "early_stop", "val_loss": best, "target": target}]
                    )
                    break
            self.beat.tick(2 + step - start)
        # a re-plan still solving: wait for it, report it, and keep it (adopted) for a resume
        if self.inflight is not None:
            if self.rank == 0:
                self.solver.wait()
            self._apply_replan(end - 1)
        if end == spec.options.steps:
            v = self._validate(end)
            if v is not None:
                vals.append((end, v))
        if end > start:
            self._save(end, reason="end")
        dist.barrier()
        self.log.close()
        self.solver.close()
        return RankTrainResult(
            rank=self.rank,
            host=socket.gethostname(),
            device=device_name(self.device),
            stages=self.rp.stages,
            start_step=start,
            steps=tuple(steps),
            costs={a: {k: tuple(v) for k, v in d.items()} for a, d in costs.items()},
            timelines={k: tuple(v) for k, v in kept.items()},
            frozen_plan=self.frozen_plan,
            val_loss=tuple(vals),
            events=tuple(self.log.events),
            checkpoints=tuple(self.checkpoints),
            warnings=tuple(self.warnings),
        )

    def _step(self, step: int, phase: str, freezing: bool) -> dict[str, Any]:
        """One optimizer step; returns its record."""
        import torch
        import torch.distributed as dist

        from freezeopt.torchpp import adapter as torch_pp

        rp, ctrl = self.rp, self.ctrl
        self.probe_ms = 0.0
        if not freezing and self._cost_due(step):
            self._start_cost_window()
        x, y = rp.data.train(step)
        if any(
            f.kind == "corrupt_batch" and f.step <= step < f.step + f.steps for f in self.faults
        ):
            x, y = corrupt(x, step), corrupt(y, step + 1)
        rp.optimizer.zero_grad(set_to_none=True)
        losses: list[Any] = []
        args, kwargs = rp.step_inputs(x, y, losses)
        self.records = []
        dist.barrier()
        t0 = time.perf_counter()
        self.sched.step(*args, **kwargs)
        self.clock.sync()
        t1 = time.perf_counter()
        for r in self.records:
            r[5] = self.clock.resolve(r[5])
        if ctrl is not None:
            for s in rp.stages:
                torch_pp.scale_group_grads(self.units[s], ctrl.grad_scales(s))
        rp.sync_tied_grads()  # tied weights (e.g. shared embeddings): copies get one gradient
        n = len(self.gkeys)
        vec = torch.zeros(1 + 2 * n, dtype=torch.float64)
        if rp.has_last:
            vec[0] = float(torch.stack([lo.detach().double() for lo in losses]).mean())
        for s in rp.stages:
            for g, idx in rp.group_idx[s]:
                grads = [rp.params[s][i].grad for i in idx if rp.params[s][i].grad is not None]
                if grads:
                    sq = sum(float(gr.detach().double().pow(2).sum()) for gr in grads)
                    vec[1 + self.gindex[(s, g)]] = math.sqrt(sq)
                    vec[1 + n + self.gindex[(s, g)]] = 1.0
        code = float(_PHASES.index(phase))
        ready = float(self.rank == 0 and self.inflight is not None and self.solver.done())
        ver = float(self.plan_version)
        tvec = torch.tensor([t1, -t0, t1 - t0, code, -code, ready, ver, -ver], dtype=torch.float64)
        if self.device.type == "cuda":
            vec, tvec = vec.to(self.device), tvec.to(self.device)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        dist.all_reduce(tvec, op=dist.ReduceOp.MAX)
        vec, tvec = vec.cpu(), tvec.cpu()
        if float(tvec[3]) != -float(tvec[4]):  # a bug, not a user error: decisions must agree
            raise RuntimeError(
                f"ranks disagree on the phase of step {step} (this rank: {phase}); "
                "their controllers must see identical inputs"
            )
        if float(tvec[6]) != -float(tvec[7]):
            raise RuntimeError(
                f"ranks disagree on the plan of step {step} (this rank: version {self.plan_version})"
            )
        self.solve_ready = float(tvec[5]) > 0.5
        loss = float(vec[0])
        norms = {
            f"{s}/{g}": float(vec[1 + i])
            for i, (s, g) in enumerate(self.gkeys)
            if float(vec[1 + n + i]) > 0.5
        }
        self.g0 = -float(tvec[1]) if self.same_host else t0
        step_ms = (float(tvec[0] + tvec[1]) if self.same_host else float(tvec[2])) * 1e3
        decision = None
        if ctrl is not None:
            decision = ctrl.end_step(
                loss=loss,
                grad_norms=norms,
                step_ms=step_ms if step >= self.spec.measure_from else None,
            )
            self.log.add_events(list(decision.events))
        self.drift_replan = decision is not None and decision.replan
        nonfinite = not math.isfinite(loss) or not all(math.isfinite(v) for v in norms.values())
        opt_ms = 0.0
        if not nonfinite:
            spike = self._fault("lr_spike")
            saved = [g["lr"] for g in rp.optimizer.param_groups]
            if spike is not None:
                for g in rp.optimizer.param_groups:
                    g["lr"] = g["lr"] * spike.factor
            tok = self.clock.start()
            rp.optimizer.step()
            opt_ms = self.clock.resolve(self.clock.stop(tok))
            if self.lca is not None:
                self.lca_steps += 1
            for g, lr in zip(rp.optimizer.param_groups, saved, strict=True):
                g["lr"] = lr
        else:
            rp.optimizer.zero_grad(set_to_none=True)
            if ctrl is None:  # with a schedule, the controller's drift event says it
                self.log.add_events(
                    [{"step": step, "event": "nonfinite", "loss": str(loss), "update": "skipped"}]
                )
        if decision is not None and decision.rollback:
            self._rollback(step)
            self.lca = None  # the window's weights are gone
        if self.lca is not None and not self._cost_window(step + 1):
            self._end_cost_window(step)
        rec = {
            "step": step,
            "phase": phase,
            "freezing": freezing,
            "loss": loss,
            "step_ms": step_ms,
            "optimizer_ms": opt_ms,
            "drift": list(decision.drift) if decision is not None else [],
            "skipped_update": nonfinite,
        }
        if self.replan_spec is not None:
            rec["plan"] = self.plan_version
        if self.replan_spec is not None and self.replan_spec.costs:
            rec["probe_ms"] = self.probe_ms
        self.log.add_metrics({**rec, "grad_norms": norms})
        return rec

    def _validate(self, at_step: int) -> float | None:
        import torch.distributed as dist

        if self.job.val_batches == 0:
            return None
        v = validation_loss(self.rp, self.beat)
        box: list[Any] = [v]
        dist.broadcast_object_list(box, src=self.plan.stage_rank[self.last])
        val = box[0]
        if val is not None:
            self.log.add_metrics({"step": at_step, "val_loss": val})
        return float(val) if val is not None else None

    # -- checkpoints ----------------------------------------------------------------------------
    def _checkpoint_before(self, step: int, start: int) -> None:
        if step == start:
            return  # the state before the first step of this run is its starting point
        ctrl = self.ctrl
        if (
            ctrl is not None
            and ctrl.phase not in ("init", "freeze")
            and ctrl.phase_at(step) == "freeze"
        ):
            self._save(step, reason=f"{ctrl.phase}->freeze")
            return
        every = self.spec.options.checkpoints.every
        if every and step % every == 0:
            self._save(step, reason="every")

    def _state(self, step: int) -> dict[str, Any]:
        import torch

        return {
            "step": step,
            "stages": list(self.rp.stages),
            "model": {s: m.state_dict() for s, m in self.rp.mods.items()},
            "optimizer": self.rp.optimizer.state_dict(),
            "controller": self.ctrl.state_dict() if self.ctrl is not None else None,
            "rng": torch.get_rng_state(),
            **(
                {"replan": {"version": self.plan_version, "schedule": self.plan_text}}
                if self.replan_spec is not None
                else {}
            ),
        }

    def _save(self, step: int, *, reason: str) -> None:
        import torch.distributed as dist

        phase = self.beat.phase
        self.beat.set_phase("checkpoint")
        _, digest = ckpt.save_rank_state(self.ckdir, step, self.rank, self._state(step))
        digests: list[Any] = [None] * self.world
        dist.all_gather_object(digests, digest)  # also the barrier: every file is in place
        path = ckpt.checkpoint_dir(self.ckdir, step)
        if self.rank == 0:
            meta = {**self.spec.meta, "world_size": self.world}
            ckpt.write_meta(self.ckdir, step, meta, dict(enumerate(digests)))
            ckpt.prune_checkpoints(self.ckdir, self.spec.options.checkpoints.keep)
        dist.barrier()  # meta.json is written before anyone may roll back to it
        self.last_ckpt = str(path)
        self.checkpoints.append(str(path))
        self.log.add_events(
            [{"step": step, "event": "checkpoint", "reason": reason, "path": str(path)}]
        )
        self.beat.set_phase(phase)

    def _load_into(self, path: str, *, full: bool) -> dict[str, Any]:
        import torch

        state = ckpt.load_rank_state(Path(path), self.rank)
        if list(state.get("stages", [])) != list(self.rp.stages):
            raise MismatchError(
                f"checkpoint {path} holds stages {state.get('stages')} for rank {self.rank}, but this job gives it "
                f"{list(self.rp.stages)}; resume with the same job or train into a fresh --out-dir"
            )
        for s, m in self.rp.mods.items():
            m.load_state_dict(state["model"][s])
        self.rp.optimizer.load_state_dict(state["optimizer"])
        if full:
            active = state.get("replan") or {}
            if self.ctrl is not None and active.get("schedule") is not None:
                self.ctrl.set_schedule(parse_schedule(yaml.safe_load(active["schedule"])))
                self.plan_version, self.plan_text = int(active["version"]), active["schedule"]
            if self.ctrl is not None and state.get("controller") is not None:
                self.ctrl.load_state_dict(state["controller"])
            torch.set_rng_state(state["rng"])
        return state

    def _resume(self) -> int:
        assert self.spec.resume_from is not None
        state = self._load_into(self.spec.resume_from, full=True)
        step = int(state["step"])
        self.log.add_events(
            [
                {"step": step, "event": "checkpoint_corrupt", **skipped}
                for skipped in self.spec.resume_skipped
            ]
            + [{"step": step, "event": "resume", "checkpoint": self.spec.resume_from}]
        )
        return step

    def _good_checkpoint(self, step: int) -> str | None:
        """The newest checkpoint of this run whose files match their checksums on every rank
        (each rank checks its own file; they agree through one all-reduce); corrupted ones are
        logged and skipped."""
        import torch
        import torch.distributed as dist

        found = [c for c in ckpt.find_checkpoints(self.ckdir) if c.step <= step]
        for c in reversed(found):
            why = ckpt.verify_rank_file(c, self.rank)
            flag = torch.tensor([0.0 if why is None else 1.0 + self.rank], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if float(flag) == 0.0:
                return str(c.path)
            bad_rank = int(float(flag)) - 1
            boxes: list[Any] = [why]
            dist.broadcast_object_list(boxes, src=bad_rank)
            self.log.add_events(
                [
                    {
                        "step": step,
                        "event": "checkpoint_corrupt",
                        "checkpoint": str(c.path),
                        "reason": str(boxes[0]),
                    }
                ]
            )
        return None

    def _rollback(self, step: int) -> None:
        target = self._good_checkpoint(step) if self.last_ckpt is not None else None
        if target is None:
            reason = "no checkpoint yet" if self.last_ckpt is None else "no intact checkpoint"
            self.log.add_events([{"step": step, "event": "rollback_skipped", "reason": reason}])
            return
        self.last_ckpt = target
        state = self._load_into(self.last_ckpt, full=False)
        if self.ctrl is not None and state.get("controller") is not None:
            self.ctrl.rollback_to(state["controller"])
        self.log.add_events(
            [
                {
                    "step": step,
                    "event": "rollback",
                    "to_step": int(state["step"]),
                    "checkpoint": self.last_ckpt,
                }
            ]
        )
