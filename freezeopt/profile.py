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
  are wrapped (`freezeopt.torch_pp.instrument_stage`) to log (rank, stage, microbatch, kind
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
  torch's `scale_grads` does) and hands the mean to AdamW. Per group and step it records the
  squared norm of each microbatch's gradient and of the mean — what the gradient-noise-scale
  estimator needs — and APF's effective perturbation Σ|EMA(Δ)| / ΣEMA(|Δ|) of the group's updates
  (EMA factor 0.9, i.e. a window of about 10 steps, tracked from the first step). This holds every
  microbatch's gradient until the step ends (memory: microbatches × parameters); set
  `gradient_traces: false` to run torch's own accumulation instead (no traces then).
* weight-gradient cost per group, measured after training on each stage in isolation on a real
  microbatch (its captured input, target and incoming gradient), in the form the stage's weight
  gradients take in the schedule. For stages with full backwards (B), and for stage 0 of split
  schedules (whose W is torch's full backward): one forward, then `cost_samples` rounds of
  `torch.autograd.grad` over the retained graph with inputs = the stage input plus (a) all
  parameters, (b) all parameters except group g, for each g, (c) no parameters. For the other
  stages of split schedules (I then W): per round a fresh forward and torch's I step, then torch's
  W step (`stage_backward_weight`) restricted to (a) all parameters or (b) all but group g — how a
  runtime skips frozen groups in W. A group's cost is the median over rounds of (a) − (b), paired
  within a round: the time freezing g alone saves. For stages after the first the group costs add
  up to (a) − (c), the stage's weight-gradient time, within noise; on the first stage freezing a
  group can also skip backpropagating to the layers below it, so leave-one-out costs are not
  additive there and sum to less. Negative differences (noise) are clipped to 0. If a stage's
  group costs add up to more than one of its B/W actions took in the pipeline, they are scaled
  down to fit (the DAG requires it) and the factor is recorded in `extra["group_costs"]`.
* lags: derived from the wall timeline — for a cross-rank edge u → v (activations F(s)→F(s+1),
  input gradients of s+1 → of s) in steps where v's rank was idle when u ended, the lag is
  start(v) − end(u): transfer plus send/receive overhead, the delay the DAG must model. Edges with
  fewer than 3 such samples fall back to a ping-pong of the activation's size (half the round trip).
* loss per step and validation loss before and after training, on held-out batches, run as a
  plain forward pass stage by stage (torch's `schedule.eval()` fails on V schedules in 2.13).

Self-check: the measured step time is compared with the step time the profile's own DAG predicts
(`freezeopt.dag.build_dag` + `freezeopt.simulate.simulate`, nothing frozen). Both go into
`extra["self_check"]`; where they differ by more than 10 % the report says why (ranks sharing a
core, other processes, or overhead between actions the DAG does not model).

Failure handling: a rank that raises reports its error and every rank is stopped; a rank that
makes no progress for `hang_timeout_s` (stuck in an action, or every rank waiting) is declared hung
and every rank is stopped. Either way one `RankFailedError` names the rank and the cause, and no
profile is written. Ranks write their stdout/stderr to a temporary log, named in the error.
`fault="crash:rank=R,step=S"` (or `hang:...`, or the FREEZEOPT_FAULT environment variable) makes
rank R fail in its first forward of step S (0-based, warm-up steps included); it is for tests.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import queue as queue_mod
import re
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from freezeopt import __version__
from freezeopt.actions import Action
from freezeopt.errors import FreezeoptError, InputError
from freezeopt.job import (
    Job,
    ModelParts,
    add_search_path,
    job_sha256,
    load_job,
    replace_job,
    resolve_data,
    resolve_groups,
    resolve_model,
)
from freezeopt.profile_file import (
    ActionCost,
    GradientTrace,
    GroupProfile,
    Lag,
    Pipeline,
    Profile,
    Provenance,
    RankProfile,
    StageProfile,
    Stat,
    TimelineEntry,
    save_profile,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "Fault",
    "ProfileReport",
    "RankFailedError",
    "format_report",
    "parse_fault",
    "profile_job",
]

APF_ALPHA = 0.9
"""EMA factor of APF's effective perturbation."""
SELF_CHECK_TOLERANCE = 0.10
"""Relative step-time error above which the report explains the difference."""
_MIN_LAG_SAMPLES = 3
_COST_WARMUP_ROUNDS = 2
_LAG_WARMUP = 5
_PHASES = ("start", "setup", "validation", "warmup", "measure", "costs", "lags", "done")
_STARTUP_GRACE_S = 120.0
_FIT_MARGIN = 1e-4
_OTHERS_BUSY = 0.1  # cores: other processes busier than this make timings unreliable
_BEAT_FIELDS = 8  # per rank: time, units done, phase, computing, stage, kind, microbatch, step
_KINDS = "FBIW"


class RankFailedError(FreezeoptError):
    """A rank crashed or hung; every rank was stopped and no profile was written."""

    def __init__(self, message: str, *, rank: int, cause: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.cause = cause


# --- public API ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """A test-only injected failure: rank `rank` crashes or hangs in its first forward of `step`."""

    kind: Literal["crash", "hang"]
    rank: int
    step: int


_FAULT_RE = re.compile(r"^(crash|hang):rank=(\d+),step=(\d+)$")


def parse_fault(text: str) -> Fault:
    """Parse `crash:rank=1,step=2` or `hang:rank=0,step=3`."""
    m = _FAULT_RE.match(text.replace(" ", ""))
    if m is None:
        raise InputError(
            f"fault {text!r} is malformed; write e.g. crash:rank=1,step=2 or hang:rank=0,step=3"
        )
    return Fault(kind=m.group(1), rank=int(m.group(2)), step=int(m.group(3)))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileReport:
    """The summary of one profiling run (the profile file holds everything)."""

    path: Path | None
    """Where the profile was written (under torchrun: by rank 0; every rank gets its report)."""
    job: str
    schedule: str
    world_size: int
    n_stages: int
    n_microbatches: int
    steps_measured: int
    device: str
    measured_step_ms: float
    """Median measured wall time of one pipeline step (barrier to last rank done)."""
    predicted_step_ms: float
    """Step time the profile's DAG predicts from the measured action costs and lags."""
    error: float
    """(predicted − measured) / measured."""
    explanation: str | None
    """Why prediction and measurement differ, where they differ by more than 10 %."""
    action_ms: tuple[tuple[int, int, str, float, float, int], ...]
    """(stage, rank, kind, median cost ms, median wall ms, actions) per stage and kind."""
    group_ms: tuple[tuple[int, str, float], ...]
    """(stage, group, weight-gradient ms per microbatch)."""
    lags_ms: tuple[tuple[int, int, str, float, str], ...]
    """(src stage, dst stage, kind, ms, method)."""
    optimizer_ms: tuple[float, ...]
    """Median optimizer-step time per rank."""
    loss: tuple[float, ...]
    """Training loss of the measured steps."""
    val_loss: tuple[float, ...]
    """Validation loss before and after training."""
    order_ok: bool
    """True when every rank executed exactly torch's (or the CSV's) order."""
    order_mismatches: tuple[str, ...]
    warnings: tuple[str, ...]
    wall_s: float
    """How long profiling took."""

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data (for `--json`)."""
        d = asdict(self)
        d["path"] = None if self.path is None else str(self.path)
        return d


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
    process is one rank and rank 0 writes the file. Raises InputError for a bad job and
    RankFailedError when a rank crashes or hangs; no file is written then.
    """
    t_start = time.monotonic()
    job_file: Path | None = None
    if isinstance(job_path_or_spec, Job):
        job = job_path_or_spec
    else:
        job = load_job(job_path_or_spec)
        p = Path(job_path_or_spec)
        job_file = p if p.exists() else None
    if overrides:
        job = replace_job(job, **overrides)
    add_search_path(job_file)
    if fault is None and os.environ.get("FREEZEOPT_FAULT"):
        fault = os.environ["FREEZEOPT_FAULT"]
    flt = parse_fault(fault) if isinstance(fault, str) else fault
    if flt is not None and not 0 <= flt.rank < job.ranks:
        raise InputError(f"fault names rank {flt.rank}, but the job has ranks 0..{job.ranks - 1}")
    plan = _plan(job)
    _preflight(job, plan)
    out = Path(out)
    if _in_torchrun():
        return _profile_torchrun(job, plan, out=out, fault=flt, t_start=t_start, progress=progress)
    host = _host_info()
    before = _cpu_snapshot()
    t_run = time.monotonic()
    results = _launch_local(job, plan, fault=flt, progress=progress)
    host.update(_other_cpu(before, _cpu_snapshot(), time.monotonic() - t_run))
    host["load_avg_after"] = _load_avg()
    profile, report = _assemble(
        job, plan, results, out=out, host=host, wall_s=time.monotonic() - t_start
    )
    save_profile(profile, out)
    return report


def format_report(report: ProfileReport) -> str:
    """A short human-readable summary table of a profiling run."""
    lines = [
        f"{report.job} · {report.schedule} · {report.world_size} ranks · {report.n_stages} stages · "
        f"{report.n_microbatches} microbatches · {report.steps_measured} steps measured on {report.device} "
        f"({report.wall_s:.1f} s)",
        f"step time: measured {report.measured_step_ms:.1f} ms, DAG-predicted {report.predicted_step_ms:.1f} ms, "
        f"error {report.error * 100:+.1f} %",
    ]
    if report.explanation:
        lines.append(f"  why: {report.explanation}")
    lines.append("")
    lines.append(f"{'stage':>5} {'rank':>4} {'kind':>4} {'cost ms':>8} {'wall ms':>8} {'n':>3}")
    for st, rk, kind, cost, wall, n in report.action_ms:
        lines.append(f"{st:>5} {rk:>4} {kind:>4} {cost:>8.2f} {wall:>8.2f} {n:>3}")
    lines.append("")
    lines.append("weight-gradient cost per microbatch (ms):")
    by_stage: dict[int, list[str]] = {}
    for st, g, ms in report.group_ms:
        by_stage.setdefault(st, []).append(f"{g} {ms:.2f}")
    for st in sorted(by_stage):
        lines.append(f"  stage {st}: " + ", ".join(by_stage[st]))
    if report.lags_ms:
        lags = ", ".join(f"{s}→{d} {k} {ms:.3f} ({m})" for s, d, k, ms, m in report.lags_ms)
        lines.append(f"lags (ms): {lags}")
    lines.append(
        "optimizer step (ms): "
        + ", ".join(f"rank {r} {ms:.2f}" for r, ms in enumerate(report.optimizer_ms))
    )
    if report.loss:
        val = ""
        if report.val_loss:
            val = f"; validation {report.val_loss[0]:.3f} → {report.val_loss[-1]:.3f}"
        lines.append(
            f"loss {report.loss[0]:.3f} → {report.loss[-1]:.3f} over the measured steps{val}"
        )
    if report.order_ok:
        lines.append("action order: every rank ran exactly the schedule's order")
    else:
        lines.append(
            "action order differs from the schedule: " + "; ".join(report.order_mismatches)
        )
    lines.extend(f"warning: {w}" for w in report.warnings)
    if report.path is not None:
        lines.append(f"profile written to {report.path}")
    return "\n".join(lines)


# --- planning (parent and ranks) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """The pipeline shape a job implies: who runs which stage, in what order."""

    label: str
    rank_actions: tuple[tuple[Action, ...], ...]
    n_stages: int
    stage_rank: tuple[int, ...]
    csv_path: str | None

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s in range(self.n_stages) if self.stage_rank[s] == rank)


def _plan(job: Job) -> _Plan:
    from freezeopt import torch_pp

    if job.is_csv:
        acts = torch_pp.csv_schedule_actions(
            job.schedule, world_size=job.ranks, n_microbatches=job.microbatches
        )
        label, csv_path = f"csv:{Path(job.schedule).name}", job.schedule
    else:
        spr = job.stages_per_rank or torch_pp.default_stages_per_rank(job.schedule)
        acts = torch_pp.schedule_actions(
            job.schedule, world_size=job.ranks, stages_per_rank=spr, n_microbatches=job.microbatches
        )
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
    return _Plan(
        label=label,
        rank_actions=tuple(tuple(r) for r in acts),
        n_stages=n_stages,
        stage_rank=tuple(stage_rank[s] for s in range(n_stages)),
        csv_path=csv_path,
    )


def _preflight(job: Job, plan: _Plan) -> None:
    """Catch a bad model function before any process starts (built on the meta device: no memory)."""
    import torch

    if job.device == "cuda":
        if not torch.cuda.is_available():
            raise InputError(
                "the job asks for device cuda, but torch sees no CUDA device; set device: cpu"
            )
        n_gpu = torch.cuda.device_count()
        if not _in_torchrun() and job.ranks > n_gpu:
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
        return
    _check_parts(job, plan, parts)


def _check_parts(
    job: Job, plan: _Plan, parts: Any
) -> dict[int, tuple[tuple[str, tuple[str, ...]], ...]]:
    if not isinstance(parts, ModelParts):
        raise InputError(
            f"model {job.model!r} returned {type(parts).__name__}; return freezeopt.job.ModelParts"
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
    out = {}
    for s, mod in enumerate(parts.stages):
        names, child_of = _param_names(mod)
        if not names:
            raise InputError(
                f"stage {s} of model {job.model!r} has no trainable parameters; every stage needs some"
            )
        out[s] = resolve_groups(
            job, s, names, parts.groups[s] if parts.groups is not None else None, child_of
        )
    return out


def _param_names(mod: Any) -> tuple[list[str], dict[str, str]]:
    names = [n for n, p in mod.named_parameters() if p.requires_grad]
    children = {n for n, _ in mod.named_children()}
    child_of = {n: (n.split(".")[0] if n.split(".")[0] in children else "") for n in names}
    return names, child_of


# --- heartbeat (shared memory, one row per rank) ------------------------------------------------


class _Beat:
    """A rank's liveness and progress, written into shared memory the parent polls."""

    def __init__(self, arr: Any, rank: int) -> None:
        self.a = arr
        self.o = rank * _BEAT_FIELDS
        self.step = -1
        self.set_phase("start")

    @property
    def phase(self) -> str:
        return _PHASES[int(self.a[self.o + 2])]

    def set_phase(self, phase: str) -> None:
        self.a[self.o + 2] = float(_PHASES.index(phase))
        self.a[self.o + 0] = time.monotonic()

    def tick(self, units: float | None = None) -> None:
        self.a[self.o + 0] = time.monotonic()
        if units is not None:
            self.a[self.o + 1] = units

    def computing(self, stage: int, kind: str, mb: int) -> None:
        a, o = self.a, self.o
        a[o + 0] = time.monotonic()
        a[o + 3] = 1.0
        a[o + 4] = stage
        a[o + 5] = _KINDS.index(kind)
        a[o + 6] = mb
        a[o + 7] = self.step

    def idle(self) -> None:
        self.a[self.o + 0] = time.monotonic()
        self.a[self.o + 3] = 0.0


@dataclass(frozen=True, slots=True)
class _BeatView:
    """What the parent reads about one rank."""

    ts: float
    units: float
    phase: str
    computing: bool
    action: str
    step: int


def _read_beat(arr: Any, rank: int) -> _BeatView:
    o = rank * _BEAT_FIELDS
    v = [arr[o + i] for i in range(_BEAT_FIELDS)]
    action = f"{int(v[4])}{_KINDS[int(v[5])]}{int(v[6])}"
    return _BeatView(
        ts=v[0],
        units=v[1],
        phase=_PHASES[int(v[2])],
        computing=v[3] > 0.5,
        action=action,
        step=int(v[7]),
    )


# --- one rank -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RankResult:
    """Everything one rank measured, as plain picklable data."""

    rank: int
    host: str
    device: str
    stages: tuple[int, ...]
    records: tuple[tuple[int, int, str, int, float, float, float], ...]
    """(measured step, stage, kind, microbatch, wall start s, wall end s, cost ms)."""
    step_bounds: tuple[tuple[float, float], ...]
    """Per measured step: wall start and end (perf_counter seconds) of this rank's step()."""
    optimizer_ms: tuple[float, ...]
    optimizer_wall_ms: tuple[float, ...]
    losses: tuple[float, ...]
    """Mean microbatch loss of every step, warm-up included (last-stage rank only)."""
    val_loss: tuple[float, ...]
    groups: tuple[tuple[int, str, tuple[str, ...], int], ...]
    """(stage, group, parameter names, numel)."""
    mb_sq: dict[tuple[int, str], tuple[tuple[float, ...], ...]]
    step_sq: dict[tuple[int, str], tuple[float, ...]]
    apf: dict[tuple[int, str], tuple[float, ...]]
    cost_rounds: dict[int, dict[str, tuple[float, ...]]]
    """Per stage: 'all', 'none' and each group's leave-one-out samples (ms)."""
    cost_modes: dict[int, str]
    """Per stage: `full` (costs measured in a full backward) or `split` (in torch's W step)."""
    pingpong: dict[tuple[int, int], tuple[float, ...]]
    """(src rank, dst rank) → one-way ms samples (measured on the sending side)."""
    act_shapes: dict[int, tuple[tuple[int, ...], str]]
    data_provenance: dict[str, Any]
    warnings: tuple[str, ...] = ()


class _Clock:
    """Cost timer: thread CPU time on CPU, CUDA events on GPU (resolved after a synchronize)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self) -> Any:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.thread_time()

    def stop(self, tok: Any) -> Any:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return (tok, ev)
        return (time.thread_time() - tok) * 1e3

    def extend(self, cost: Any, tok: Any) -> Any:
        """`cost` of an action, extended by the interval measured from `tok` (just after it) to now."""
        if self.cuda:
            return (cost[0], self.stop(tok)[1])
        return cost + self.stop(tok)

    def resolve(self, cost: Any) -> float:
        if self.cuda:
            return float(cost[0].elapsed_time(cost[1]))
        return float(cost)

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


class _Runner:
    """Runs and measures one rank. The process group must already be initialised."""

    def __init__(
        self,
        job: Job,
        plan: _Plan,
        rank: int,
        world: int,
        device: Any,
        fault: Fault | None,
        beat: _Beat,
    ) -> None:
        self.job, self.plan, self.rank, self.world = job, plan, rank, world
        self.device, self.fault, self.beat = device, fault, beat
        self.clock = _Clock(device)
        self.my = plan.stages_of(rank)
        self.last = plan.n_stages - 1
        self.M = job.microbatches
        self.step_idx = -1
        self.recording = False
        self.records: list[list[Any]] = []
        self.pending_loss: list[Any] | None = None
        self.stash: dict[int, dict[int, list[Any]]] = {}
        self.capture = False
        self.cur: tuple[int, str, int] | None = None
        self.captured_in: dict[int, tuple[Any, ...]] = {}
        self.captured_grads: dict[int, list[Any]] = {}
        self.captured_target: Any = None
        self.act_shapes: dict[int, tuple[tuple[int, ...], str]] = {}
        self.warnings: list[str] = []

    # -- setup --

    def setup(self) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage

        from freezeopt import torch_pp

        job, plan = self.job, self.plan
        self.beat.set_phase("setup")
        torch.manual_seed(job.seed)
        parts = resolve_model(job)(n_stages=plan.n_stages, seq_len=job.seq_len, **job.model_args)
        groups = _check_parts(job, plan, parts)
        self.loss_fn = parts.loss_fn
        self.data = resolve_data(job)(
            batch_size=job.batch_size, seq_len=job.seq_len, seed=job.seed, **job.data_args
        )
        self.mods = {s: parts.stages[s].to(self.device) for s in self.my}
        del parts
        self.params: dict[int, list[Any]] = {}
        self.group_idx: dict[int, list[tuple[str, list[int]]]] = {}
        self.group_meta: list[tuple[int, str, tuple[str, ...], int]] = []
        for s in self.my:
            named = [(n, p) for n, p in self.mods[s].named_parameters() if p.requires_grad]
            self.params[s] = [p for _, p in named]
            pos = {n: i for i, (n, _) in enumerate(named)}
            self.group_idx[s] = [(g, [pos[n] for n in members]) for g, members in groups[s]]
            for g, members in groups[s]:
                numel = sum(named[pos[n]][1].numel() for n in members)
                self.group_meta.append((s, g, tuple(members), int(numel)))
        self.pstages = [PipelineStage(self.mods[s], s, plan.n_stages, self.device) for s in self.my]
        all_params = [p for s in self.my for p in self.params[s]]
        self.opt = torch.optim.AdamW(all_params, lr=job.lr, weight_decay=job.weight_decay)
        self.sched = torch_pp.build_schedule(
            job.schedule,
            self.pstages,
            n_microbatches=self.M,
            loss_fn=self._loss,
            scale_grads=not job.gradient_traces,
            csv_path=plan.csv_path,
        )
        for st in self.pstages:
            torch_pp.instrument_stage(st, self._make_around(st.stage_index))
            self.mods[st.stage_index].register_forward_pre_hook(self._make_pre_hook(st.stage_index))
            self.mods[st.stage_index].register_forward_hook(self._make_post_hook(st.stage_index))
        self.apf_e = [torch.zeros_like(p) for p in all_params]
        self.apf_a = [torch.zeros_like(p) for p in all_params]
        self.has_first = 0 in self.my
        self.has_last = self.last in self.my

    # -- instrumentation --

    def _make_around(self, s: int) -> Callable[[str, int, Callable[[], Any]], Any]:
        def around(kind: str, mb: int, run: Callable[[], Any]) -> Any:
            f = self.fault
            if f is not None and kind == "F" and f.rank == self.rank and f.step == self.step_idx:
                self.fault = None
                self.beat.computing(s, kind, mb)
                if f.kind == "crash":
                    raise RuntimeError(
                        f"injected fault: rank {self.rank} crashes in {s}F{mb} of step {f.step}"
                    )
                threading.Event().wait()  # injected hang: block forever
            self.beat.computing(s, kind, mb)
            self.cur = (s, kind, mb)
            c0 = self.clock.start()
            t0 = time.perf_counter()
            out = run()
            t1 = time.perf_counter()
            cost = self.clock.stop(c0)
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
        rec, self.pending_loss = self.pending_loss, None
        if rec is not None:
            rec[5] = time.perf_counter()
            rec[6] = self.clock.extend(rec[6], tok)
            if self.capture and rec[1] == self.last and rec[3] == 0:
                self.captured_target = (
                    target.detach().clone() if hasattr(target, "detach") else target
                )
        return loss

    def _make_pre_hook(self, s: int) -> Callable[..., None]:
        def hook(mod: Any, args: tuple[Any, ...]) -> None:
            if self.capture and self.cur == (s, "F", 0):
                self.captured_in[s] = tuple(
                    a.detach().clone().requires_grad_(a.requires_grad)
                    if hasattr(a, "detach")
                    else a
                    for a in args
                )

        return hook

    def _make_post_hook(self, s: int) -> Callable[..., None]:
        def hook(mod: Any, args: tuple[Any, ...], out: Any) -> None:
            if self.cur != (s, "F", 0) or not self.recording:
                return
            outs = out if isinstance(out, tuple) else (out,)
            if s not in self.act_shapes and hasattr(outs[0], "shape"):
                self.act_shapes[s] = (tuple(outs[0].shape), str(outs[0].dtype))
            if self.capture and s != self.last:
                slots: list[Any] = [None] * len(outs)
                self.captured_grads[s] = slots
                for i, t in enumerate(outs):
                    if getattr(t, "requires_grad", False):
                        t.register_hook(
                            lambda g, i=i, slots=slots: slots.__setitem__(i, g.detach().clone())
                        )

        return hook

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
            self.recording = step >= job.warmup_steps
            self.capture = step == total - 1
            self.beat.set_phase("measure" if self.recording else "warmup")
            x, y = self.data.train(step)
            x, y = _to(x, self.device), _to(y, self.device)
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
            before = [p.detach().clone() for s in self.my for p in self.params[s]]
            tok = self.clock.start()
            ow = time.perf_counter()
            self.opt.step()
            opt_cost = self.clock.stop(tok)
            self.clock.sync()
            ow = time.perf_counter() - ow
            oc = self.clock.resolve(opt_cost)
            pert = self._apf(before)
            if self.has_last:
                losses.append(float(torch.stack([lo.detach().float() for lo in mb_losses]).mean()))
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
        self.recording = self.capture = False
        self.beat.set_phase("costs")
        cost_rounds = self._group_costs()
        self.beat.tick(2 + total)
        self.beat.set_phase("lags")
        pingpong, shapes = self._pingpong()
        self.beat.tick(3 + total)
        val_after = self._val_loss()
        self.beat.tick(4 + total)
        val = (val_before, val_after) if self.has_last and job.val_batches > 0 else ()
        return RankResult(
            rank=self.rank,
            host=socket.gethostname(),
            device=_device_name(self.device),
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
            cost_modes={s: self._cost_mode(s) for s in self.my},
            pingpong=pingpong,
            act_shapes=shapes,
            data_provenance=dict(self.data.provenance) if self.rank == 0 else {},
            warnings=tuple(self.warnings),
        )

    def _combine_grads(self) -> dict[tuple[int, str], tuple[tuple[float, ...], float]]:
        """Sum the stashed per-microbatch gradients into `.grad` (mean over microbatches); return norms."""
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
            with torch.no_grad():
                for i, p in enumerate(params):
                    gs = [per_mb[mb][i] for mb in range(self.M) if per_mb[mb][i] is not None]
                    if gs:
                        total = torch.stack(gs).sum(0) if len(gs) > 1 else gs[0].clone()
                        p.grad = total.div_(self.M)
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

    def _cost_mode(self, s: int) -> str:
        """`split` when the stage's weight gradients run in W actions after an I (not stage 0), else `full`."""
        acts = [a for a in self.plan.rank_actions[self.rank] if a.stage == s]
        n_w = sum(a.kind == "W" for a in acts)
        n_b = sum(a.kind == "B" for a in acts)
        return "split" if s != 0 and n_w > n_b else "full"

    def _stage_graph(self, s: int) -> tuple[list[Any], list[Any] | None, list[Any]]:
        """A fresh forward of stage `s` on the captured microbatch: (outputs, output grads, inputs)."""
        import torch

        if s not in self.captured_in:
            raise RuntimeError(
                f"stage {s}: no microbatch input was captured for the cost measurement"
            )
        inp = tuple(
            a.detach().clone().requires_grad_(a.requires_grad) if hasattr(a, "detach") else a
            for a in self.captured_in[s]
        )
        with torch.enable_grad():
            raw = self.mods[s](*inp)
            if s == self.last:
                return [self.loss_fn(raw, self.captured_target)], None, list(inp)
        seq = list(raw) if isinstance(raw, tuple) else [raw]
        slots = self.captured_grads.get(s, [])
        pairs = [(t, g) for t, g in zip(seq, slots, strict=False) if g is not None]
        if not pairs:
            raise RuntimeError(
                f"stage {s}: no output gradient was captured for the cost measurement"
            )
        return [t for t, _ in pairs], [g for _, g in pairs], list(inp)

    def _group_costs(self) -> dict[int, dict[str, tuple[float, ...]]]:
        """Leave-one-out weight-gradient cost of every group of every local stage (see module docstring)."""
        out: dict[int, dict[str, tuple[float, ...]]] = {}
        for s in self.my:
            groups = self.group_idx[s]
            every = list(range(len(self.params[s])))
            mode = self._cost_mode(s)
            measure = self._split_w_ms if mode == "split" else self._full_backward_ms
            samples: dict[str, list[float]] = {"all": [], "none": []}
            for g, _ in groups:
                samples[g] = []
            graph = self._stage_graph(s) if mode == "full" else None
            for rnd in range(self.job.cost_samples + _COST_WARMUP_ROUNDS):
                a = measure(s, graph, every)
                loo = {
                    g: a - measure(s, graph, [i for i in every if i not in set(idx)])
                    for g, idx in groups
                }
                n = measure(s, graph, [])
                if rnd >= _COST_WARMUP_ROUNDS:
                    samples["all"].append(a)
                    samples["none"].append(n)
                    for g, v in loo.items():
                        samples[g].append(v)
                self.beat.tick()
            for p in self.params[s]:
                p.grad = None
            out[s] = {k: tuple(v) for k, v in samples.items()}
        return out

    def _full_backward_ms(self, s: int, graph: Any, active: Sequence[int]) -> float:
        """Cost of a full backward (input gradient plus params[active]) over the retained graph."""
        outs, grads, inputs = graph
        ins = [t for t in inputs if hasattr(t, "requires_grad") and t.requires_grad]
        return self._timed_grad(outs, grads, ins + [self.params[s][i] for i in active])

    def _split_w_ms(self, s: int, graph: Any, active: Sequence[int]) -> float:
        """Cost of torch's W step for params[active] after its I step, on a fresh forward (0 if none)."""
        from freezeopt import torch_pp

        if not active:
            return 0.0
        outs, grads, inputs = self._stage_graph(s)
        weight = torch_pp.split_backward(outs, grads, inputs, self.params[s])
        tok = self.clock.start()
        weight(active)
        cost = self.clock.stop(tok)
        self.clock.sync()
        return self.clock.resolve(cost)

    def _timed_grad(self, outs: list[Any], grads: list[Any] | None, targets: list[Any]) -> float:
        """Cost (ms) of one `autograd.grad` from `outs` to `targets` over the retained graph; 0 if no targets."""
        import torch

        if not targets:
            return 0.0
        tok = self.clock.start()
        torch.autograd.grad(outs, targets, grad_outputs=grads, retain_graph=True, allow_unused=True)
        cost = self.clock.stop(tok)
        self.clock.sync()
        return self.clock.resolve(cost)

    def _pingpong(
        self,
    ) -> tuple[dict[tuple[int, int], tuple[float, ...]], dict[int, tuple[tuple[int, ...], str]]]:
        """Round trips of each cross-rank activation's size between the two ranks (one pair at a time)."""
        import torch
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, self.act_shapes)
        shapes: dict[int, tuple[tuple[int, ...], str]] = {}
        for d in gathered:
            shapes.update(d)
        sr = self.plan.stage_rank
        pairs = sorted(
            {
                (sr[s], sr[s + 1], shapes[s])
                for s in range(self.plan.n_stages - 1)
                if sr[s] != sr[s + 1] and s in shapes
            }
        )
        out: dict[tuple[int, int], tuple[float, ...]] = {}
        for ra, rb, (shape, dtype) in pairs:
            dist.barrier()
            if self.rank not in (ra, rb):
                continue
            buf = torch.zeros(
                shape, dtype=getattr(torch, dtype.replace("torch.", "")), device=self.device
            )
            samples = []
            for i in range(_LAG_WARMUP + self.job.lag_samples):
                if self.rank == ra:
                    t0 = time.perf_counter()
                    dist.send(buf, rb)
                    dist.recv(buf, rb)
                    self.clock.sync()
                    if i >= _LAG_WARMUP:
                        samples.append((time.perf_counter() - t0) * 1e3 / 2)
                else:
                    dist.recv(buf, ra)
                    dist.send(buf, ra)
            self.beat.tick()
            if self.rank == ra:
                out[(ra, rb)] = tuple(samples)
        dist.barrier()
        return out, shapes

    def _val_loss(self) -> float | None:
        """Mean loss on the held-out batches: a plain forward pass, stage by stage across ranks."""
        import torch
        import torch.distributed as dist

        if self.job.val_batches == 0:
            return None
        self.beat.set_phase("validation")
        sr = self.plan.stage_rank
        vals: list[float] = []
        for m in self.mods.values():
            m.eval()
        try:
            with torch.no_grad():
                for i in range(self.job.val_batches):
                    x, y = self.data.val(i)
                    act: tuple[Any, ...] = ()
                    for s in self.my:
                        if s == 0:
                            inp: tuple[Any, ...] = (_to(x, self.device),)
                        elif sr[s - 1] == self.rank:
                            inp = act
                        else:
                            box: list[Any] = [None]
                            dist.recv_object_list(box, src=sr[s - 1])
                            inp = tuple(_to(t, self.device) for t in box[0])
                        out = self.mods[s](*inp)
                        if s == self.last:
                            vals.append(float(self.loss_fn(out, _to(y, self.device))))
                            continue
                        act = out if isinstance(out, tuple) else (out,)
                        if sr[s + 1] != self.rank:
                            dist.send_object_list(
                                [tuple(_to(t, "cpu") for t in act)], dst=sr[s + 1]
                            )
                    self.beat.tick()
        finally:
            for m in self.mods.values():
                m.train()
        return sum(vals) / len(vals) if vals else None


def _to(x: Any, device: Any) -> Any:
    return x.to(device) if hasattr(x, "to") else x


def _device_name(device: Any) -> str:
    if device.type == "cuda":
        import torch

        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"


def _rank_device(job: Job, local_rank: int) -> Any:
    import torch

    if job.device == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        return dev
    torch.set_num_threads(1)
    return torch.device("cpu")


def _init_pg(
    job: Job, rank: int, world: int, device: Any, init_method: str, timeout_s: float
) -> None:
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )


def _worker(
    job: Job,
    plan: _Plan,
    rank: int,
    world: int,
    init_method: str,
    fault: Fault | None,
    beat_arr: Any,
    q: Any,
    log_path: str,
) -> None:
    """Entry point of a spawned rank: run, then put ('result', rank, RankResult) or ('error', …) on `q`."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    beat = _Beat(beat_arr, rank)
    code = 0
    try:
        import torch.distributed as dist

        device = _rank_device(job, rank)
        _init_pg(job, rank, world, device, init_method, timeout_s=2 * job.hang_timeout_s)
        try:
            res = _Runner(job, plan, rank, world, device, fault, beat).run()
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        beat.set_phase("done")
        q.put(("result", rank, res))
    except BaseException as e:  # report everything, including KeyboardInterrupt, then exit non-zero
        code = 1
        traceback.print_exc()
        msg = _one_line(e)
        q.put(
            ("error", rank, time.monotonic(), beat.step, beat.phase, msg, isinstance(e, InputError))
        )
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        q.close()
        q.join_thread()
    os._exit(code)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    if first.startswith("[") and "gloo" in first and "]" in first:
        first = first.split("]", 1)[1].strip()
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


_CONN_WORDS = (
    "Connection closed by peer",
    "Connection reset",
    "Broken pipe",
    "timed out",
    "Timed out",
)


# --- launching ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch_local(
    job: Job, plan: _Plan, *, fault: Fault | None, progress: bool
) -> list[RankResult]:
    import torch.multiprocessing as mp

    world = job.ranks
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    beat_arr = ctx.Array("d", world * _BEAT_FIELDS, lock=False)
    now = time.monotonic()
    for r in range(world):
        beat_arr[r * _BEAT_FIELDS] = now
    logdir = Path(tempfile.mkdtemp(prefix="freezeopt-profile-"))
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        ctx.Process(
            target=_worker,
            args=(job, plan, r, world, init, fault, beat_arr, q, str(logdir / f"rank{r}.log")),
            name=f"freezeopt-rank{r}",
            daemon=True,
        )
        for r in range(world)
    ]
    total = job.warmup_steps + job.measure_steps + 4
    keep_logs = True
    try:
        for p in procs:
            p.start()
        with _progress_bar(progress, job.name, total) as update:
            results = _supervise(job, procs, q, beat_arr, logdir, update)
        keep_logs = False
        return results
    except InputError:  # a user error raised inside a rank: its one line says everything
        keep_logs = False
        raise
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 5
        for p in started:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1)
        q.close()
        if not keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)


@contextlib.contextmanager
def _progress_bar(enabled: bool, name: str, total: int) -> Iterator[Callable[[float, str], None]]:
    if not enabled:
        yield lambda done, phase: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]profiling {task.fields[name]}[/] {task.fields[phase]:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("profile", total=total, name=name, phase="start")

        def update(done: float, phase: str) -> None:
            bar.update(task, completed=min(done, total), phase=phase)

        yield update


def _supervise(
    job: Job,
    procs: list[Any],
    q: Any,
    beat_arr: Any,
    logdir: Path,
    update: Callable[[float, str], None],
) -> list[RankResult]:
    """Collect results; on a crash or hang raise one clear error naming the rank (see module docstring)."""
    world = len(procs)
    results: dict[int, RankResult] = {}
    errors: dict[int, tuple[float, int, str, str, bool]] = {}
    dead_since: dict[int, float] = {}
    first_bad: float | None = None
    t0 = time.monotonic()
    while len(results) < world:
        try:
            msg = q.get(timeout=0.2)
        except queue_mod.Empty:
            msg = None
        now = time.monotonic()
        if msg is not None:
            if msg[0] == "result":
                results[msg[1]] = msg[2]
            else:
                _, r, ts, step, phase, text, is_input = msg
                errors.setdefault(r, (ts, step, phase, text, is_input))
                first_bad = first_bad or now
            continue
        for r, p in enumerate(procs):
            if p.exitcode is not None and r not in results and r not in errors:
                dead_since.setdefault(r, now)
                if now - dead_since[r] > 2.0:  # its report never came: it died without one
                    how = (
                        f"killed by signal {-p.exitcode}"
                        if p.exitcode < 0
                        else f"exit code {p.exitcode}"
                    )
                    b = _read_beat(beat_arr, r)
                    errors[r] = (
                        b.ts,
                        b.step,
                        b.phase,
                        f"the process died ({how}) without reporting an error",
                        False,
                    )
                    first_bad = first_bad or now
        if (
            errors
            and first_bad is not None
            and (now - first_bad > 1.5 or all(p.exitcode is not None for p in procs))
        ):
            raise _failure(errors, logdir)
        views = [_read_beat(beat_arr, r) for r in range(world)]
        live = [r for r in range(world) if r not in results]
        stale = [r for r in live if now - views[r].ts > _hang_limit(job, views[r])]
        stuck = [r for r in stale if views[r].computing]
        if stuck or (live and len(stale) == len(live)):
            raise _hang(job, views, stuck or stale, live, logdir)
        if now - t0 > job.timeout_s:
            slow = min(live, key=lambda r: views[r].units)
            raise RankFailedError(
                f"profiling took longer than timeout_s={job.timeout_s:g} s (slowest: rank {slow} in {views[slow].phase}); "
                f"every rank was stopped and no profile was written (rank logs: {logdir})",
                rank=slow,
                cause="timeout",
            )
        slowest = min(views, key=lambda v: v.units)
        update(slowest.units, slowest.phase)
    return [results[r] for r in range(world)]


def _hang_limit(job: Job, view: _BeatView) -> float:
    """How long a rank may go without a heartbeat: starting Python and torch gets at least 2 minutes."""
    return (
        max(job.hang_timeout_s, _STARTUP_GRACE_S) if view.phase == "start" else job.hang_timeout_s
    )


def _failure(errors: dict[int, tuple[float, int, str, str, bool]], logdir: Path) -> FreezeoptError:
    """The root cause among the ranks' errors: a non-connection error first, then the earliest."""
    ranked = sorted(
        errors.items(), key=lambda kv: (any(w in kv[1][3] for w in _CONN_WORDS), kv[1][0])
    )
    r, (_, step, phase, text, is_input) = ranked[0]
    if is_input:
        return InputError(f"rank {r}: {text.split(': ', 1)[-1]}")
    where = f"step {step} ({phase})" if step >= 0 else phase
    return RankFailedError(
        f"rank {r} failed in {where}: {text}; every rank was stopped and no profile was written "
        f"(rank log: {logdir / f'rank{r}.log'})",
        rank=r,
        cause=text,
    )


def _hang(
    job: Job, views: list[_BeatView], suspects: list[int], live: list[int], logdir: Path
) -> RankFailedError:
    r = min(suspects, key=lambda k: (not views[k].computing, views[k].ts))
    v = views[r]
    doing = (
        f"in action {v.action} of step {v.step}" if v.computing else f"in {v.phase} (step {v.step})"
    )
    others = [k for k in live if k != r]
    tail = ""
    if len(others) == 1:
        tail = f"; rank {others[0]} was waiting"
    elif others:
        tail = f"; ranks {', '.join(map(str, others))} were waiting"
    return RankFailedError(
        f"rank {r} hung {doing}: no progress for {job.hang_timeout_s:g} s{tail}; every rank was stopped and no "
        f"profile was written (raise hang_timeout_s if actions really take that long; rank log: {logdir / f'rank{r}.log'})",
        rank=r,
        cause="hang",
    )


def _in_torchrun() -> bool:
    """True when launched by torchrun (or another launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _profile_torchrun(
    job: Job, plan: _Plan, *, out: Path, fault: Fault | None, t_start: float, progress: bool
) -> ProfileReport:
    """This process is one rank of a torchrun job: measure, gather on rank 0, rank 0 writes the file."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != job.ranks:
        raise InputError(
            f"torchrun started {world} processes but the job has ranks: {job.ranks}; make them equal"
        )
    device = _rank_device(job, int(os.environ.get("LOCAL_RANK", "0")))
    host = _host_info()
    _init_pg(job, rank, world, device, "env://", timeout_s=job.hang_timeout_s)
    try:
        beat = _Beat([0.0] * (world * _BEAT_FIELDS), rank)
        res = _Runner(job, plan, rank, world, device, fault, beat).run()
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(res, gathered, dst=0)
        box: list[Any] = [None]
        if rank == 0:
            assert gathered is not None
            host["load_avg_after"] = _load_avg()
            try:
                profile, report = _assemble(
                    job, plan, gathered, out=out, host=host, wall_s=time.monotonic() - t_start
                )
                save_profile(profile, out)
                box[0] = report
            except FreezeoptError as e:
                box[0] = str(e)
        dist.broadcast_object_list(box, src=0)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    if isinstance(box[0], str):
        raise FreezeoptError(box[0])
    summary: ProfileReport = box[0]
    return summary


def _load_avg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def _cpu_snapshot() -> tuple[float, float] | None:
    """(busy CPU-seconds of the whole machine, CPU-seconds of this process and its reaped children)."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    busy = v[0] + v[1] + v[2] + sum(v[5:8])  # user, nice, system, irq, softirq, steal
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    return busy / os.sysconf("SC_CLK_TCK"), ours


def _other_cpu(
    before: tuple[float, float] | None, after: tuple[float, float] | None, wall: float
) -> dict[str, Any]:
    """CPU time other processes used while the ranks ran (Linux; empty elsewhere)."""
    if before is None or after is None or wall <= 0:
        return {}
    other = max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
    return {"other_cpu_s": other, "other_cpu_cores": other / wall}


def _host_info() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {"cpus": os.cpu_count(), "usable_cpus": usable, "load_avg_before": _load_avg()}


# --- assembling the profile ---------------------------------------------------------------------


def _pct(v: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of sorted `v`."""
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _stat(xs: Sequence[float], *, scale: float = 1.0) -> Stat:
    v = sorted(max(0.0, x * scale) for x in xs)
    return Stat(median=statistics.median(v), p10=_pct(v, 10), p90=_pct(v, 90), n=len(v))


def _order_key(a: Action) -> tuple[int, int, int]:
    return (a.stage, a.microbatch, "FBIW".index(a.kind))


@dataclass(slots=True)
class _Run:
    """Per measured step: each action's (rank, start, end, cost) and each rank's executed order."""

    steps: list[dict[Action, tuple[int, float, float, float]]] = field(default_factory=list)
    orders: list[list[list[Action]]] = field(default_factory=list)


def _collect(plan: _Plan, results: Sequence[RankResult], n_steps: int) -> _Run:
    run = _Run()
    for _ in range(n_steps):
        run.steps.append({})
        run.orders.append([[] for _ in results])
    for res in results:
        for k, s, kind, mb, t0, t1, cost in res.records:
            a = Action(s, kind, mb)  # type: ignore[arg-type]
            run.steps[k][a] = (res.rank, t0, t1, cost)
            run.orders[k][res.rank].append(a)
    return run


def _assemble(
    job: Job,
    plan: _Plan,
    results: Sequence[RankResult],
    *,
    out: Path,
    host: dict[str, Any],
    wall_s: float,
) -> tuple[Profile, ProfileReport]:
    from freezeopt.dag import build_dag
    from freezeopt.simulate import simulate
    from freezeopt.torch_pp import torch_version

    n_steps = job.measure_steps
    run = _collect(plan, results, n_steps)
    warnings: list[str] = [w for r in results for w in r.warnings]
    others = host.get("other_cpu_cores")
    if others is not None and others > _OTHERS_BUSY:
        warnings.append(
            f"other processes kept {others:.2f} cores busy during the run; timings are unreliable, "
            "re-profile on a quiet machine"
        )

    # executed order versus the schedule
    mismatches: list[str] = []
    for r in range(job.ranks):
        expected = list(plan.rank_actions[r])
        for k in range(n_steps):
            got = run.orders[k][r]
            if got != expected:
                i = next(
                    (j for j, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                    min(len(got), len(expected)),
                )
                exp = str(expected[i]) if i < len(expected) else "end"
                gotten = str(got[i]) if i < len(got) else "end"
                mismatches.append(
                    f"rank {r} step {k}: position {i} ran {gotten}, schedule says {exp}"
                )
                break
    executed = [list(run.orders[0][r]) for r in range(job.ranks)]
    all_actions = sorted({a for st in run.steps for a in st}, key=_order_key)

    costs = {a: [st[a][3] for st in run.steps if a in st] for a in all_actions}
    walls = {a: [(st[a][2] - st[a][1]) * 1e3 for st in run.steps if a in st] for a in all_actions}
    action_costs = tuple(ActionCost(action=str(a), cost_ms=_stat(costs[a])) for a in all_actions)
    cost_med = {a: statistics.median(costs[a]) for a in all_actions}

    # step time and timeline
    same_host = len({r.host for r in results}) == 1
    step_ms: list[float] = []
    starts: list[float] = []
    for k in range(n_steps):
        if same_host:
            s0 = min(r.step_bounds[k][0] for r in results)
            step_ms.append((max(r.step_bounds[k][1] for r in results) - s0) * 1e3)
            starts.append(s0)
        else:
            step_ms.append(max(r.step_bounds[k][1] - r.step_bounds[k][0] for r in results) * 1e3)
            starts.append(0.0)
    med_step = sorted(range(n_steps), key=lambda k: (step_ms[k], k))[(n_steps - 1) // 2]
    timeline: list[TimelineEntry] = []
    for a in sorted(run.steps[med_step], key=lambda a: (run.steps[med_step][a][1], _order_key(a))):
        rk, t0, t1, _ = run.steps[med_step][a]
        base = starts[med_step] if same_host else results[rk].step_bounds[med_step][0]
        timeline.append(
            TimelineEntry(
                action=str(a),
                rank=rk,
                start_ms=max(0.0, (t0 - base) * 1e3),
                end_ms=max(0.0, (t1 - base) * 1e3),
            )
        )

    # lags
    lags, lag_detail = _lags(plan, run, results, same_host)

    # stages and groups
    rank_of_stage = plan.stage_rank
    group_meta = {(s, g): (names, numel) for r in results for s, g, names, numel in r.groups}
    rounds = {s: d for r in results for s, d in r.cost_rounds.items()}
    modes = {s: m for r in results for s, m in r.cost_modes.items()}
    stages: list[StageProfile] = []
    group_detail: dict[str, Any] = {}
    for s in range(plan.n_stages):
        names = [g for (st, g) in group_meta if st == s]
        meds = {g: statistics.median(rounds[s][g]) for g in names}
        total = sum(max(0.0, v) for v in meds.values())
        wb = [cost_med[a] for a in all_actions if a.stage == s and a.kind in ("B", "W")]
        cap = min(wb) if wb else total
        scale = 1.0
        # the file rounds to 6 digits: keep the sum safely below the action
        fit = cap * (1 - _FIT_MARGIN)
        if total > fit > 0:
            scale = fit / total
            warnings.append(
                f"stage {s}: group costs ({total:.2f} ms) exceeded its fastest weight-gradient action "
                f"({cap:.2f} ms); scaled by {scale:.3f}"
            )
        all_ms = statistics.median(rounds[s]["all"])
        none_ms = statistics.median(rounds[s]["none"])
        group_detail[str(s)] = {
            "measured_in": modes[s],
            "all_groups_ms": all_ms,
            "no_groups_ms": none_ms,
            "weight_grad_ms": all_ms - none_ms,
            "groups_sum_ms": total,
            "scaled_by": scale,
            "pipeline_weight_actions_min_ms": cap,
        }
        groups = tuple(
            GroupProfile(
                name=g,
                params=group_meta[(s, g)][0],
                numel=group_meta[(s, g)][1],
                weight_grad_ms=_stat(rounds[s][g], scale=scale),
            )
            for g in names
        )
        stages.append(StageProfile(stage=s, rank=rank_of_stage[s], groups=groups))

    # gradient traces
    traces: list[GradientTrace] = []
    if job.gradient_traces:
        mb_sq = {k: v for r in results for k, v in r.mb_sq.items()}
        st_sq = {k: v for r in results for k, v in r.step_sq.items()}
        apf = {k: v for r in results for k, v in r.apf.items()}
        for s in range(plan.n_stages):
            for g in (g for (st, g) in group_meta if st == s):
                traces.append(
                    GradientTrace(
                        stage=s,
                        group=g,
                        microbatch_sq_norms=mb_sq[(s, g)],
                        step_sq_norms=st_sq[(s, g)],
                        effective_perturbation=apf.get((s, g), ()),
                    )
                )
    last_rank = rank_of_stage[-1]
    all_losses = results[last_rank].losses
    loss = tuple(all_losses[job.warmup_steps :])
    device = results[0].device
    ranks = tuple(
        RankProfile(
            rank=r,
            actions=tuple(str(a) for a in executed[r]),
            optimizer_ms=_stat(results[r].optimizer_ms),
        )
        for r in range(job.ranks)
    )
    extra: dict[str, Any] = {
        "profiler": "freezeopt.profile",
        "cost_clock": "cuda-events" if device.startswith("cuda") else "thread-cpu",
        "host": host,
        "data": results[0].data_provenance,
        "order_check": {"matches_schedule": not mismatches, "mismatches": mismatches},
        "group_costs": {
            "method": "leave-one-out on a captured microbatch: full backward (autograd.grad) or torch's W step",
            "stages": group_detail,
        },
        "lags": lag_detail,
        "train_loss_all_steps": list(all_losses),
        "val_loss_at_step": [0, job.warmup_steps + job.measure_steps]
        if results[last_rank].val_loss
        else [],
        "step_ms_samples": step_ms,
        "optimizer_wall_ms": {str(r.rank): statistics.median(r.optimizer_wall_ms) for r in results},
        "apf_alpha": APF_ALPHA,
        "stage_0_backward_in_w": any(a.stage == 0 and a.kind == "W" for a in all_actions),
    }
    if plan.csv_path is not None:
        extra["schedule_csv"] = Path(plan.csv_path).read_text()
    profile = Profile(
        schema_version=1,
        provenance=Provenance(
            source="measured",
            freezeopt=__version__,
            python=platform.python_version(),
            torch=torch_version(),
            device=device,
            job=job.to_dict(),
            job_sha256=job_sha256(job),
            seed=job.seed,
            steps_measured=n_steps,
        ),
        pipeline=Pipeline(
            schedule=plan.label,
            world_size=job.ranks,
            n_stages=plan.n_stages,
            n_microbatches=job.microbatches,
            microbatch_size=job.microbatch_size,
        ),
        ranks=ranks,
        actions=action_costs,
        stages=tuple(stages),
        lags=tuple(lags),
        gradients=tuple(traces),
        loss=loss,
        val_loss=results[last_rank].val_loss,
        step_ms=_stat(step_ms),
        extra=extra,
        timeline=tuple(timeline),
    )

    # self-check: the DAG's prediction from the measured costs versus the measured step time
    dag = build_dag(profile)
    predicted = simulate(dag).makespan
    wall_med = {a: statistics.median(walls[a]) for a in all_actions}
    predicted_wall = simulate(dag, wall_med).makespan
    measured = statistics.median(step_ms)
    err = (predicted - measured) / measured if measured > 0 else 0.0
    ratios = [
        w / c for a in all_actions for w, c in zip(walls[a], costs[a], strict=True) if c > 0.5
    ]
    inflation = statistics.median(ratios) if ratios else 1.0
    explanation = None
    if abs(err) > SELF_CHECK_TOLERANCE:
        explanation = _explain(err, inflation, job.ranks, host, predicted_wall, measured)
    extra["self_check"] = {
        "measured_step_ms": measured,
        "predicted_step_ms": predicted,
        "error": err,
        "predicted_from_wall_ms": predicted_wall,
        "wall_over_cost": inflation,
        "tolerance": SELF_CHECK_TOLERANCE,
        "explanation": explanation,
    }
    profile = replace(profile, extra=extra)

    summary: list[tuple[int, int, str, float, float, int]] = []
    for s in range(plan.n_stages):
        for kind in "FBIW":
            acts = [a for a in all_actions if a.stage == s and a.kind == kind]
            if acts:
                summary.append(
                    (
                        s,
                        rank_of_stage[s],
                        kind,
                        statistics.median(cost_med[a] for a in acts),
                        statistics.median(wall_med[a] for a in acts),
                        len(acts),
                    )
                )
    report = ProfileReport(
        path=out,
        job=job.name,
        schedule=plan.label,
        world_size=job.ranks,
        n_stages=plan.n_stages,
        n_microbatches=job.microbatches,
        steps_measured=n_steps,
        device=device,
        measured_step_ms=measured,
        predicted_step_ms=predicted,
        error=err,
        explanation=explanation,
        action_ms=tuple(summary),
        group_ms=tuple(
            (st.stage, g.name, g.weight_grad_ms.median) for st in stages for g in st.groups
        ),
        lags_ms=tuple(
            (
                lg.src_stage,
                lg.dst_stage,
                lg.kind,
                lg.ms.median,
                lag_detail[f"{lg.src_stage}->{lg.dst_stage}"]["method"],
            )
            for lg in lags
        ),
        optimizer_ms=tuple(rp.optimizer_ms.median for rp in ranks if rp.optimizer_ms is not None),
        loss=loss,
        val_loss=results[last_rank].val_loss,
        order_ok=not mismatches,
        order_mismatches=tuple(mismatches),
        warnings=tuple(warnings),
        wall_s=wall_s,
    )
    return profile, report


def _explain(
    err: float,
    inflation: float,
    world: int,
    host: dict[str, Any],
    predicted_wall: float,
    measured: float,
) -> str:
    """Why the DAG's prediction misses the measured step time, most likely cause first."""
    cores = host.get("usable_cpus") or host.get("cpus") or 1
    wall_err = (predicted_wall - measured) / measured if measured > 0 else 0.0
    others = host.get("other_cpu_cores")
    reasons: list[str] = []
    if world > cores:
        reasons.append(
            f"{world} ranks share {cores} cores, so a rank that is ready often waits for a core "
            "(costs are CPU time, the step is wall time)"
        )
    if others is not None and others > _OTHERS_BUSY:
        reasons.append(
            f"other processes kept {others:.2f} cores busy during the run (measure on a quiet machine)"
        )
    if inflation > 1.1:
        reasons.append(f"actions took {inflation:.2f}× longer in wall time than in CPU time")
    if err < 0:
        reasons.append(
            "the DAG leaves out time between actions (Python scheduling, posting sends and receives, "
            "waits inside torch's batched send/recv), which weighs more the shorter the actions"
        )
    else:
        reasons.append("measured lags or costs are pessimistic for this run")
    return (
        "; ".join(reasons)
        + f"; with wall-clock durations the DAG predicts {predicted_wall:.1f} ms ({wall_err * 100:+.1f} %)"
    )


def _lags(
    plan: _Plan, run: _Run, results: Sequence[RankResult], same_host: bool
) -> tuple[list[Lag], dict[str, Any]]:
    """Cross-rank edge lags from the wall timeline, ping-pong where the timeline has too few samples."""
    sr = plan.stage_rank
    ping: dict[tuple[int, int], tuple[float, ...]] = {}
    for r in results:
        for (ra, rb), v in r.pingpong.items():
            ping[(ra, rb)] = v
            ping.setdefault((rb, ra), v)
    prev: list[dict[Action, Action | None]] = []
    for k in range(len(run.steps)):
        d: dict[Action, Action | None] = {}
        for order in run.orders[k]:
            for i, a in enumerate(order):
                d[a] = order[i - 1] if i > 0 else None
        prev.append(d)

    def ingrad(k: int, s: int, m: int) -> Action:
        b = Action(s, "B", m)
        return b if b in run.steps[k] else Action(s, "I", m)

    lags: list[Lag] = []
    detail: dict[str, Any] = {}
    n_mb = max((a.microbatch for st in run.steps for a in st), default=-1) + 1
    for s in range(plan.n_stages - 1):
        if sr[s] == sr[s + 1]:
            continue
        for kind, src, dst in (("F", s, s + 1), ("B", s + 1, s)):
            samples: list[float] = []
            if same_host:
                for k, st in enumerate(run.steps):
                    for m in range(n_mb):
                        prod = Action(s, "F", m) if kind == "F" else ingrad(k, s + 1, m)
                        cons = Action(s + 1, "F", m) if kind == "F" else ingrad(k, s, m)
                        if prod not in st or cons not in st:
                            continue
                        before = prev[k].get(cons)
                        if before is None or st[before][2] <= st[prod][2]:
                            samples.append((st[cons][1] - st[prod][2]) * 1e3)
            pp = ping.get((sr[src], sr[dst]), ())
            if len(samples) >= _MIN_LAG_SAMPLES:
                stat, method = _stat(samples), "timeline"
            elif pp:
                stat, method = _stat(pp), "ping-pong"
            else:
                continue
            lags.append(Lag(src_stage=src, dst_stage=dst, kind=kind, ms=stat))  # type: ignore[arg-type]
            detail[f"{src}->{dst}"] = {
                "kind": kind,
                "method": method,
                "timeline_samples": len(samples),
                "timeline_median_ms": statistics.median(samples) if samples else None,
                "pingpong_one_way_ms": statistics.median(pp) if pp else None,
            }
    return lags, detail
