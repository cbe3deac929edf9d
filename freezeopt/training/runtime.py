"""The runtime controller: replays a schedule in training, watches the run, falls back on drift.

Framework-free and small. Given a schedule and the stages one rank serves, it answers three
questions per optimizer step: which parameter groups the backward of microbatch m of stage s
skips (`frozen_groups`), by how much each group's accumulated gradient must be rescaled so it
stays an unbiased mean over the microbatches that did update it (`grad_scales`: M/(M−k), or
`None` for a group frozen in all M — its gradient stays `None` and the optimizer skips it), and,
after the step, whether the run has drifted (`end_step`).

The schedule's `realisation` says what is frozen. `groups` (the default): whole groups where
`frozen` lists them; a fractional `ratios` entry r freezes its group in that microbatch with
probability r, drawn with the realisation's seed. `random_tensors` (TimelyFreeze's realisation):
in microbatch m of stage s, round(r·n) of the stage's n parameter tensors, chosen at random, where
r is the stage's share of frozen tensors that `frozen` and `ratios` imply for m; the answers are
then about tensors (`unit`), and the caller passes the tensor count of each group. Random draws are
redrawn every `redraw_every` steps, seeded by (seed, stage, microbatch, window) alone, so every
rank and every resumed run draws the same. `realisation.rescale: false` turns rescaling off.

A schedule's `progression` (`freezeopt.formats.schedule.Progression`) adds freezing that grows
over training on top of the plan: a prefix of whole groups in model order, frozen in every
microbatch — Composer's linear rule (from the step, in `begin_step`) or AutoFreeze's
gradient-change rule (from the all-reduced gradient norms every window, in `end_step`, so every
rank decides the same); each growth is a `progression` event, the prefix is part of the state and stays frozen in every
phase (full-update windows and fallbacks included), the last group always trains, and the
step-time rule is off (the plan changes as it goes). `input_grad_needed` tells the runtime
where a stage may truncate its backward: below stages frozen whole in a microbatch.

Phases follow the schedule file: full updates for `warmup_steps`, then freezing, interrupted by a
full-update window of `full_update_steps` every `full_update_every` steps. Drift rules (defaults in
the schedule's `phases.drift`):

* non-finite loss or gradient norm;
* loss above its recent trend: the mean of the last 3 losses exceeds the median of the 20 losses
  before them by more than `loss_rise` (relative);
* gradient-norm spike: a group's norm exceeds `grad_norm_spike` × its median over the last 20 steps;
* step time off the prediction: the median of the last 5 freezing steps' times differs from the
  expected freezing step time by more than `step_time_error` (relative; pass `step_ms=None` to
  skip a step, e.g. the first ones, which include torch's one-time setup). The expected time is
  the schedule's `predicted_ms`, calibrated once the controller has seen 3 full-update steps:
  `predicted_ms × (median full-update step time / baseline_ms)`. The profile's DAG leaves out a
  little per-step overhead (Python, posting sends and receives), so the raw prediction is off by a
  roughly constant share on a given machine; the calibrated rule fires when freezing does not
  deliver the *speed-up* the schedule predicted, which is what makes a schedule stale.

Before the first step, `check_groups` holds the parameters the caller freezes to the schedule's
group fingerprints (element count, shapes, dtypes): a schedule solved for another model (another
width, same group names) is refused in one line (`enable_freezing` calls it by itself).

On drift the controller falls back to full updates for `fallback_steps` and records an event; with
`rollback=True`, when a loss, gradient or non-finite rule fired (a step-time drift alone says
nothing against the weights), it also asks the caller to restore the last checkpoint (`Decision.rollback`) and
then to hand back the checkpoint's controller state through `rollback_to`, which restores the
loss trend the restored weights belong to while keeping the fallback window. Its
state is a plain dict (`state_dict`/`load_state_dict`, torch's Stateful protocol) so a resumed run
continues where it stopped. Events are plain dicts, ready for a JSONL log.

Online re-planning (`freezeopt.training.replan`): with `replan_on_drift=True`, a step-time drift alone (no
other rule fired) does not fall back; the decision asks the caller to re-plan instead
(`Decision.replan`; the drift event says `"response": "replan"`), since a plan made stale by changed
costs is cured by a new plan, not by the slower full updates. `set_schedule` switches to a new plan
between steps (same pipeline and groups), keeping the phase, the histories and the fallback window;
the step-time rule then expects the new plan's prediction, calibrated by the full-update steps seen
under it or, until there are 3 of them, by the ratio measured under the plan before.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import statistics
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from freezeopt.errors import InputError, MismatchError, short
from freezeopt.formats.fingerprint import fingerprint
from freezeopt.formats.schedule import Phases, Schedule, parse_microbatches, with_phases

__all__ = ["Decision", "FreezeController", "in_full_window"]

_LOSS_WINDOW = 20
_LOSS_RECENT = 3
_GRAD_WINDOW = 20
_TIME_WINDOW = 5
_FULL_WINDOW = 20
_FULL_MIN = 3


_MISSING_WARN = 10
"""Freezing steps without an input of a drift rule before `end_step` warns that the rule is off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What `end_step` concluded."""

    drift: tuple[str, ...] = ()
    """Names of the rules that fired (empty: no drift)."""
    rollback: bool = False
    """The caller should restore the last checkpoint."""
    events: tuple[dict[str, Any], ...] = ()
    """Events to log (from `end_step`: drifts, with the fallback or re-plan they cause; phase
    changes come from `begin_step`)."""
    replan: bool = False
    """The step-time rule fired and, with `replan_on_drift`, asks for a new plan (no fallback)."""


@dataclass(slots=True)
class _State:
    step: int = -1
    phase: str = "init"
    fallback_until: int = -1
    # the reference window and the recent losses but the current one, which `end_step` adds
    losses: deque[float] = field(
        default_factory=lambda: deque(maxlen=_LOSS_WINDOW + _LOSS_RECENT - 1)
    )
    grad_norms: dict[str, deque[float]] = field(default_factory=dict)
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=_TIME_WINDOW))
    full_times: deque[float] = field(default_factory=lambda: deque(maxlen=_FULL_WINDOW))
    fallbacks: int = 0
    prefix: int = 0
    """Groups (model order) the schedule's progression has frozen whole so far."""
    window: dict[str, list[float]] = field(default_factory=dict)
    """`gradient_change`: this window's gradient norms of the groups still trained."""
    last_means: dict[str, float] = field(default_factory=dict)
    """`gradient_change`: the previous window's mean gradient norms."""


