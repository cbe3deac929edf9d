"""`freezeopt profile`: run a real pipelined training job and write the profile file from what it measured.

Why: every number `freezeopt solve` optimises — action durations, what each parameter group's
weight gradient costs, point-to-point lags, gradient statistics — must come from the job itself,
run by stock `torch.distributed.pipelining`, not from FLOP counts or guesses.

How a run goes. On one machine the profiler spawns one process per rank (gloo on CPU with one
thread per rank, nccl on CUDA; 127.0.0.1 and a free port); under `torchrun` (RANK and
WORLD_SIZE set) each process is one rank. Every rank builds the model with the same seed, keeps
its stages, wraps them in `PipelineStage`s and runs torch's schedule (a `_PipelineScheduleRuntime`
for a CSV order). After `warmup_steps` steps it measures `measure_steps` steps:

* actions: each stage's `forward_one_chunk`, `backward_one_chunk` and `backward_weight_one_chunk`
  are wrapped (`freezeopt.torchpp.adapter.instrument_stage`) to log (rank, stage, microbatch, kind
  F/B/I/W, wall start/end by `perf_counter`, cost). Cost is `time.thread_time` on CPU (immune to
  waiting and, mostly, to core sharing) and CUDA-event time on GPU. The last stage's loss is
  computed by torch right after its forward and is counted in that F. In split schedules torch
  runs stage 0's whole backward in W (its I computes nothing), and the profile says so as measured.
* the executed order per rank, checked against `torch_pp.schedule_actions` (or the CSV);
* the step time: all ranks pass a barrier, then the step runs from the first rank's start to the
  last rank's end; the optimizer step is timed separately per rank;
* gradients: each microbatch's gradient is captured exactly by moving `.grad` aside after every
  backward action (so each action starts from `grad=None` and produces that microbatch's gradient
  alone); after the step the profiler sums them, divides by the number of microbatches (what
  torch's `scale_grads` does) and hands the mean to AdamW (copies of a tied weight first get the
  sum of their gradients, `RankPipeline.sync_tied_grads`). Per group and step it records the
  squared norm of each microbatch's gradient and of the mean — what the gradient-noise-scale
  estimator needs — and APF's effective perturbation Σ|EMA(Δ)| / ΣEMA(|Δ|) of the group's updates
  (EMA factor 0.9, i.e. a window of about 10 steps, tracked from the first step). This holds every
  microbatch's gradient until the step ends (memory: microbatches × parameters); set
  `gradient_traces: false` to run torch's own accumulation instead (no traces then).
* weight-gradient cost per group and what backward truncation saves, measured after training on
  each stage in isolation on a real microbatch (`freezeopt.profiling.group_costs`);
* what freezing costs in loss: each group's share of a held-out probe loss's change per measured
  step, and two branch runs after them (`freezeopt.profiling.loss_cost`);
* lags: derived from the wall timeline — for a cross-rank edge u → v (activations F(s)→F(s+1),
  input gradients of s+1 → of s) in steps where v's rank was idle when u ended, the lag is
  start(v) − end(u): transfer plus send/receive overhead, the delay the DAG must model. Edges with
  fewer than 3 such samples fall back to a ping-pong of the activation's size (half the round trip).
* loss per step and validation loss before and after training, on held-out batches, run as a
  plain forward pass stage by stage (torch's `schedule.eval()` fails on V schedules in 2.13).

Self-check: the measured step time is compared with the step time the profile's own DAG predicts
(`freezeopt.model.dag.build_dag` + `freezeopt.model.simulate.simulate`, nothing frozen). Both go into
`extra["self_check"]`; where they differ by more than 10 % the report says why (ranks sharing a
core, other processes, or overhead between actions the DAG does not model).

Failure handling: a rank that raises reports its error and every rank is stopped; a rank that
makes no progress for `hang_timeout_s` (stuck in an action, or every rank waiting) is declared hung
and every rank is stopped. Either way one `RankFailedError` names the rank and the cause, and no
profile is written. Ranks write their stdout/stderr to a temporary log, named in the error.
A run that diverges stops at the first step whose training loss or a gradient norm is not finite
(or at a non-finite validation loss after training) with one `DivergedError` (exit code 6), and no
profile is written: a diverged run's measurements mean nothing, and NaN has no place in the file.
`fault="crash:rank=R,step=S"` (or `hang:...`, or the FREEZEOPT_FAULT environment variable) makes
rank R fail in its first forward of step S (0-based, warm-up steps included), and
`nan_loss:step=S[,steps=N]` makes the loss of those steps NaN; they are for tests.

Modules: launching and supervising the ranks is `freezeopt.torchpp.launch` (shared with `freezeopt train`),
building a rank's pipeline `freezeopt.torchpp.pipeline`, and turning the ranks' measurements into the file
`freezeopt.profiling.assemble`; this module is the measuring rank and the public entry point.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from freezeopt.errors import DivergedError, InputError
from freezeopt.fileio import check_output_file
from freezeopt.formats.profile import save_profile
from freezeopt.profiling.assemble import (
    APF_ALPHA,
    SELF_CHECK_TOLERANCE,
    ProfileReport,
    RankResult,
    assemble,
    format_report,
)
from freezeopt.profiling.group_costs import Capture, CostMeter, cost_mode
from freezeopt.profiling.lags import measure_lags
from freezeopt.profiling.loss_cost import LcaTracker, branch_frozen
from freezeopt.torchpp.faults import RANK_FAULTS, Fault, parse_faults
from freezeopt.torchpp.job import Job, open_job
from freezeopt.torchpp.launch import (
    RankContext,
    cpu_snapshot,
    host_info,
    in_torchrun,
    load_avg,
    other_cpu,
    run_ranks,
)
from freezeopt.torchpp.pipeline import (
    Clock,
    PipelinePlan,
    build_rank_pipeline,
    device_name,
    make_schedule,
    plan_pipeline,
    preflight,
    probe_loss,
    to_device,
    validation_loss,
)
from freezeopt.torchpp.weights import pin_init

__all__ = [
    "APF_ALPHA",
    "SELF_CHECK_TOLERANCE",
    "ProfileReport",
    "RankResult",
    "format_report",
    "profile_job",
]

# --- public API ---------------------------------------------------------------------------------


def profile_job(
    job_path_or_spec: str | Path | Job,
    *,
    out: Path,
    progress: bool = True,
    fault: str | Fault | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ProfileReport:
    """Run the job for real, measure it, write the profile to `out` and return a summary.

    `job_path_or_spec`: a YAML file, a built-in job name (`tiny-gpt`) or a `Job`; `overrides`
    replaces job fields (e.g. `{"schedule": "ZBVZeroBubble", "stages_per_rank": 2}`). Spawns
    `job.ranks` processes, unless running under torchrun (RANK and WORLD_SIZE set), where this
    process is one rank, every rank gets the report and rank 0 writes the file. Raises InputError for a bad job and
    RankFailedError when a rank crashes or hangs, DivergedError at the first non-finite loss or
    gradient; no file is written then.
    """
    t_start = time.monotonic()
    job = pin_init(open_job(job_path_or_spec, overrides))
    if fault is None and os.environ.get("FREEZEOPT_FAULT"):
        fault = os.environ["FREEZEOPT_FAULT"]
    flt = _one_rank_fault(fault) if isinstance(fault, str) else fault
    if flt is not None and not 0 <= flt.rank < job.ranks:
        raise InputError(f"fault names rank {flt.rank}, but the job has ranks 0..{job.ranks - 1}")
    plan = plan_pipeline(job)
    preflight(job, plan, in_torchrun=in_torchrun())
    out = Path(out)
    check_output_file(out, "-o")
    host = host_info()
    before = cpu_snapshot()
    t_run = time.monotonic()
    results = run_ranks(
        job,
        functools.partial(_profile_rank, job, plan, flt),
        total_units=job.warmup_steps + job.measure_steps + 4,
        progress=progress,
        verb="profiling",
        outcome=lambda: "no profile was written",
        log_prefix="profile",
    )
    if not in_torchrun():
        host.update(other_cpu(before, cpu_snapshot(), time.monotonic() - t_run))
    host["load_avg_after"] = load_avg()
    profile, report = assemble(
        job, plan, results, out=out, host=host, wall_s=time.monotonic() - t_start
    )
    if not in_torchrun() or int(os.environ["RANK"]) == 0:
        save_profile(profile, out)
    return report


def _to_cpu(x: Any) -> Any:
    """A state dict's tensors copied to the CPU (nested dicts and lists kept)."""
    if hasattr(x, "detach"):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_to_cpu(v) for v in x)
    return x


