"""`FreezeTrainer`: torchtitan's `Trainer`, replaying a freeze schedule or profiling the job.

With `[freeze] profile` the trainer measures its first steps into a freezeopt profile
(`freezeopt.torchtitan.profile`); with `[freeze] schedule` it replays a schedule, as follows.

torchtitan builds its model, its stages (stock `PipelineStage`s, FSDP2-sharded where data
parallelism shards) and its pipeline schedule as usual; then `Freezer` takes the schedule file of
`[freeze] schedule`, checks it against that pipeline (schedule name, stages and their ranks,
microbatches, groups and their fingerprints), and patches each stage with `enable_freezing`
(exact under FSDP2). Per step, through torchtitan's own hooks:

* `train_step` enters the controller's step (phases: warm-up, freezing, full-update windows);
* `forward_backward_step` runs torchtitan's pipeline step, rescales the gradients of groups frozen
  in some microbatches (before torchtitan clips them and steps the optimizer), and ends the
  controller's step with the loss, per-group gradient norms and the step's time, all-reduced so
  every rank decides alike; drift falls back to full updates;
* `state_dict` adds the controller's state to torchtitan's checkpoint of the trainer.

Rank 0 writes `events.jsonl` and `metrics.jsonl` as `freezeopt train` does. Tensor, context and
expert parallelism and gradient accumulation are refused in one line (not supported yet).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from torchtitan.train import Trainer

from freezeopt.errors import InputError, MismatchError, short
from freezeopt.formats.schedule import (
    PipelineShape,
    Schedule,
    load_schedule,
    pipeline_difference,
)
from freezeopt.torchpp.adapter import (
    V_SCHEDULES,
    enable_freezing,
    scale_group_grads,
    schedule_microbatches,
    schedule_stages,
)
from freezeopt.torchtitan.cpu import sum_reductions
from freezeopt.torchtitan.groups import stage_groups
from freezeopt.training.runlog import RunLog
from freezeopt.training.runtime import FreezeController

__all__ = ["FreezeTrainer", "Freezer"]


class FreezeTrainer(Trainer):
    """torchtitan's trainer with a `[freeze]` section (`freezeopt.torchtitan.config`)."""

    def __init__(self, job_config: Any) -> None:
        super().__init__(job_config)
        if self.device.type == "cpu":  # gloo: no pre-multiplied sums (freezeopt.torchtitan.cpu)
            sum_reductions(self.model_parts)
        cfg = getattr(job_config, "freeze", None)
        self.freezer: Freezer | None = None
        self.profiler: Any = None
        self._freeze_state = True  # False while loading a checkpoint saved without it
        if cfg is not None and (cfg.schedule or cfg.profile):
            try:
                if cfg.schedule and cfg.profile:
                    raise InputError(
                        "freeze.profile and freeze.schedule are both set: profile the job "
                        "first (without a schedule), then replay the schedule solved from it"
                    )
                if cfg.profile:
                    from freezeopt.torchtitan.profile import Profiler

                    self.profiler = Profiler(self, cfg)
                else:
                    self.freezer = Freezer(self, cfg)
            except BaseException:
                self.close()  # torchtitan's main holds no trainer yet: close what it opened
                raise
            if self.freezer is not None:
                self._load_with_or_without_freeze_state()

    def train_step(self, data_iterator: Any) -> None:
        step = self.step - 1  # torchtitan counts steps from 1
        if self.freezer is not None:
            self.freezer.begin(step)
        if self.profiler is not None:
            self.profiler.begin(step)
        super().train_step(data_iterator)
        if self.profiler is not None:
            self.profiler.end(step)

    def train(self) -> None:
        super().train()
        missing = self.profiler.measured_steps_missing() if self.profiler is not None else None
        if missing is not None:
            raise InputError(missing)

    def forward_backward_step(self, **kwargs: Any) -> Any:
        if self.profiler is not None:
            return self.profiler.forward_backward(
                lambda: super(FreezeTrainer, self).forward_backward_step(**kwargs),
                kwargs["labels"],
            )
        if self.freezer is None:
            return super().forward_backward_step(**kwargs)
        from torchtitan.tools import utils

        utils.device_module.synchronize()  # time the device's work, not its launches
        t0 = time.perf_counter()
        loss = super().forward_backward_step(**kwargs)
        utils.device_module.synchronize()
        self.freezer.end(loss, (time.perf_counter() - t0) * 1e3)
        return loss

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.freezer is not None and self._freeze_state:
            state["freezeopt"] = json.dumps(self.freezer.ctrl.state_dict(), sort_keys=True)
        return state

    def _load_with_or_without_freeze_state(self) -> None:
        """A checkpoint saved before the job had a schedule holds no controller state, and
        torchtitan's loads are strict: load such a checkpoint without asking for it (the
        controller then starts afresh at the checkpoint's step)."""
        from torch.distributed.checkpoint import FileSystemReader

        load = self.checkpointer.dcp_load

        def dcp_load(state_dict: Any, checkpoint_id: str, from_hf: bool, **kw: Any) -> Any:
            if not from_hf:
                keys = FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata
                self._freeze_state = "train_state.freezeopt" in keys
            try:
                return load(state_dict, checkpoint_id=checkpoint_id, from_hf=from_hf, **kw)
            finally:
                self._freeze_state = True

        self.checkpointer.dcp_load = dcp_load

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self.freezer is not None and "freezeopt" in state_dict:
            self.freezer.ctrl.load_state_dict(json.loads(state_dict["freezeopt"]))

    def close(self) -> None:
        freezer = getattr(self, "freezer", None)
        if freezer is not None:
            freezer.log.close()
        super().close()


