"""A training rank's online re-planning: the measured-cost window, the re-plans it starts, the
switch every rank makes together, and adaptive freezing's loss-cost windows.

Why apart from `freezeopt.training.rank`: the training loop calls these at step boundaries and in
a step; what they keep (the cost window, the plan in flight, the loss-cost measurement) and how the
ranks agree on it is one concern (the module docstring of `freezeopt.training.rank` tells the
protocol; `freezeopt.training.replan` is its torch-free part). `OnlinePlanning` is mixed into the
rank's trainer, whose attributes it reads.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from freezeopt.fileio import atomic_write_text
from freezeopt.formats.schedule import parse_schedule
from freezeopt.torchpp.faults import Fault
from freezeopt.torchpp.job import Job
from freezeopt.torchpp.pipeline import Clock, probe_loss
from freezeopt.training.replan import (
    LCA_STEPS,
    MIN_SAMPLES,
    CostWindow,
    ReplanSpec,
    WindowCosts,
    skipped_ms,
)
from freezeopt.training.replan_worker import ReplanWorker
from freezeopt.training.runlog import RunLog

__all__ = ["OnlinePlanning"]


class OnlinePlanning:
    """Re-planning state and steps of one rank (mixed into `freezeopt.training.rank`'s trainer)."""

    # the trainer's, read here
    spec: Any
    job: Job
    rank: int
    world: int
    rp: Any
    ctrl: Any
    records: list[list[Any]]
    out: Path
    log: RunLog
    faults: list[Fault]
    clock: Clock
    replan_spec: ReplanSpec | None

    def init_online(self) -> None:
        self.window = CostWindow()
        self.plan_version = 0
        self.plan_text: str | None = None
        """YAML of the adopted re-plan in use (None: the schedule file's plan)."""
        self.inflight: tuple[int, str] | None = None
        """(trigger step, reason) of the re-plan being solved."""
        self.solver = ReplanWorker()
        """Rank 0: solves re-plans in a background process (which keeps the run's warm LP)."""
        self.solve_ready = False
        self.drift_replan = False
        self.lca: Any = None
        """Adaptive freezing: the loss-cost measurement of the current full-update window."""
        self.window_costs: WindowCosts | None = None
        """A finished window's loss costs, waiting for the re-plan they start."""
        self.inflight_costs: WindowCosts | None = None
        """Rank 0: the loss costs the re-plan in flight solves from."""
        self.lca_steps = 0
        """Optimizer updates since the current loss-cost measurement started."""
        self.probe_ms = 0.0

    def _add_costs(self, freezing: bool) -> None:
        """This step's per-action full-cost estimates into the window (see the module docstring)."""
        rs, ctrl = self.replan_spec, self.ctrl
        assert rs is not None and ctrl is not None
        stages = rs.profile.stages
        costs: dict[str, float] = {}
        for s, kind, mb, _, _, cost in self.records:
            c = float(cost)
            if freezing and kind in ("B", "W"):
                c += skipped_ms(
                    [g.weight_grad_ms.median for g in stages[s].groups],
                    ctrl.frozen_groups(s, mb),
                    unit=ctrl.unit,
                    tensors=[len(idx) for _, idx in self.rp.group_idx[s]],
                )
            costs[f"{s}{kind}{mb}"] = c
        self.window.add(costs)

    def _replan_boundary(self, step: int) -> None:
        """After every step (identically on every rank): switch to a finished re-plan, then start
        one when due."""
        rs = self.replan_spec
        assert rs is not None
        if self.solve_ready:
            self._apply_replan(step)
        reason = None
        if self.window_costs is not None:
            reason = "costs"
        elif self.drift_replan:
            reason = "step_time"
        elif rs.every and (step + 1) % rs.every == 0:
            reason = "every"
        if (
            reason is not None
            and self.inflight is None
            # a window's loss costs re-plan on the profile's action costs where none are measured
            and (len(self.window) >= MIN_SAMPLES or reason == "costs")
            and step + 1 < self.spec.options.steps  # no step left to run a new plan
        ):
            self._start_replan(step, reason)

    def _start_replan(self, step: int, reason: str) -> None:
        import torch.distributed as dist

        rs, ctrl = self.replan_spec, self.ctrl
        assert rs is not None and ctrl is not None
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, self.window.medians())
        self.inflight = (step, reason)
        costs = None
        if reason == "costs":
            costs, self.window_costs = self.window_costs, None
        if self.rank != 0:
            return
        self.inflight_costs = costs
        measured = {a: c for d in gathered for a, c in d.items()}
        delay = sum(f.ms for f in self.faults if f.kind == "slow_replan") / 1e3
        self.solver.submit(
            rs, ctrl.schedule, measured, step=step, reason=reason, delay_s=delay, costs=costs
        )

    # -- adaptive freezing: loss costs measured in full-update windows --------------------------
    def _cost_window(self, step: int) -> bool:
        """Whether `step` is in warm-up or a full-update window by the schedule's cadence (where
        an adaptive run measures loss costs), whatever the current plan freezes."""
        from freezeopt.training.runtime import in_full_window

        rs, ctrl = self.replan_spec, self.ctrl
        if rs is None or not rs.costs or ctrl is None or step >= self.spec.options.steps:
            return False
        ph = ctrl.schedule.phases
        return step < ph.warmup_steps or in_full_window(ph, step)

    @contextlib.contextmanager
    def _probe_time(self) -> Iterator[None]:
        """Count the block's wall time, the device's work included, in this step's `probe_ms`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.clock.sync()
            self.probe_ms += (time.perf_counter() - t0) * 1e3

    def _cost_due(self, step: int) -> bool:
        """Whether a loss-cost measurement starts before `step`: the step is in a window and at
        most `LCA_STEPS` of the window are left from it (a window measures its last steps only)."""
        return (
            self.lca is None
            and self._cost_window(step)
            and any(not self._cost_window(step + i) for i in range(1, LCA_STEPS + 1))
        )

    def _start_cost_window(self) -> None:
        """Before a measured stretch's first step: the probe loss and its gradient, and the
        groups' parameters, where it starts."""
        from freezeopt.profiling.loss_cost import LcaTracker

        rp = self.rp
        with self._probe_time():
            self.lca = LcaTracker(
                [
                    (s, g, [rp.params[s][i] for i in idx])
                    for s in rp.stages
                    for g, idx in rp.group_idx[s]
                ]
            )
            self.lca.start(self._probe, keep_weights=True)
        self.lca_steps = 0

    def _probe(self) -> float | None:
        """The probe loss with its gradient in `.grad`, every rank together."""
        return probe_loss(
            self.rp, first=self.job.val_batches, batches=self.job.probe_batches, grad=True
        )

    def _end_cost_window(self, step: int) -> None:
        """Every rank, after a window's last step: each group's share of the probe loss's change
        since the measurement started (one trapezoid over its steps), gathered; they start a
        re-plan at this step's boundary (every rank decides alike from the same gathered data)
        where the probe loss and the shares' sum fell: shares of a rise (noise, late in
        training) say nothing of what freezing costs, and the plan stays (a `replan_skipped`
        event)."""
        import torch.distributed as dist

        lca, self.lca = self.lca, None
        if self.lca_steps < 1:  # no update measured (non-finite steps): nothing to go on
            return
        gathered: list[Any] = [None] * self.world
        with self._probe_time():
            lca.step(self._probe)
            dist.all_gather_object(gathered, (dict(lca.changes), list(lca.losses)))
        probe = next((ls for _, ls in gathered if ls and ls[0] is not None), None)
        if (
            probe is None
            or len(probe) != 2
            or any(x is None or not math.isfinite(x) for x in probe)
        ):
            return  # a non-finite probe: nothing to go on
        changes = {k: tuple(v) for ch, _ in gathered for k, v in ch.items()}
        wc = WindowCosts(loss_change=changes, probe_loss=tuple(probe), steps=self.lca_steps)
        if probe[1] >= probe[0] or wc.allocated >= 0:
            why = (
                "the probe loss, or the groups' shares of its change together, did not fall over "
                "the window: no shares of a fall to plan from"
            )
            self.window_costs = None  # a newer window replaces one still waiting, as ever
            self.log.add_events(
                [
                    {
                        "step": step + 1,
                        "event": "replan_skipped",
                        "reason": "costs",
                        "trigger_step": step,
                        "why": why,
                        "window": wc.summary(),
                    }
                ]
            )
            return
        self.window_costs = wc

    def _apply_replan(self, step: int) -> None:
        """Every rank, after the step whose all-reduce said the solve is done (or after the last
        step, once rank 0 has waited for it): receive the outcome from rank 0 and run the new plan
        from step `step + 1` on."""
        import torch.distributed as dist

        assert self.inflight is not None and self.ctrl is not None
        trigger, reason = self.inflight
        at = step + 1
        payload: dict[str, Any] | None = None
        if self.rank == 0:
            out = self.solver.result()
            if isinstance(out, str):
                ev = {"step": at, "event": "replan_failed", "reason": reason, "error": out}
                payload = {"event": ev, "text": None}
            else:
                path = self.out / "replans" / f"step-{at:08d}.yaml"
                atomic_write_text(path, out.text)
                ev = {
                    "step": at,
                    "event": "replan" if out.adopted else "replan_rejected",
                    "reason": reason,
                    "trigger_step": trigger,
                    "old_predicted_ms": round(out.old_predicted_ms, 4),
                    "new_predicted_ms": round(out.new_predicted_ms, 4),
                    "baseline_ms": round(out.baseline_ms, 4),
                    "why": out.why,
                    "status": out.status,
                    "solve_s": round(out.solve_s, 3),
                    "warm": out.warm,
                    "file": str(path),
                }
                wc = self.inflight_costs
                if reason == "costs" and wc is not None:
                    ev["window"] = wc.summary()
                payload = {"event": ev, "text": out.text if out.adopted else None}
        box: list[Any] = [payload]
        dist.broadcast_object_list(box, src=0)
        payload = box[0]
        assert payload is not None
        text = payload["text"]
        if text is not None:
            self.ctrl.set_schedule(parse_schedule(yaml.safe_load(text), source="re-plan"))
            self.plan_version += 1
            self.plan_text = text
        self.log.add_events([payload["event"]])
        self.inflight, self.solve_ready = None, False
