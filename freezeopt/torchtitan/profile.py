"""Profile mode of `FreezeTrainer`: a torchtitan job measured into a freezeopt profile.

With `[freeze] profile = "out/profile.json"` torchtitan trains as usual, and its first
`profile_warmup_steps + profile_steps` steps are measured as `freezeopt profile` measures a job
(`freezeopt.profiling.run`), on torchtitan's own stages, schedule, loss, data and optimizer:

* actions: each stage's forward, backward and weight-gradient calls are timed
  (`instrument_stage`; thread CPU time on CPU, CUDA events on GPU), the last stage's loss counted
  in its forward; each step's pipeline step runs from a barrier, the optimizer step is timed apart;
* gradient traces: each backward action's gradients are moved aside after it (so each is that
  microbatch's alone) and summed back into `.grad` in the order the backwards ran when the
  pipeline step ends, before torchtitan clips and steps; divided by the microbatch's token count
  (torchtitan backpropagates the token sum) they are the gradients of each microbatch's mean loss, as freezeopt's own
  profiler records them, and the step's is the sum over the step's tokens. This holds every
  microbatch's gradient until the step ends (memory: microbatches × parameters);
* after the last measured step: each group's weight-gradient cost and what backward truncation
  saves, on microbatch 0 of that step (`freezeopt.profiling.group_costs`), and the lag ping-pong
  (`freezeopt.profiling.lags`); then rank 0 assembles and writes the profile
  (`freezeopt.profiling.assemble`, with its self-check) and prints its report. Training goes on
  to `training.steps` (set it to the sum to stop there).

Measured on the pipeline alone: every rank a pipeline rank (data, tensor, context and expert
parallel degrees 1). FSDP2 adds collectives inside the actions and keeps a microbatch's gradient
in unsharded copies the hooks do not see; the schedule solved from this profile trains the
FSDP2-sharded job (its stages and groups are the same). Not measured here: the held-out probe and
branch runs (`solve` then picks the `gns` sensitivity and the step objective), APF's effective
perturbation and the validation loss.
"""

from __future__ import annotations

import math
import re
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from freezeopt.errors import DivergedError, FreezeoptError, InputError, MismatchError
from freezeopt.fileio import check_output_file
from freezeopt.formats.fingerprint import fingerprint
from freezeopt.torchpp.adapter import (
    SCHEDULE_NAMES,
    instrument_stage,
    schedule_microbatches,
    schedule_stages,
    wrap_schedule_loss,
)
from freezeopt.torchpp.job import Job
from freezeopt.torchpp.pipeline import Clock, device_name, plan_pipeline
from freezeopt.torchtitan.groups import stage_groups

__all__ = ["Profiler", "titan_job"]


class _NoProgress:
    """The progress calls of the shared measurements; torchtitan logs its own progress."""

    def tick(self, *_: Any) -> None:
        return None


def titan_job(job_config: Any, cfg: Any, n_stages_here: int, device: Any) -> Job:
    """The torchtitan job as a freezeopt `Job`: what the profile's provenance records, and the
    pipeline shape (`plan_pipeline`) its measurements are checked against."""
    par, model, training = job_config.parallelism, job_config.model, job_config.training
    if par.pipeline_parallel_schedule_csv:
        schedule = str(Path(par.pipeline_parallel_schedule_csv).resolve())
    else:
        schedule = _schedule_name(par.pipeline_parallel_schedule)
    mbs = par.pipeline_parallel_microbatch_size
    name = re.sub(r"[^A-Za-z0-9._-]", "-", f"torchtitan-{model.name}-{model.flavor}")[:100]
    return Job(
        name=name,
        model=f"torchtitan:{model.name}",
        model_args={"flavor": model.flavor},
        data=f"torchtitan:{training.dataset}",
        data_args={"dataset_path": training.dataset_path or None},
        schedule=schedule,
        ranks=par.pipeline_parallel_degree,
        stages_per_rank=n_stages_here,
        microbatches=training.local_batch_size // mbs,
        batch_size=training.local_batch_size,
        seq_len=training.seq_len,
        lr=job_config.optimizer.lr,
        weight_decay=job_config.optimizer.weight_decay,
        seed=job_config.debug.seed or 0,
        warmup_steps=cfg.profile_warmup_steps,
        measure_steps=cfg.profile_steps,
        device="cuda" if device.type == "cuda" else "cpu",
        val_batches=0,
        probe_batches=0,
        branch_steps=0,
        gradient_traces=True,
    )