class Freezer:
    """The schedule, its controller and the patched stages of one rank of a torchtitan job."""

    def __init__(self, trainer: Any, cfg: Any) -> None:
        import torch.distributed as dist

        self.trainer = trainer
        pd = trainer.parallel_dims
        if not pd.pp_enabled:
            raise InputError(
                "a freeze schedule is per pipeline stage and microbatch: set "
                "parallelism.pipeline_parallel_degree to 2 or more"
            )
        if pd.tp_enabled or pd.cp_enabled or pd.ep_enabled:
            raise InputError(
                "freezeopt's torchtitan trainer supports pipeline and data parallelism (FSDP2, "
                "HSDP) only: set the tensor, context and expert parallel degrees to 1"
            )
        if trainer.gradient_accumulation_steps != 1:
            raise InputError(
                f"gradient accumulation ({trainer.gradient_accumulation_steps} steps) is not "
                "supported with a freeze schedule: set training.global_batch_size to "
                "training.local_batch_size × the data-parallel degree"
            )
        self.schedule = schedule = load_schedule(cfg.schedule)
        self.stages = schedule_stages(trainer.pp_schedule)
        pipe = schedule.pipeline
        self._check_pipeline(schedule, trainer.job_config, pd.get_mesh("pp").get_local_rank())
        self.groups: dict[int, list[list[Any]]] = {}
        for st in self.stages:
            s = st.stage_index
            by_name = dict(st.submod.named_parameters())
            found = stage_groups(st.submod)
            if tuple(found) != pipe.groups[s]:
                raise MismatchError(
                    f"stage {s} of this torchtitan job has groups {', '.join(found)}, the "
                    f"schedule {', '.join(pipe.groups[s])}: profile and solve this model and split "
                    "(freezeopt.torchtitan.model in a job spec)"
                )
            self.groups[s] = [[by_name[n] for n in names] for names in found.values()]
        self.ctrl = FreezeController(
            schedule,
            stages=[st.stage_index for st in self.stages],
            rescale=cfg.rescale,
            warmup_steps=cfg.warmup_steps,
            full_update_every=cfg.full_update_every,
            all_grouped=[True] * pipe.n_stages,
        )
        for st in self.stages:
            enable_freezing(
                st,
                self.groups[st.stage_index],
                self.ctrl.frozen_groups,
                self.ctrl.input_grad_needed,
            )
        self.keys = [(s, g) for s in range(pipe.n_stages) for g in pipe.groups[s]]
        self.slot = {
            (s, g): i for i, (s, g) in enumerate(self.keys)
        }  # a group's place in `end`'s vector
        self.replicas = pd.dp_replicate
        self.has_last = trainer.pp_has_last_stage
        folder = cfg.log_dir or str(Path(trainer.job_config.job.dump_folder) / "freezeopt")
        self.log = RunLog(Path(folder), writes=dist.get_rank() == 0)
        if dist.get_rank() == 0:
            phases = self.ctrl.schedule.phases
            print(
                f"freezeopt: replaying {cfg.schedule} ({pipe.schedule}, {pipe.n_stages} stages, "
                f"{pipe.n_microbatches} microbatches; freezing from step {phases.warmup_steps}, "
                + (
                    f"a full-update step every {phases.full_update_every}"
                    if phases.full_update_every
                    else "no full-update steps"
                )
                + f"); events and a record per step in {folder}/",
                file=sys.stderr,
                flush=True,
            )
        self._opened = False

    def _check_pipeline(self, schedule: Schedule, job_config: Any, pp_rank: int) -> None:
        """The schedule must have been solved for the pipeline torchtitan built: freezeopt's one
        fit check (`pipeline_difference`) on torchtitan's schedule, ranks, stages, microbatches
        and stage placement (torchtitan's `pipeline_module_split`: looped, or V for the V
        schedules). The groups are checked stage by stage where they are built."""
        from torch.distributed.pipelining.schedules import get_schedule_class

        pipe = schedule.pipeline
        par = job_config.parallelism
        pp, csv = par.pipeline_parallel_degree, par.pipeline_parallel_schedule_csv
        n_stages = pp * len(self.stages)
        if csv:  # a CSV schedule: the same file name (its contents are the user's to keep equal)
            label = f"csv:{Path(csv).name}"
        else:
            label = par.pipeline_parallel_schedule
            if not pipe.schedule.startswith("csv:") and (
                get_schedule_class(pipe.schedule) is get_schedule_class(label)
            ):
                label = pipe.schedule  # the same schedule: torch's names are case-insensitive
        cls = None if csv else get_schedule_class(label)
        v = cls is not None and any(get_schedule_class(n) is cls for n in V_SCHEDULES)
        shape = PipelineShape(
            schedule=label,
            world_size=pp,
            n_stages=n_stages,
            n_microbatches=schedule_microbatches(self.trainer.pp_schedule),
            stage_to_rank=tuple(
                (s if s < pp else 2 * pp - 1 - s) if v else s % pp for s in range(n_stages)
            ),
            groups=None,
        )
        diff = pipeline_difference(schedule, shape)
        mine = [st.stage_index for st in self.stages]
        if diff is None and any(shape.stage_to_rank[s] != pp_rank for s in mine):
            diff = (f"the rank of stages {mine}", [shape.stage_to_rank[s] for s in mine], pp_rank)
        if diff is not None:
            what, a, b = diff
            raise MismatchError(
                f"the freeze schedule was solved for another pipeline: {what} is {short(a)} in the "
                f"schedule but {short(b)} in this torchtitan job; profile a job spec with "
                "torchtitan's pipeline and solve it again"
            )

    def begin(self, step: int) -> None:
        if not self._opened:
            self.log.open(step)
            self._opened = True
        self.log.add_events(self.ctrl.begin_step(step))

    def end(self, loss: Any, fb_ms: float) -> None:
        import torch
        import torch.distributed as dist

        ctrl = self.ctrl
        phase, freezing = ctrl.phase, ctrl.freezing  # this step's, before drift may change them
        for st in self.stages:
            scale_group_grads(self.groups[st.stage_index], ctrl.grad_scales(st.stage_index))
        n = len(self.keys)
        vec = torch.zeros(1 + 2 * n, dtype=torch.float64)
        if self.has_last:
            vec[0] = float(loss.detach().double().sum())
        names = self.schedule.pipeline.groups
        for st in self.stages:
            s = st.stage_index
            for g, params in enumerate(self.groups[s]):
                grads = [p.grad for p in params if p.grad is not None]
                if not grads:
                    continue
                sq = sum(float(_local(gr).double().pow(2).sum()) for gr in grads)
                i = self.slot[(s, names[s][g])]
                vec[1 + i], vec[1 + n + i] = sq, 1.0
        tvec = torch.tensor([fb_ms], dtype=torch.float64)
        device = self.trainer.device
        vec, tvec = vec.to(device), tvec.to(device)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        dist.all_reduce(tvec, op=dist.ReduceOp.MAX)
        vec, tvec = vec.cpu(), tvec.cpu()
        loss_v = float(vec[0])
        norms = {
            f"{s}/{g}": math.sqrt(max(0.0, float(vec[1 + i])) / self.replicas)
            for i, (s, g) in enumerate(self.keys)
            if float(vec[1 + n + i]) > 0.5
        }
        step_ms = float(tvec[0])
        predicted = ctrl.expected_step_ms() if freezing else None
        decision = ctrl.end_step(loss=loss_v, grad_norms=norms, step_ms=step_ms)
        self.log.add_events(list(decision.events))
        self.log.add_metrics(
            {
                "step": ctrl.step,
                "phase": phase,
                "freezing": freezing,
                "loss": loss_v,
                "step_ms": step_ms,
                "predicted_ms": predicted,
                "drift": list(decision.drift),
                "grad_norms": norms,
            }
        )


def _local(t: Any) -> Any:
    """A gradient's local part (an FSDP2 shard's own elements), or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t