def _one_rank_fault(text: str) -> Fault | None:
    """The rank fault `text` names (test-only; `freezeopt.torchpp.faults`), at most one."""
    faults = parse_faults(text, kinds=(*RANK_FAULTS, "nan_loss"), hint=PROFILE_FAULT_HINT)
    if len(faults) > 1:
        raise InputError(f"fault {text!r}: profiling injects one fault; {PROFILE_FAULT_HINT}")
    return faults[0] if faults else None


PROFILE_FAULT_HINT = (
    "write e.g. crash:rank=1,step=2, kill:rank=1,step=2, hang:rank=0,step=3 or nan_loss:step=2"
)


# --- one rank -----------------------------------------------------------------------------------


def _profile_rank(
    job: Job, plan: PipelinePlan, fault: Fault | None, ctx: RankContext
) -> RankResult:
    """What every rank runs (through `freezeopt.torchpp.launch.run_ranks`)."""
    return _Runner(job, plan, ctx.rank, ctx.world, ctx.device, fault, ctx.beat).run()


class _Runner:
    """Runs and measures one rank. The process group must already be initialised."""

    def __init__(
        self,
        job: Job,
        plan: PipelinePlan,
        rank: int,
        world: int,
        device: Any,
        fault: Fault | None,
        beat: Any,
    ) -> None:
        self.job, self.plan, self.rank, self.world = job, plan, rank, world
        self.device, self.fault, self.beat = device, fault, beat
        self.clock = Clock(device)
        self.my = plan.stages_of(rank)
        self.last = plan.n_stages - 1
        self.M = job.microbatches
        self.step_idx = -1
        self.recording = False
        self.records: list[list[Any]] = []
        self.pending_loss: list[Any] | None = None
        self.stash: dict[int, dict[int, list[Any]]] = {}
        self.cur: tuple[int, str, int] | None = None
        self.cap = Capture(self.last, lambda: self.cur)
        self.warnings: list[str] = []

    # -- setup --

    def setup(self) -> None:
        import torch

        from freezeopt.torchpp import adapter as torch_pp

        self.beat.set_phase("setup")
        rp = self.rp = build_rank_pipeline(self.job, self.plan, self.rank, self.device)
        self.loss_fn, self.data, self.mods = rp.loss_fn, rp.data, rp.mods
        self.params, self.group_idx, self.group_meta = rp.params, rp.group_idx, rp.group_meta
        self.pstages, self.opt = rp.pstages, rp.optimizer
        self.sched = make_schedule(rp, loss_fn=self._loss, scale_grads=not self.job.gradient_traces)
        for st in self.pstages:
            torch_pp.instrument_stage(st, self._make_around(st.stage_index))
            self.cap.hook(self.mods[st.stage_index], st.stage_index)
        all_params = [p for s in self.my for p in self.params[s]]
        self.apf_e = [torch.zeros_like(p) for p in all_params]
        self.apf_a = [torch.zeros_like(p) for p in all_params]
        self.has_first = rp.has_first
        self.has_last = rp.has_last
        self.lca: LcaTracker | None = None
        if self.job.gradient_traces and self.job.probe_batches > 0:
            self.lca = LcaTracker(
                [
                    (st, g, [self.params[st][i] for i in idx])
                    for st in self.my
                    for g, idx in self.group_idx[st]
                ]
            )

    # -- instrumentation --

    def _make_around(self, s: int) -> Callable[[str, int, Callable[[], Any]], Any]:
        def around(kind: str, mb: int, run: Callable[[], Any]) -> Any:
            f = self.fault
            if (
                f is not None
                and f.kind in RANK_FAULTS
                and kind == "F"
                and f.rank == self.rank
                and f.step == self.step_idx
            ):
                self.fault = None
                self.beat.computing(s, kind, mb)
                if f.kind == "crash":
                    raise RuntimeError(
                        f"injected fault: rank {self.rank} crashes in {s}F{mb} of step {f.step}"
                    )
                if f.kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)  # injected: dies with no cleanup at all
                threading.Event().wait()  # injected hang: block forever
            self.beat.computing(s, kind, mb)
            self.cur = (s, kind, mb)
            out, t0, t1, cost = self.clock.timed(run)
            self.cur = None
            self.beat.idle()
            rec = [self.step_idx, s, kind, mb, t0, t1, cost]
            if self.recording:
                self.records.append(rec)
            self.pending_loss = rec if (kind == "F" and s == self.last) else None
            if kind != "F" and self.job.gradient_traces:
                self._stash_grads(s, mb)
            return out

        return around

    def _loss(self, output: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        tok = self.clock.start()
        loss = self.loss_fn(output, target, *args, **kwargs)
        f = self.fault
        if f is not None and f.kind == "nan_loss" and f.step <= self.step_idx < f.step + f.steps:
            loss = loss * float("nan")  # injected (test-only): a diverged step
        rec, self.pending_loss = self.pending_loss, None
        if rec is not None:
            rec[5] = time.perf_counter()
            rec[6] = self.clock.extend(rec[6], tok)
            if self.cap.on and rec[1] == self.last and rec[3] == 0:
                self.cap.take_target(target)
        return loss

    def _stash_grads(self, s: int, mb: int) -> None:
        got = [p.grad for p in self.params[s]]
        if all(g is None for g in got):
            return
        slot = self.stash.setdefault(s, {}).get(mb)
        if slot is None:
            self.stash[s][mb] = got
        else:  # a second backward action of the same microbatch (not seen in torch 2.13, handled anyway)
            self.stash[s][mb] = [
                a if b is None else (b if a is None else a + b)
                for a, b in zip(slot, got, strict=True)
            ]
        for p in self.params[s]:
            p.grad = None

    # -- the run --

    def run(self) -> RankResult:
        import torch
        import torch.distributed as dist

        job = self.job
        self.setup()
        self.beat.tick(1)
        val_before = self._val_loss()
        total = job.warmup_steps + job.measure_steps
        losses: list[float] = []
        bounds: list[tuple[float, float]] = []
        opt_ms: list[float] = []
        opt_wall: list[float] = []
        mb_sq: dict[tuple[int, str], list[tuple[float, ...]]] = {}
        step_sq: dict[tuple[int, str], list[float]] = {}
        apf: dict[tuple[int, str], list[float]] = {}
        for step in range(total):
            self.step_idx = self.beat.step = step
            self.recording = self.cap.recording = step >= job.warmup_steps
            self.cap.on = step == total - 1
            self.beat.set_phase("measure" if self.recording else "warmup")
            if self.lca is not None and step == job.warmup_steps:
                self.lca.start(self._probe)  # the probe loss and its gradient before the step
            x, y = self.data.train(step)
            x, y = to_device(x, self.device), to_device(y, self.device)
            self.opt.zero_grad(set_to_none=True)
            self.stash = {}
            mb_losses: list[Any] = []
            args = (x,) if self.has_first else ()
            kwargs: dict[str, Any] = {"target": y, "losses": mb_losses} if self.has_last else {}
            n_rec = len(self.records)
            dist.barrier()
            t0 = time.perf_counter()
            self.sched.step(*args, **kwargs)
            self.clock.sync()
            t1 = time.perf_counter()
            for rec in self.records[n_rec:]:
                rec[6] = self.clock.resolve(rec[6])
            if job.gradient_traces:
                norms = self._combine_grads()
            loss = None
            if self.has_last:
                loss = float(torch.stack([lo.detach().float() for lo in mb_losses]).mean())
            self._stop_if_diverged(step, total, loss, norms if job.gradient_traces else None)
            self.rp.sync_tied_grads()  # tied weights (e.g. shared embeddings): one gradient
            before = [p.detach().clone() for s in self.my for p in self.params[s]]
            tok = self.clock.start()
            ow = time.perf_counter()
            self.opt.step()
            opt_cost = self.clock.stop(tok)
            self.clock.sync()
            ow = time.perf_counter() - ow
            oc = self.clock.resolve(opt_cost)
            pert = self._apf(before)
            if self.lca is not None and self.recording:
                self.lca.step(self._probe, self._by_group(before))
            if loss is not None:
                losses.append(loss)
            if self.recording:
                bounds.append((t0, t1))
                opt_ms.append(oc)
                opt_wall.append(ow * 1e3)
                for key, p in pert.items():
                    apf.setdefault(key, []).append(p)
                if job.gradient_traces:
                    for key, (mbs, st) in norms.items():
                        mb_sq.setdefault(key, []).append(mbs)
                        step_sq.setdefault(key, []).append(st)
            self.beat.tick(2 + step)
        self.recording = self.cap.recording = self.cap.on = False
        branch = None
        if self.lca is not None and job.branch_steps > 0 and self.M >= 2:
            self.beat.set_phase("branches")
            branch = self._branches(total)
        self.beat.set_phase("costs")
        cost_rounds = CostMeter.of(self, beat=self.beat).group_costs(
            self._cost_modes(), self.job.cost_samples
        )
        self.beat.tick(2 + total)
        self.beat.set_phase("lags")
        pingpong, shapes = measure_lags(
            self.rank,
            self.plan.stage_rank,
            self.cap.act_shapes,
            device=self.device,
            clock=self.clock,
            samples=self.job.lag_samples,
            beat=self.beat,
        )
        self.beat.tick(3 + total)
        val_after = self._val_loss()
        if val_after is not None and not math.isfinite(val_after):
            raise DivergedError(
                f"the validation loss after the last of {total} steps was {val_after}: the run "
                f"diverged, so no profile was written; {self._diverged_hint()}"
            )
        self.beat.tick(4 + total)
        val = (val_before, val_after) if self.has_last and job.val_batches > 0 else ()
        return RankResult(
            rank=self.rank,
            host=socket.gethostname(),
            device=device_name(self.device),
            stages=self.my,
            records=tuple(
                (r[0] - job.warmup_steps, r[1], r[2], r[3], r[4], r[5], float(r[6]))
                for r in self.records
            ),
            step_bounds=tuple(bounds),
            optimizer_ms=tuple(opt_ms),
            optimizer_wall_ms=tuple(opt_wall),
            losses=tuple(losses),
            val_loss=tuple(v for v in val if v is not None),
            groups=tuple(self.group_meta),
            mb_sq={k: tuple(v) for k, v in mb_sq.items()},
            step_sq={k: tuple(v) for k, v in step_sq.items()},
            apf={k: tuple(v) for k, v in apf.items()},
            cost_rounds=cost_rounds,
            cost_modes=self._cost_modes(),
            all_grouped={s: self.rp.all_grouped[s] for s in self.my},
            pingpong=pingpong,
            act_shapes=shapes,
            data_provenance=dict(self.data.provenance) if self.rank == 0 else {},
            warnings=tuple(self.warnings),
            probe_losses=tuple(self.lca.losses) if self.lca is not None else (),
            loss_change={k: tuple(v) for k, v in self.lca.changes.items()}
            if self.lca is not None
            else {},
            branch=branch,
        )

    def _stop_if_diverged(
        self,
        step: int,
        total: int,
        loss: float | None,
        norms: dict[tuple[int, str], tuple[tuple[float, ...], float]] | None,
    ) -> None:
        """Stop at the first step whose loss (known on the last stage's rank) or one of whose
        gradient norms (on any rank) is not finite: a diverged run's measurements mean nothing,
        and its NaNs have no place in a profile. Every rank learns it (one all-reduce of two
        flags, outside the timed step); the last stage's rank raises `DivergedError`, which
        `run_ranks` reports as it is, and the other ranks stop when it does."""
        import torch
        import torch.distributed as dist

        bad_loss = loss is not None and not math.isfinite(loss)
        bad_grad = norms is not None and not all(
            math.isfinite(v) for mbs, st in norms.values() for v in (*mbs, st)
        )
        flags = torch.tensor([float(bad_loss), float(bad_grad)], device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        got_loss, got_grad = (bool(x) for x in flags.tolist())
        if not self.has_last or not (got_loss or got_grad):
            return
        what = (
            f"the training loss was {loss}"
            if got_loss
            else f"a gradient was not finite (the loss was {loss:g})"
        )
        raise DivergedError(
            f"{what} at step {step} of {total} (counting from 0, warm-up included): the run "
            f"diverged, so profiling stopped there and no profile was written; {self._diverged_hint()}"
        )

    def _diverged_hint(self) -> str:
        return f"lower the learning rate (lr: {self.job.lr:g}) or check the model and its data"

    def _combine_grads(
        self, skip: Callable[[int, int], frozenset[int]] | None = None
    ) -> dict[tuple[int, str], tuple[tuple[float, ...], float]]:
        """Sum the stashed per-microbatch gradients into `.grad` (mean over microbatches); return
        norms. With `skip`, group g of stage s takes only the microbatches not in `skip(s, g)`,
        rescaled to their mean, as training with a freezing plan does (the branch runs)."""
        import torch

        out: dict[tuple[int, str], tuple[tuple[float, ...], float]] = {}
        for s in self.my:
            per_mb = self.stash.get(s, {})
            if sorted(per_mb) != list(range(self.M)):
                raise RuntimeError(
                    f"stage {s}: captured gradients for microbatches {sorted(per_mb)}, expected 0..{self.M - 1}"
                )
            params = self.params[s]
            sq = torch.zeros(self.M, len(params), dtype=torch.float64)
            for mb in range(self.M):
                for i, g in enumerate(per_mb[mb]):
                    if g is not None:
                        sq[mb, i] = float(g.detach().double().pow(2).sum())
            step_sq = torch.zeros(len(params), dtype=torch.float64)
            off: dict[int, frozenset[int]] = {}
            if skip is not None:
                for gi, (_, idx) in enumerate(self.group_idx[s]):
                    off.update(dict.fromkeys(idx, skip(s, gi)))
            with torch.no_grad():
                for i, p in enumerate(params):
                    out_mb = off.get(i, frozenset())
                    gs = [
                        per_mb[mb][i]
                        for mb in range(self.M)
                        if per_mb[mb][i] is not None and mb not in out_mb
                    ]
                    if gs:
                        total = torch.stack(gs).sum(0) if len(gs) > 1 else gs[0].clone()
                        p.grad = total.div_(self.M - len(out_mb))
                        step_sq[i] = float(p.grad.double().pow(2).sum())
            for g, idx in self.group_idx[s]:
                mbs = tuple(float(sq[mb, idx].sum()) for mb in range(self.M))
                out[(s, g)] = (mbs, float(step_sq[idx].sum()))
        self.stash = {}
        return out

    def _apf(self, before: list[Any]) -> dict[tuple[int, str], float]:
        import torch

        out: dict[tuple[int, str], float] = {}
        k = 0
        with torch.no_grad():
            for s in self.my:
                num = [0.0] * len(self.params[s])
                den = [0.0] * len(self.params[s])
                for i, p in enumerate(self.params[s]):
                    d = p.detach() - before[k]
                    self.apf_e[k].mul_(APF_ALPHA).add_(d, alpha=1 - APF_ALPHA)
                    self.apf_a[k].mul_(APF_ALPHA).add_(d.abs(), alpha=1 - APF_ALPHA)
                    num[i] = float(self.apf_e[k].abs().sum())
                    den[i] = float(self.apf_a[k].sum())
                    k += 1
                for g, idx in self.group_idx[s]:
                    n, d_ = sum(num[i] for i in idx), sum(den[i] for i in idx)
                    out[(s, g)] = min(1.0, n / d_) if d_ > 0 else 0.0
        return out

    def _cost_modes(self) -> dict[int, str]:
        return {s: cost_mode(self.plan.rank_actions[self.rank], s) for s in self.my}

    # -- what freezing costs (freezeopt.profiling.loss_cost) --

    def _probe(self) -> float | None:
        """The probe loss with its gradient in `.grad` (every rank together)."""
        loss = probe_loss(
            self.rp, first=self.job.val_batches, batches=self.job.probe_batches, grad=True
        )
        self.beat.tick()
        return loss

    def _by_group(self, flat: list[Any]) -> list[list[Any]]:
        """`flat` (one entry per parameter of this rank's stages, in order) split by group."""
        out, start = [], 0
        for st in self.my:
            for _, idx in self.group_idx[st]:
                out.append([flat[start + i] for i in idx])
            start += len(self.params[st])
        return out

    def _branches(self, first_step: int) -> tuple[float, float, float] | None:
        """The two branch runs (module docstring of `loss_cost`) from the state after the
        measured steps, on the data of steps `first_step`…; the state is restored after each.
        Returns (probe loss at the start, after full updates, after freezing) on the last
        stage's rank, None elsewhere or where a probe loss was not finite."""
        import copy

        import torch

        job = self.job
        # the state to come back to, on the CPU (a device copy would double the model's memory):
        # weights and buffers, the optimizer's state, the random generator
        saved = {
            st: {k: v.detach().to("cpu", copy=True) for k, v in self.mods[st].state_dict().items()}
            for st in self.my
        }
        saved_opt = copy.deepcopy(_to_cpu(self.opt.state_dict()))
        rng = torch.get_rng_state()
        losses: list[float | None] = [self._probe_loss()]
        for frozen in (False, True):
            for i in range(job.branch_steps):
                step = first_step + i
                self.step_idx = self.beat.step = step

                def skip(st: int, g: int, step: int = step) -> frozenset[int]:
                    return branch_frozen(step, st, g, self.M)

                self._plain_step(step, skip if frozen else None)
                self.beat.tick()
            losses.append(self._probe_loss())
            for st in self.my:
                self.mods[st].load_state_dict(saved[st])  # copies into the modules' own tensors
            self.opt.load_state_dict(copy.deepcopy(saved_opt))  # loading may alias its tensors
            torch.set_rng_state(rng)
        if any(v is None or not math.isfinite(v) for v in losses):
            return None
        start, full, frozen_ = (float(v) for v in losses if v is not None)
        return start, full, frozen_

    def _probe_loss(self) -> float | None:
        loss = probe_loss(
            self.rp, first=self.job.val_batches, batches=self.job.probe_batches, grad=False
        )
        self.beat.tick()
        return loss

    def _plain_step(self, step: int, skip: Callable[[int, int], frozenset[int]] | None) -> None:
        """One optimizer step, neither timed nor recorded; `skip` as in `_combine_grads`."""
        x, y = self.data.train(step)
        x, y = to_device(x, self.device), to_device(y, self.device)
        self.opt.zero_grad(set_to_none=True)
        self.stash = {}
        args = (x,) if self.has_first else ()
        kwargs: dict[str, Any] = {"target": y, "losses": []} if self.has_last else {}
        self.sched.step(*args, **kwargs)
        self._combine_grads(skip)
        self.rp.sync_tied_grads()
        self.opt.step()

    def _val_loss(self) -> float | None:
        """Mean loss on the held-out batches (a plain forward pass, stage by stage across ranks)."""
        return validation_loss(self.rp, self.beat)