def _schedule_name(name: str) -> str:
    """torchtitan's schedule name as freezeopt spells it (torch's names are case-insensitive)."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    cls = get_schedule_class(name)
    for known in SCHEDULE_NAMES:
        if get_schedule_class(known) is cls:
            return known
    raise InputError(
        f"freezeopt does not model torchtitan's schedule {name!r}: use one of "
        f"{', '.join(SCHEDULE_NAMES)}, or a schedule CSV"
    )


def _sq(tensors: Any) -> float:
    """The squared L2 norm of these tensors together (None: no gradient, 0)."""
    return sum(float(t.double().pow(2).sum()) for t in tensors if t is not None)


class Profiler:
    """One rank of a torchtitan job, measured (the module docstring)."""

    def __init__(self, trainer: Any, cfg: Any) -> None:
        import torch.distributed as dist

        pd, jc = trainer.parallel_dims, trainer.job_config
        if not pd.pp_enabled:
            raise InputError(
                "a profile measures a pipeline: set parallelism.pipeline_parallel_degree to 2 or more"
            )
        if dist.get_world_size() != pd.pp:
            raise InputError(
                "profile mode measures the pipeline alone: set the data (shard and replicate), "
                "tensor, context and expert parallel degrees to 1 for the profiling run (the "
                "schedule solved from it trains the FSDP2-sharded job too: its stages are the same)"
            )
        if trainer.gradient_accumulation_steps != 1:
            raise InputError(
                f"gradient accumulation ({trainer.gradient_accumulation_steps} steps) is not "
                "supported in profile mode: set training.global_batch_size to "
                "training.local_batch_size"
            )
        attn = getattr(getattr(trainer, "model_args", None), "attn_type", "sdpa")
        if attn != "sdpa":
            raise InputError(
                f"profile mode measures models with sdpa attention, and this flavor uses {attn} "
                "(its masks travel as keyword arguments the cost measurement does not replay): "
                "profile an sdpa flavor of the same sizes"
            )
        w, n = cfg.profile_warmup_steps, cfg.profile_steps
        if w < 1 or n < 1:
            raise InputError(
                f"freeze.profile_warmup_steps ({w}) and freeze.profile_steps ({n}) must be 1 or more"
            )
        if jc.training.steps < w + n:
            raise InputError(
                f"profiling takes {w} + {n} steps but training.steps is {jc.training.steps}: set "
                f"training.steps to {w + n} or more, or measure fewer (freeze.profile_steps)"
            )
        self.out = Path(cfg.profile)
        check_output_file(self.out, "freeze.profile")
        self.trainer = trainer
        self.rank = pd.get_mesh("pp").get_local_rank()
        self.stages = schedule_stages(trainer.pp_schedule)
        self.my = tuple(st.stage_index for st in self.stages)
        self.device = trainer.device
        self.job = titan_job(jc, cfg, len(self.stages), self.device)
        self.plan = plan_pipeline(self.job)
        if self.plan.stages_of(self.rank) != self.my:
            raise MismatchError(
                f"torchtitan put stages {list(self.my)} on pipeline rank {self.rank}, but torch's "
                f"{self.plan.label} schedule runs {list(self.plan.stages_of(self.rank))} there: "
                "freezeopt cannot model this placement"
            )
        self.M = schedule_microbatches(trainer.pp_schedule)
        self.last = self.plan.n_stages - 1
        self.clock = Clock(self.device)
        self.t_start = time.monotonic()

        from freezeopt.profiling.group_costs import Capture

        self.cur: tuple[int, str, int] | None = None
        self.cap = Capture(self.last, lambda: self.cur)
        self.mods: dict[int, Any] = {}
        self.params: dict[int, list[Any]] = {}
        self.group_idx: dict[int, list[tuple[str, list[int]]]] = {}
        self.group_meta: list[tuple[int, str, tuple[str, ...], int, str]] = []
        self.all_grouped: dict[int, bool] = {}
        for st in self.stages:
            s, mod = st.stage_index, st.submod
            named = [(n, p) for n, p in mod.named_parameters() if p.requires_grad]
            pos = {n: i for i, (n, _) in enumerate(named)}
            found = stage_groups(mod)
            self.mods[s], self.params[s] = mod, [p for _, p in named]
            self.group_idx[s] = [(g, [pos[n] for n in members]) for g, members in found.items()]
            for g, members in found.items():
                ps = [named[pos[n]][1] for n in members]
                numel = sum(p.numel() for p in ps)
                self.group_meta.append((s, g, tuple(members), int(numel), fingerprint(ps)))
            self.all_grouped[s] = sum(len(m) for m in found.values()) == len(named)
            instrument_stage(st, self._around(s))
            self.cap.hook(mod, s)
        wrap_schedule_loss(trainer.pp_schedule, self._wrap_loss)
        self.loss_fn = trainer.loss_fn
        opt = trainer.optimizers
        self._opt_step = opt.step
        opt.step = self._timed_optimizer_step

        self.first: int | None = None  # torchtitan's step profiling started at
        self.step_idx = -1  # steps since then
        self.recording = False
        self.active = False  # inside a training step's pipeline step (not validation's)
        self.done = False
        self.order: dict[int, list[int]] = {}
        self.records: list[list[Any]] = []
        self.stash: dict[int, list[list[Any]]] = {}
        self.pending_loss: list[Any] | None = None
        self.tokens: list[float] = []
        self.sq: dict[tuple[int, str], list[float]] = {}
        self.bounds: list[tuple[float, float]] = []
        self.opt_ms: list[float] = []
        self.opt_wall: list[float] = []
        self.losses: list[float] = []
        self.mb_sq: dict[tuple[int, str], list[tuple[float, ...]]] = {}
        self.step_sq: dict[tuple[int, str], list[float]] = {}
        if dist.get_rank() == 0:
            print(
                f"freezeopt: profiling {self.plan.label} ({self.plan.n_stages} stages, {self.M} "
                f"microbatches): {n} steps measured after {w} of warm-up; the profile goes to "
                f"{self.out}",
                file=sys.stderr,
                flush=True,
            )

    # -- instrumentation --

    def _around(self, s: int) -> Callable[[str, int, Callable[[], Any]], Any]:
        def around(kind: str, mb: int, run: Callable[[], Any]) -> Any:
            if not self.active:  # validation's forwards, and everything once profiling is done
                return run()
            self.cur = (s, kind, mb)
            out, t0, t1, cost = self.clock.timed(run)
            self.cur = None
            rec = [self.step_idx - self.job.warmup_steps, s, kind, mb, t0, t1, cost]
            if self.recording:
                self.records.append(rec)
                if kind != "F":
                    self._stash(s, mb)
            self.pending_loss = rec if (kind == "F" and s == self.last) else None
            return out

        return around

    def _wrap_loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        def loss(output: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            tok = self.clock.start()
            value = loss_fn(output, target, *args, **kwargs)
            rec, self.pending_loss = self.pending_loss, None
            if rec is not None:  # the loss belongs to the forward just timed
                rec[5] = time.perf_counter()
                rec[6] = self.clock.extend(rec[6], tok)
                if self.cap.on and rec[3] == 0:
                    self.cap.take_target(target)
            return value

        return loss

    def _stash(self, s: int, mb: int) -> None:
        """Move the gradients the backward action of microbatch `mb` left aside (a pointer move,
        after the action's timing): each backward starts from no gradient, so each stashed one
        is that microbatch's alone. The order the microbatches' gradients came in is kept: it is
        the order autograd would have summed them in."""
        slot = self.stash[s][mb]
        for i, p in enumerate(self.params[s]):
            if p.grad is not None:
                slot[i] = p.grad if slot[i] is None else slot[i] + p.grad
                p.grad = None
                if mb not in self.order[s]:
                    self.order[s].append(mb)

    def _timed_optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        tok = self.clock.start()
        w0 = time.perf_counter()
        out = self._opt_step(*args, **kwargs)
        cost = self.clock.stop(tok)
        self.clock.sync()
        if self.recording:
            self.opt_wall.append((time.perf_counter() - w0) * 1e3)
            self.opt_ms.append(self.clock.resolve(cost))
        return out

    # -- a step --

    def begin(self, step: int) -> None:
        """Before torchtitan's step `step` (0-based; a job resumed from a checkpoint starts
        profiling where it resumed)."""
        if self.done:
            return
        if self.first is None:
            self.first = step
        k = self.step_idx = step - self.first
        w = self.job.warmup_steps
        self.recording = self.cap.recording = w <= k < w + self.job.measure_steps
        self.cap.on = k == w + self.job.measure_steps - 1
        self.stash = {s: [[None] * len(self.params[s]) for _ in range(self.M)] for s in self.my}
        self.order = {s: [] for s in self.my}

    def forward_backward(self, run: Callable[[], Any], labels: Any) -> Any:
        """torchtitan's pipeline step (`run`), timed from a barrier, with the step's gradient
        traces taken after it (`labels`: the step's, to count each microbatch's tokens)."""
        import torch
        import torch.distributed as dist
        from torchtitan.components.loss import IGNORE_INDEX

        if self.done:
            return run()
        if not self.recording:
            self.active = True
            try:
                loss = run()
            finally:
                self.active = False
            if self.last in self.my:  # the profile keeps the warm-up's losses too
                self.losses.append(float(loss.detach().double().sum()))
            return loss
        self.tokens = [float((c != IGNORE_INDEX).sum()) for c in torch.tensor_split(labels, self.M)]
        n_rec = len(self.records)
        dist.barrier()
        t0 = time.perf_counter()
        self.active = True
        try:
            loss = run()
        finally:
            self.active = False
        self.clock.sync()
        t1 = time.perf_counter()
        for rec in self.records[n_rec:]:
            rec[6] = self.clock.resolve(rec[6])
        self.bounds.append((t0, t1))
        self._restore_grads()
        if self.last in self.my:
            self.losses.append(float(loss.detach().double().sum()))
        return loss

    def _restore_grads(self) -> None:
        """Each parameter's `.grad` back to the sum of its microbatches' gradients, summed in the
        order their backwards ran, as autograd sums them, before torchtitan clips and steps; and
        the step's gradient traces: per group the squared norm of each microbatch's mean-loss
        gradient (its token-sum gradient over its tokens) and of the step's (the sum over all
        the step's tokens)."""
        total = max(sum(self.tokens), 1.0)
        for s in self.my:
            per_mb = self.stash[s]
            for i, p in enumerate(self.params[s]):
                acc = None
                for mb in self.order[s]:
                    g = per_mb[mb][i]
                    if g is not None:
                        acc = g.clone() if acc is None else acc.add_(g)
                p.grad = acc
            for g, idx in self.group_idx[s]:
                mbs = tuple(
                    _sq(per_mb[mb][i] for i in idx) / max(self.tokens[mb], 1.0) ** 2
                    for mb in range(self.M)
                )
                step = _sq(self.params[s][i].grad for i in idx)
                self.mb_sq.setdefault((s, g), []).append(mbs)
                self.step_sq.setdefault((s, g), []).append(step / total**2)
            self.stash[s] = []

    def end(self, step: int) -> None:
        """After torchtitan's step `step`: after the last measured one, the cost measurement and
        the lags, then the profile (rank 0 writes it); then the instruments come off."""
        if (
            self.done
            or step - (self.first or 0) != self.job.warmup_steps + self.job.measure_steps - 1
        ):
            return
        self.done = True
        self.recording = self.cap.recording = self.cap.on = False
        self.trainer.optimizers.step = self._opt_step
        from datetime import timedelta

        from torchtitan.distributed.utils import set_pg_timeouts

        jc, pd = self.trainer.job_config, self.trainer.parallel_dims
        # ranks wait in the gather for the slowest stage's cost rounds, far longer than
        # torchtitan's training timeout allows a collective (minutes on a real model)
        set_pg_timeouts(timedelta(seconds=max(3600, jc.comm.init_timeout_seconds)), pd)
        self._finish()
        set_pg_timeouts(timedelta(seconds=jc.comm.train_timeout_seconds), pd)

    def measured_steps_missing(self) -> str | None:
        """Why no profile was written, where training ended before profiling did (or None)."""
        if self.done:
            return None
        ran = 0 if self.first is None else self.step_idx + 1
        return (
            f"training ended after {ran} steps, before the {self.job.warmup_steps} + "
            f"{self.job.measure_steps} steps profiling takes, so no profile was written: give it "
            "more data or fewer steps (freeze.profile_steps)"
        )

    def _finish(self) -> None:
        import torch
        import torch.distributed as dist

        from freezeopt.profiling.assemble import RankResult
        from freezeopt.profiling.group_costs import CostMeter, cost_mode
        from freezeopt.profiling.lags import measure_lags

        job = self.job
        modes = {s: cost_mode(self.plan.rank_actions[self.rank], s) for s in self.my}
        beat = _NoProgress()
        # the cost rounds run extra forwards: buffers they update (a mixture of experts' token
        # counts, say) and the random state go back as training left them
        buffers = {
            s: {n: b.detach().clone() for n, b in mod.named_buffers()}
            for s, mod in self.mods.items()
        }
        rng = torch.get_rng_state()
        cost_rounds = CostMeter.of(self, beat=beat).group_costs(modes, job.cost_samples)
        with torch.no_grad():
            for st, mod in self.mods.items():
                for n, b in mod.named_buffers():
                    b.copy_(buffers[st][n])
        torch.set_rng_state(rng)
        pingpong, shapes = measure_lags(
            self.rank,
            self.plan.stage_rank,
            self.cap.act_shapes,
            device=self.device,
            clock=self.clock,
            samples=job.lag_samples,
            beat=beat,
        )
        tc = self.trainer.job_config
        result = RankResult(
            rank=self.rank,
            host=socket.gethostname(),
            device=device_name(self.device),
            stages=self.my,
            records=tuple((r[0], r[1], r[2], r[3], r[4], r[5], float(r[6])) for r in self.records),
            step_bounds=tuple(self.bounds),
            optimizer_ms=tuple(self.opt_ms),
            optimizer_wall_ms=tuple(self.opt_wall),
            losses=tuple(self.losses),
            val_loss=(),
            groups=tuple(self.group_meta),
            mb_sq={k: tuple(v) for k, v in self.mb_sq.items()},
            step_sq={k: tuple(v) for k, v in self.step_sq.items()},
            apf={},
            cost_rounds=cost_rounds,
            cost_modes=modes,
            all_grouped=self.all_grouped,
            pingpong=pingpong,
            act_shapes=shapes,
            data_provenance={
                "torchtitan_dataset": tc.training.dataset,
                "dataset_path": tc.training.dataset_path or None,
                "tokenizer": tc.model.hf_assets_path or None,
            }
            if self.rank == 0
            else {},
        )
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
        # every rank waits for rank 0's outcome: a rank that ran on and ended its job while rank
        # 0 was still assembling took the process group down under it (gloo aborted the
        # process), and a rank 0 that failed must stop every rank with its one line
        outcome: list[Any] = [None]
        failure: BaseException | None = None
        if dist.get_rank() == 0:
            try:
                self._write(sorted(gathered, key=lambda r: r.rank))
            except Exception as e:
                failure = e
                code = e.exit_code if isinstance(e, FreezeoptError) else 1
                outcome[0] = (type(e).__name__, str(e), code)
        dist.broadcast_object_list(outcome, src=0)
        if failure is not None:
            raise failure
        if outcome[0] is not None:  # every rank stops with rank 0's line and exit code
            name, text, code = outcome[0]
            raise type(name, (FreezeoptError,), {"exit_code": code})(text)

    def _write(self, results: list[Any]) -> None:
        from freezeopt.formats.profile import save_profile
        from freezeopt.profiling.assemble import assemble, format_report
        from freezeopt.torchpp.launch import host_info, load_avg

        losses = results[self.plan.stage_rank[self.last]].losses
        bad = [(k, x) for k, x in enumerate(losses) if not math.isfinite(x)]
        if bad:
            raise DivergedError(
                f"the training loss was {bad[0][1]} in step {bad[0][0]} of the profiling: the "
                "run diverged, so no profile was written; lower the learning rate or check the data"
            )
        host = host_info()
        host["load_avg_after"] = load_avg()
        profile, report = assemble(
            self.job,
            self.plan,
            results,
            out=self.out,
            host=host,
            wall_s=time.monotonic() - self.t_start,
        )
        save_profile(profile, self.out)
        print(format_report(report), file=sys.stderr, flush=True)