class FreezeController:
    """Replays `schedule` for the stages in `stages` (the ones this rank runs)."""

    def __init__(
        self,
        schedule: Schedule,
        *,
        stages: Sequence[int],
        rescale: bool = True,
        rollback: bool = False,
        tensors: Mapping[int, Sequence[int]] | None = None,
        replan_on_drift: bool = False,
        warmup_steps: int | None = None,
        full_update_every: int | None = None,
        all_grouped: Sequence[bool] | None = None,
    ) -> None:
        schedule = with_phases(
            schedule, warmup_steps=warmup_steps, full_update_every=full_update_every
        )
        pipe = schedule.pipeline
        bad = [s for s in stages if not 0 <= s < pipe.n_stages]
        if bad:
            raise MismatchError(f"stage {bad[0]} is not in the schedule's {pipe.n_stages} stages")
        self.stages = tuple(stages)
        self.rollback = rollback
        self.replan_on_drift = replan_on_drift
        self._rescale_arg = rescale
        self._tensor_arg = tensors
        self._calib: float | None = None
        self._state = _State()
        self._missing = {"grad_norms": 0, "step_ms": 0}
        """Freezing steps whose `end_step` lacked an input a drift rule needs (warned once)."""
        if all_grouped is not None and len(all_grouped) != pipe.n_stages:
            raise MismatchError(
                f"all_grouped names {len(all_grouped)} stages; the schedule has {pipe.n_stages}"
            )
        self._all_grouped = tuple(all_grouped) if all_grouped is not None else None
        self._load_plan(schedule)

    def set_schedule(self, schedule: Schedule) -> None:
        """Switch to a new plan from the next `begin_step` on (online re-planning). The pipeline
        and groups must be the schedule's; phase, histories and fallback window are kept."""
        old = self.schedule
        new_pipe, old_pipe = schedule.pipeline, old.pipeline
        if new_pipe.fingerprints is None or old_pipe.fingerprints is None:
            # a plan with fingerprints for one without (re-planned from the profile after an older
            # schedule): the rest must agree
            new_pipe, old_pipe = (
                replace(new_pipe, fingerprints=None),
                replace(old_pipe, fingerprints=None),
            )
        if new_pipe != old_pipe:
            raise MismatchError("a new plan must be for the same pipeline and parameter groups")
        st = self._state
        if len(st.full_times) >= _FULL_MIN and old.prediction.baseline_ms > 0:
            self._calib = statistics.median(st.full_times) / old.prediction.baseline_ms
        st.full_times.clear()
        st.step_times.clear()
        self._load_plan(schedule)

    def check_groups(self, stage: int, groups: Sequence[Sequence[Any]]) -> None:
        """Raise MismatchError unless `groups` — what `enable_freezing` is given for `stage`: per
        group of the schedule, in its order, the list of the group's parameters (for the
        `random_tensors` realisation, one list per tensor, group after group) — hold the
        parameters the schedule was solved for: as many groups, each with the fingerprint (element
        count, shapes and dtypes; `freezeopt.formats.fingerprint`) the schedule records. A model of
        another width fails here. Schedules without fingerprints (solved from `freezeopt synth`'s
        profiles or older ones) check the number of groups only. `enable_freezing` calls this
        itself when its `frozen` is this controller's `frozen_groups`."""
        pipe = self.schedule.pipeline
        if not 0 <= stage < pipe.n_stages:
            raise MismatchError(f"stage {stage} is not in the schedule's {pipe.n_stages} stages")
        names = pipe.groups[stage]
        units = [list(u) for u in groups]
        counts = self._tensors.get(stage)
        per_tensor = all(len(u) == 1 for u in units) and len(units) != len(names)
        if (
            self.unit == "tensor"
            and counts is not None
            and per_tensor
            and len(units) == sum(counts)
        ):
            flat = [p for u in units for p in u]
            ends = list(itertools.accumulate(counts))
            units = [flat[e - c : e] for c, e in zip(counts, ends, strict=True)]
        if len(units) != len(names):
            raise MismatchError(
                f"stage {stage}: {len(units)} parameter groups given, but the schedule has "
                f"{len(names)} ({short(', '.join(names))}); pass one list of parameters per "
                "group, in the schedule's order"
            )
        if pipe.fingerprints is None:
            return
        for name, want, params in zip(names, pipe.fingerprints[stage], units, strict=True):
            got = fingerprint(params)
            if got != want:
                raise MismatchError(
                    f"stage {stage}'s group {name} holds other parameters than the schedule was "
                    f"solved for (fingerprint, element count-hash of shapes and dtypes: {got} "
                    f"here, {want} in the schedule); profile and solve this model "
                    "(`freezeopt profile` → `freezeopt solve`)"
                )

    def _load_plan(self, schedule: Schedule) -> None:
        pipe = schedule.pipeline
        tensors = self._tensor_arg
        self.schedule = schedule
        real = schedule.realisation
        self.rescale = self._rescale_arg and real.rescale
        self.n_microbatches = pipe.n_microbatches
        self.unit: str = "tensor" if real.kind == "random_tensors" else "group"
        """What `frozen_groups` and `grad_scales` index: `group`s, or parameter `tensor`s of the
        stage (in group order, then parameter order) for the `random_tensors` realisation."""
        self._tensors: dict[int, tuple[int, ...]] = {}
        if self.unit == "tensor":
            if tensors is None:
                raise InputError(
                    "the schedule's realisation is random_tensors: pass the number of parameter "
                    "tensors of each group (tensors={stage: [count per group]})"
                )
            for s in self.stages:
                counts = tuple(int(c) for c in tensors[s])
                if len(counts) != len(pipe.groups[s]):
                    raise MismatchError(
                        f"stage {s}: {len(counts)} tensor counts for {len(pipe.groups[s])} groups"
                    )
                self._tensors[s] = counts
        # (stage, microbatch) → group → extent to freeze: 1 (listed under `frozen`) or a ratio
        self._extent: dict[tuple[int, int], dict[int, float]] = {}
        for s in self.stages:
            names = pipe.groups[s]
            for name, mbs in schedule.frozen.get(s, {}).items():
                for m in parse_microbatches(mbs, self.n_microbatches):
                    self._extent.setdefault((s, m), {})[names.index(name)] = 1.0
            for name, per_mb in schedule.ratios.get(s, {}).items():
                for m, r in per_mb.items():
                    ext = self._extent.setdefault((s, m), {})
                    ext[names.index(name)] = max(ext.get(names.index(name), 0.0), float(r))
        self._random = self.unit == "tensor" or any(
            0 < r < 1 for ext in self._extent.values() for r in ext.values()
        )
        # Phases must be the same on every rank, so whether there is anything to freeze at all is
        # decided from the whole schedule, not from this rank's stages.
        self._freezes = any(
            parse_microbatches(mbs, self.n_microbatches)
            for groups in schedule.frozen.values()
            for mbs in groups.values()
        ) or any(r > 0 for g in schedule.ratios.values() for mb in g.values() for r in mb.values())
        # (stage, microbatch) of every stage, not only this rank's, that the plan freezes whole
        # (every group listed under `frozen`; with `all_grouped`): backward truncation below it
        whole: set[tuple[int, int]] = set()
        if self._all_grouped is not None and self.unit == "group":
            for s in range(pipe.n_stages):
                if not self._all_grouped[s] or not pipe.groups[s]:
                    continue
                listed = schedule.frozen.get(s, {})
                every: set[int] = set(range(self.n_microbatches))
                for name in pipe.groups[s]:
                    text = listed.get(name)
                    every &= set(parse_microbatches(text, self.n_microbatches)) if text else set()
                whole.update((s, m) for m in every)
        self._whole = frozenset(whole)
        self.progression = schedule.progression
        self._order = [(s, g) for s in range(pipe.n_stages) for g in range(len(pipe.groups[s]))]
        """Every group of the pipeline in model order: what a progression freezes, first on."""
        if self.progression is not None:
            if self.unit != "group":
                raise InputError(
                    "a schedule with a progression freezes whole groups: its realisation must be "
                    "groups, not random_tensors"
                )
            self._freezes = True
        self._window = -1
        self._plan: dict[tuple[int, int], frozenset[int]] = {}
        self._draw(max(0, self._state.step))

    def _draw(self, step: int) -> None:
        """The plan of the redraw window holding `step` (deterministic: same on every rank)."""
        real = self.schedule.realisation
        window = step // real.redraw_every if self._random else 0
        if window == self._window:
            return
        self._window = window
        plan: dict[tuple[int, int], frozenset[int]] = {}
        for (s, m), ext in sorted(self._extent.items()):
            if self.unit == "tensor":
                counts = self._tensors[s]
                n = sum(counts)
                r = sum(counts[g] * x for g, x in ext.items()) / n if n else 0.0
                k = math.floor(r * n + 0.5)
                units = frozenset(_rng(real.seed, s, m, -1, window).sample(range(n), k))
            else:
                units = frozenset(
                    g
                    for g, x in ext.items()
                    if x >= 1.0 or (x > 0 and _rng(real.seed, s, m, g, window).random() < x)
                )
            if units:
                plan[(s, m)] = units
        self._plan = plan

    # -- per step -------------------------------------------------------------------------
    def begin_step(self, step: int) -> list[dict[str, Any]]:
        """Enter optimizer step `step`; returns phase-change events."""
        st = self._state
        st.step = step
        self._draw(step)
        phase = self._phase_of(step)
        events = []
        if phase != st.phase:
            events.append({"step": step, "event": "phase", "from": st.phase, "to": phase})
            st.phase = phase
        prog = self.progression
        if prog is not None and prog.kind == "linear":
            f = min(1.0, step / prog.total_steps)
            g = len(self._order)
            want = (
                0
                if f < prog.start or prog.start >= 1
                else math.floor(g * prog.level * (f - prog.start) / (1 - prog.start) + 1e-9)
            )
            events += self._grow(min(g - 1, want), step)  # the last group always trains
        return events

    def _grow(self, prefix: int, step: int, **why: Any) -> list[dict[str, Any]]:
        """Freeze the first `prefix` groups whole (never fewer than before); the event."""
        st = self._state
        if prefix <= st.prefix:
            return []
        st.prefix = prefix
        s, g = self._order[prefix - 1]
        last = f"{s}/{self.schedule.pipeline.groups[s][g]}"
        return [
            {"step": step, "event": "progression", "frozen_groups": prefix, "through": last, **why}
        ]

    def _prefix_of(self, stage: int) -> frozenset[int]:
        """The groups of `stage` in the progression's frozen prefix (empty without one)."""
        return frozenset(g for s, g in self._order[: self._state.prefix] if s == stage)

    @property
    def phase(self) -> str:
        """`warmup`, `freeze`, `full_window` or `fallback` (`init` before the first step)."""
        return self._state.phase

    def phase_at(self, step: int) -> str:
        """The phase `begin_step(step)` would enter, given what the controller knows now."""
        return self._phase_of(step)

    @property
    def step(self) -> int:
        """The step last begun (-1 before the first)."""
        return self._state.step

    def frozen_plan(self, stage: int) -> dict[int, frozenset[int]]:
        """Microbatch → unit indices frozen in freezing phases (the current plan for `stage`)."""
        prefix = self._prefix_of(stage)
        plan = {m: gs for (s, m), gs in sorted(self._plan.items()) if s == stage}
        if prefix:
            plan = {m: plan.get(m, frozenset()) | prefix for m in range(self.n_microbatches)}
        return plan

    def expected_step_ms(self) -> float:
        """The freezing step time the step-time rule expects (see the module docstring)."""
        pred = self.schedule.prediction
        full = self._state.full_times
        if len(full) >= _FULL_MIN and pred.baseline_ms > 0:
            return pred.predicted_ms * statistics.median(full) / pred.baseline_ms
        if self._calib is not None:
            return pred.predicted_ms * self._calib
        return pred.predicted_ms

    @property
    def freezing(self) -> bool:
        """True when this step replays the schedule."""
        return self._state.phase == "freeze"

    def frozen_groups(self, stage: int, microbatch: int) -> frozenset[int]:
        """Unit indices (groups, or tensors: see `unit`) whose weight gradients the backward of
        (stage, microbatch) skips."""
        prefix = self._prefix_of(stage) if self._state.prefix else frozenset()
        if not self.freezing:
            return prefix  # a progression's prefix stays frozen in every phase
        return self._plan.get((stage, microbatch), frozenset()) | prefix

    def input_grad_needed(self, stage: int, microbatch: int) -> bool:
        """Whether the backward of (stage, microbatch) must compute its input's gradient: False
        only while freezing, where every stage before it is frozen whole in that microbatch (all
        groups listed, every parameter grouped: `all_grouped`), so nothing upstream uses it —
        `enable_freezing`'s backward truncation. Always True without `all_grouped`."""
        if self._all_grouped is None or stage == 0:
            return True
        whole = {
            s
            for s in {s for s, _ in self._order[: self._state.prefix]}
            if self._all_grouped[s]
            and len(self._prefix_of(s)) == len(self.schedule.pipeline.groups[s])
        }
        planned = self._whole if self.freezing else frozenset()
        return not all((s, microbatch) in planned or s in whole for s in range(stage))

    def grad_scales(self, stage: int) -> dict[int, float | None]:
        """Per unit frozen in some microbatch this step: the gradient factor M/(M−k) (when
        rescaling), or None if frozen in all M (its gradient must stay None)."""
        if not self.freezing and not self._state.prefix:
            return {}
        m = self.n_microbatches
        counts: dict[int, int] = {}
        for mb in range(m):
            for g in self.frozen_groups(stage, mb):
                counts[g] = counts.get(g, 0) + 1
        out: dict[int, float | None] = {}
        for g, k in counts.items():
            if k >= m:
                out[g] = None
            elif self.rescale:
                out[g] = m / (m - k)
        return out

    def end_step(
        self,
        *,
        loss: float,
        grad_norms: Mapping[str, float] | None = None,
        step_ms: float | None = None,
    ) -> Decision:
        """Record the step's loss, per-group gradient norms and step time; check the drift rules.

        Without `grad_norms` the gradient-spike rule cannot fire, without `step_ms` the step-time
        rule; after `_MISSING_WARN` freezing steps without one, a warning says so (once)."""
        st, drift_cfg = self._state, self.schedule.phases.drift
        if self.freezing:
            for name, given in (("grad_norms", grad_norms), ("step_ms", step_ms)):
                if given is not None or self._missing[name] < 0:
                    continue
                if name == "step_ms" and self.progression is not None:
                    continue  # the step-time rule is off with a progression anyway
                self._missing[name] += 1
                if self._missing[name] >= _MISSING_WARN:
                    self._missing[name] = -1  # warned
                    rule = "gradient-spike" if name == "grad_norms" else "step-time"
                    warnings.warn(
                        f"FreezeController.end_step got no {name} for {_MISSING_WARN} freezing "
                        f"steps: the {rule} drift rule is off; pass {name}=…",
                        stacklevel=2,
                    )
        fired: list[str] = []
        norms = dict(grad_norms or {})
        if not math.isfinite(loss) or any(not math.isfinite(v) for v in norms.values()):
            fired.append("nonfinite")
        else:
            if len(st.losses) >= _LOSS_WINDOW // 2 + _LOSS_RECENT:
                hist = list(st.losses)
                recent = [*hist[-(_LOSS_RECENT - 1) :], loss]
                ref = statistics.median(hist[: -(_LOSS_RECENT - 1)])
                if ref > 0 and statistics.fmean(recent) > ref * (1 + drift_cfg.loss_rise):
                    fired.append("loss_rise")
            for name, v in norms.items():
                hist_g = st.grad_norms.get(name)
                if hist_g is not None and len(hist_g) >= _GRAD_WINDOW // 2:
                    med = statistics.median(hist_g)
                    if med > 0 and v > drift_cfg.grad_norm_spike * med:
                        fired.append(f"grad_norm_spike:{name}")
            # a progression changes the plan as it goes: the schedule's prediction is not its own
            if (
                step_ms is not None
                and math.isfinite(step_ms)
                and self.freezing
                and self.progression is None
            ):
                st.step_times.append(step_ms)
                pred = self.expected_step_ms()
                if len(st.step_times) == _TIME_WINDOW and pred > 0:
                    med_t = statistics.median(st.step_times)
                    if abs(med_t - pred) / pred > drift_cfg.step_time_error:
                        fired.append("step_time")
            elif step_ms is not None and math.isfinite(step_ms):
                st.full_times.append(step_ms)
        if math.isfinite(loss) and not fired:
            st.losses.append(loss)
            for name, v in norms.items():
                st.grad_norms.setdefault(name, deque(maxlen=_GRAD_WINDOW)).append(v)
        events: list[dict[str, Any]] = []
        prog = self.progression
        if prog is not None and prog.kind == "gradient_change" and self.freezing and not fired:
            events += self._gradient_change(norms)
        if fired == ["step_time"] and self.replan_on_drift:
            st.step_times.clear()
            events.append(
                {
                    "step": st.step,
                    "event": "drift",
                    "rules": fired,
                    "loss": loss,
                    "response": "replan",
                }
            )
            return Decision(drift=tuple(fired), events=tuple(events), replan=True)
        # a slow step says nothing against the weights: only the loss and gradient rules roll back
        rollback = self.rollback and any(r != "step_time" for r in fired)
        if fired:
            st.fallbacks += 1
            st.fallback_until = st.step + drift_cfg.fallback_steps
            st.step_times.clear()
            events.append(
                {
                    "step": st.step,
                    "event": "drift",
                    "rules": fired,
                    "loss": loss if math.isfinite(loss) else str(loss),
                    "fallback_until": st.fallback_until,
                    "rollback": rollback,
                }
            )
        return Decision(drift=tuple(fired), rollback=rollback, events=tuple(events))

    def _gradient_change(self, norms: Mapping[str, float]) -> list[dict[str, Any]]:
        """AutoFreeze's rule (`Progression`): a window's mean gradient norms against the last
        window's; the prefix grows over groups whose relative change is at most the percentile."""
        st, prog = self._state, self.progression
        assert prog is not None
        names = [f"{s}/{self.schedule.pipeline.groups[s][g]}" for s, g in self._order]
        trained = names[st.prefix :]
        for n in trained:
            if n in norms:
                st.window.setdefault(n, []).append(norms[n])
        if max((len(v) for v in st.window.values()), default=0) < prog.every:
            return []
        means = {n: statistics.fmean(v) for n, v in st.window.items() if v}
        st.window = {}
        before, st.last_means = st.last_means, means
        change = {
            n: abs(means[n] - before[n]) / before[n]
            for n in trained
            if n in means and before.get(n, 0) > 0
        }
        if len(change) < 2:
            return []
        ranked = sorted(change.values())
        threshold = ranked[min(len(ranked) - 1, math.floor(prog.percentile * (len(ranked) - 1)))]
        prefix = st.prefix
        while prefix < len(names) - 1 and change.get(names[prefix], math.inf) <= threshold:
            prefix += 1
        return self._grow(prefix, st.step, threshold=threshold)

    @property
    def fallbacks(self) -> int:
        """How many times drift made the controller fall back."""
        return self._state.fallbacks

    # -- phases ---------------------------------------------------------------------------
    def _phase_of(self, step: int) -> str:
        ph = self.schedule.phases
        if step < ph.warmup_steps:
            return "warmup"
        if step <= self._state.fallback_until:
            return "fallback"
        if not self._freezes or in_full_window(ph, step):
            return "full_window"
        return "freeze"

    # -- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (torch's Stateful protocol)."""
        st = self._state
        return {
            "step": st.step,
            "phase": st.phase,
            "fallback_until": st.fallback_until,
            "losses": list(st.losses),
            "grad_norms": {k: list(v) for k, v in st.grad_norms.items()},
            "step_times": list(st.step_times),
            "full_step_times": list(st.full_times),
            "fallbacks": st.fallbacks,
            "calibration": self._calib,
            "prefix": st.prefix,
            "window": {k: list(v) for k, v in st.window.items()},
            "last_means": dict(st.last_means),
        }

    def rollback_to(self, state: Mapping[str, Any]) -> None:
        """After restoring a checkpoint's weights: take back its loss, gradient-norm and step-time
        history (the trend the restored weights belong to), but keep the current step, phase,
        fallback window and fallback count, so the fallback that caused the rollback still runs."""
        now = self._state
        self.load_state_dict(state)
        st = self._state
        st.step, st.phase = now.step, now.phase
        st.fallback_until, st.fallbacks = now.fallback_until, now.fallbacks
        st.prefix = max(st.prefix, now.prefix)  # what froze stays frozen (its weights did not move)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()` output."""
        st = _State()
        st.step = int(state["step"])
        st.phase = str(state["phase"])
        st.fallback_until = int(state["fallback_until"])
        st.losses.extend(float(x) for x in state["losses"])
        for k, v in state["grad_norms"].items():
            st.grad_norms[k] = deque((float(x) for x in v), maxlen=_GRAD_WINDOW)
        st.step_times.extend(float(x) for x in state["step_times"])
        st.full_times.extend(float(x) for x in state.get("full_step_times", ()))
        st.fallbacks = int(state["fallbacks"])
        st.prefix = int(state.get("prefix", 0))
        st.window = {k: [float(x) for x in v] for k, v in state.get("window", {}).items()}
        st.last_means = {k: float(v) for k, v in state.get("last_means", {}).items()}
        self._state = st
        calib = state.get("calibration")
        self._calib = None if calib is None else float(calib)


def in_full_window(phases: Phases, step: int) -> bool:
    """Whether `step` falls in a full-update window by the schedule's cadence: the
    `full_update_steps` steps from every `full_update_every`-th step after warm-up on."""
    if phases.full_update_every <= 0 or step < phases.warmup_steps:
        return False
    since = step - phases.warmup_steps
    return since >= phases.full_update_every and since % phases.full_update_every < (
        phases.full_update_steps
    )


def _rng(seed: int, stage: int, microbatch: int, group: int, window: int) -> random.Random:
    """A generator for one draw, the same in every process (no dependence on hash seeds)."""
    key = f"{seed}:{stage}:{microbatch}:{group}:{window}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
