"""The framework-free controller: phases, gradient scales, drift rules, checkpointable state."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from freezeopt.errors import InputError, MismatchError
from freezeopt.formats.fingerprint import fingerprint
from freezeopt.formats.profile import profile_sha256
from freezeopt.formats.schedule import Drift, Phases
from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.solver import SolveOptions, schedule_from_result, solve
from freezeopt.training.runtime import FreezeController
from tests.conftest import make_profile


def _schedule(phases: Phases | None = None, **kw):
    p = make_profile(ranks=2, microbatches=4, groups=2)
    opts = SolveOptions(mode="heuristic", budget=0.5, group_cap=1.0, **kw)
    dag = build_dag(p)
    r = solve(dag, estimate_signal(p), opts)
    return schedule_from_result(
        r,
        profile=p,
        profile_sha256=profile_sha256(p),
        dag=dag,
        opts=opts,
        phases=phases or Phases(warmup_steps=2, full_update_every=5),
    )


def _with_frozen(sched, frozen):
    return dataclasses.replace(sched, frozen=frozen)


def test_phases_follow_the_schedule() -> None:
    sched = _with_frozen(_schedule(), {0: {"s0.g0": "0-1"}})
    c = FreezeController(sched, stages=[0])
    phases = []
    for step in range(13):
        c.begin_step(step)
        phases.append(c.phase)
    assert phases[:2] == ["warmup", "warmup"]
    assert phases[2] == "freeze"
    assert phases[7] == "full_window" and phases[12] == "full_window"  # warmup 2 + every 5
    assert phases.count("full_window") == 2


def test_frozen_groups_and_grad_scales() -> None:
    sched = _with_frozen(_schedule(), {0: {"s0.g0": "0-1", "s0.g1": "0-3"}})
    c = FreezeController(sched, stages=[0])
    c.begin_step(0)
    assert c.frozen_groups(0, 0) == frozenset()  # warm-up: nothing frozen
    assert c.grad_scales(0) == {}
    c.begin_step(3)
    assert c.frozen_groups(0, 0) == frozenset({0, 1})
    assert c.frozen_groups(0, 2) == frozenset({1})
    assert c.grad_scales(0) == {0: pytest.approx(4 / 2), 1: None}
    assert FreezeController(sched, stages=[0], rescale=False).grad_scales(0) == {}


def test_rescale_off_keeps_all_frozen_none() -> None:
    sched = _with_frozen(_schedule(), {0: {"s0.g0": "0-1", "s0.g1": "0-3"}})
    c = FreezeController(sched, stages=[0], rescale=False)
    c.begin_step(3)
    assert c.grad_scales(0) == {1: None}


def _drive(c: FreezeController, losses, start=0, norms=None):
    out = []
    for i, loss in enumerate(losses):
        c.begin_step(start + i)
        out.append(c.end_step(loss=loss, grad_norms=norms(i) if norms else None))
    return out


def test_loss_rise_falls_back_for_a_window() -> None:
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=0, full_update_every=0, drift=Drift(fallback_steps=4))),
        {0: {"s0.g0": "0"}},
    )
    c = FreezeController(sched, stages=[0])
    decisions = _drive(c, [3.0 - 0.01 * i for i in range(25)])
    assert not any(d.drift for d in decisions)
    d = _drive(c, [4.0], start=25)[0]
    assert d.drift == ("loss_rise",) and d.events[0]["event"] == "drift"
    c.begin_step(26)
    assert c.phase == "fallback" and c.frozen_groups(0, 0) == frozenset()
    c.begin_step(30)
    assert c.phase == "freeze"
    assert c.fallbacks == 1


def test_loss_rise_compares_with_the_median_of_the_20_losses_before_the_last_3() -> None:
    """The rule as docs/training.md states it: a low loss 21 losses before the current one is out
    of the reference window (with it, the median is 2.50 and 2.64 would be a 5.6 % rise)."""
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=0, full_update_every=0)), {0: {"s0.g0": "0"}}
    )
    c = FreezeController(sched, stages=[0])
    falling = [0.1] + [3.0 - 0.05 * i for i in range(20)]  # the reference: median 2.525
    assert not any(d.drift for d in _drive(c, [*falling, 2.64, 2.64, 2.64]))  # 4.6 % above it
    c2 = FreezeController(sched, stages=[0])
    assert _drive(c2, [*falling, 2.66, 2.66, 2.66])[-1].drift == ("loss_rise",)  # 5.3 % above


def test_nonfinite_and_spikes() -> None:
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=0, full_update_every=0)), {0: {"s0.g0": "0"}}
    )
    c = FreezeController(sched, stages=[0], rollback=True)
    assert _drive(c, [math.nan])[0].drift == ("nonfinite",)
    assert _drive(c, [1.0], start=1, norms=lambda i: {"s0.g0": math.inf})[0].rollback
    c2 = FreezeController(sched, stages=[0])
    _drive(c2, [1.0] * 15, norms=lambda i: {"s0.g0": 1.0 + 0.01 * (i % 3)})
    d = _drive(c2, [1.0], start=15, norms=lambda i: {"s0.g0": 50.0})[0]
    assert d.drift == ("grad_norm_spike:s0.g0",) and not d.rollback


def test_step_time_off_the_prediction() -> None:
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=0, full_update_every=0)), {0: {"s0.g0": "0"}}
    )
    pred = sched.prediction.predicted_ms
    c = FreezeController(sched, stages=[0])
    for step in range(5):
        c.begin_step(step)
        assert not c.end_step(loss=1.0, step_ms=pred * 1.05).drift
    c = FreezeController(sched, stages=[0])
    fired = []
    for step in range(5):
        c.begin_step(step)
        fired.append(c.end_step(loss=1.0, step_ms=pred * 2).drift)
    assert fired[-1] == ("step_time",) and not any(fired[:-1])
    # a slow step alone never rolls the weights back, even with rollback on
    c = FreezeController(sched, stages=[0], rollback=True)
    decisions = []
    for step in range(5):
        c.begin_step(step)
        decisions.append(c.end_step(loss=1.0, step_ms=pred * 2))
    assert decisions[-1].drift == ("step_time",) and not decisions[-1].rollback
    c.begin_step(5)
    assert c.end_step(loss=float("nan")).rollback  # a non-finite loss does


def test_state_round_trips_and_resumes_identically() -> None:
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=0, full_update_every=0)), {0: {"s0.g0": "0"}}
    )
    losses = [2.0 - 0.01 * i for i in range(30)] + [3.0] + [1.5] * 10
    a = FreezeController(sched, stages=[0])
    full = _drive(a, losses)
    b = FreezeController(sched, stages=[0])
    _drive(b, losses[:20])
    c = FreezeController(sched, stages=[0])
    c.load_state_dict(b.state_dict())
    resumed = _drive(c, losses[20:], start=20)
    assert [d.drift for d in full[20:]] == [d.drift for d in resumed]
    assert c.state_dict() == a.state_dict()


def test_unknown_stage() -> None:
    with pytest.raises(MismatchError, match="stage 9"):
        FreezeController(_schedule(), stages=[9])


def test_phases_agree_across_ranks_whatever_they_freeze() -> None:
    """A rank whose stages freeze nothing must still follow the same phases (its peers freeze)."""
    sched = _with_frozen(_schedule(), {1: {"s1.g0": "0-1"}})
    c0, c1 = FreezeController(sched, stages=[0]), FreezeController(sched, stages=[1])
    for step in range(12):
        assert c0.phase_at(step) == c1.phase_at(step)
        c0.begin_step(step)
        c1.begin_step(step)
        assert c0.phase == c1.phase
    assert c0.phase_at(3) == "freeze" and c0.frozen_groups(0, 0) == frozenset()
    assert c1.frozen_plan(1) == {0: frozenset({0}), 1: frozenset({0})}


def test_step_time_rule_is_calibrated_by_full_update_steps() -> None:
    """The DAG misses a constant share of overhead: freezing steps are judged by the predicted
    speed-up over the run's own full-update steps once there are three of them."""
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=3, full_update_every=0)), {0: {"s0.g0": "0"}}
    )
    pred = sched.prediction
    slow = 1.5  # this machine runs every step 1.5× slower than the profile predicts
    c = FreezeController(sched, stages=[0])
    for step in range(3):
        c.begin_step(step)
        assert not c.end_step(loss=1.0, step_ms=pred.baseline_ms * slow).drift
    assert c.expected_step_ms() == pytest.approx(pred.predicted_ms * slow)
    for step in range(3, 8):  # freezing delivers the predicted speed-up: no drift
        c.begin_step(step)
        assert not c.end_step(loss=1.0, step_ms=pred.predicted_ms * slow).drift
    fired = []
    for step in range(8, 13):  # freezing stops paying off: as slow as full updates
        c.begin_step(step)
        fired.append(c.end_step(loss=1.0, step_ms=pred.baseline_ms * slow * 1.4).drift)
    assert fired[:3] == [(), (), ("step_time",)]  # once most of the last 5 are slow


def test_rollback_to_takes_back_the_trend_but_keeps_the_fallback() -> None:
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=0, full_update_every=0, drift=Drift(fallback_steps=5))),
        {0: {"s0.g0": "0"}},
    )
    c = FreezeController(sched, stages=[0], rollback=True)
    _drive(c, [3.0] * 5)
    saved = c.state_dict()
    _drive(c, [2.0] * 20, start=5)
    d = _drive(c, [9.0], start=25)[0]
    assert d.rollback and c.fallbacks == 1
    c.rollback_to(saved)
    st = c.state_dict()
    assert st["losses"] == saved["losses"] and st["step"] == 25
    assert st["fallback_until"] == 30 and st["fallbacks"] == 1
    c.begin_step(26)
    assert c.phase == "fallback"


def _realised(sched, **real):
    from freezeopt.formats.schedule import Realisation

    return dataclasses.replace(sched, realisation=Realisation(**real))


def test_fractional_ratios_are_drawn_per_window_with_the_seed() -> None:
    base = _schedule(Phases(warmup_steps=0, full_update_every=0))
    sched = _realised(
        dataclasses.replace(base, frozen={0: {"s0.g1": "1"}}, ratios={0: {"s0.g0": {0: 0.5}}}),
        redraw_every=2,
        seed=7,
    )
    a, b = FreezeController(sched, stages=[0]), FreezeController(sched, stages=[0])
    hits = 0
    for step in range(0, 400, 2):
        a.begin_step(step)
        b.begin_step(step)
        assert a.frozen_groups(0, 0) == b.frozen_groups(0, 0)  # same seed, same draw
        assert a.frozen_groups(0, 1) == frozenset({1})  # whole-group freezes are not drawn
        hits += 0 in a.frozen_groups(0, 0)
        a.begin_step(step + 1)  # the same window: no redraw
        assert (0 in a.frozen_groups(0, 0)) == (0 in b.frozen_groups(0, 0))
    assert 70 <= hits <= 130  # about half of 200 windows
    other = FreezeController(_realised(sched, redraw_every=2, seed=8), stages=[0])
    draws = []
    for step in range(0, 40, 2):
        other.begin_step(step)
        a.begin_step(step)
        draws.append((0 in other.frozen_groups(0, 0), 0 in a.frozen_groups(0, 0)))
    assert any(x != y for x, y in draws)  # another seed draws otherwise


def test_random_tensors_realisation() -> None:
    base = _schedule(Phases(warmup_steps=0, full_update_every=0))
    sched = _realised(
        dataclasses.replace(
            base, frozen={}, ratios={0: {"s0.g0": {0: 0.5, 2: 0.25}, "s0.g1": {0: 0.5, 2: 0.25}}}
        ),
        kind="random_tensors",
        rescale=False,
        redraw_every=10,
    )
    with pytest.raises(InputError, match="tensor"):
        FreezeController(sched, stages=[0])
    c = FreezeController(sched, stages=[0], tensors={0: [3, 5]})
    assert c.unit == "tensor" and not c.rescale
    seen = set()
    for step in (0, 10, 20, 30):
        c.begin_step(step)
        assert len(c.frozen_groups(0, 0)) == 4 and len(c.frozen_groups(0, 2)) == 2  # round(r·8)
        assert c.frozen_groups(0, 1) == frozenset()
        assert all(0 <= u < 8 for u in c.frozen_groups(0, 0))
        assert (
            c.grad_scales(0) == {}
        )  # TimelyFreeze does not rescale, and no tensor is frozen in all
        seen.add(c.frozen_groups(0, 0))
    assert len(seen) > 1  # redrawn every 10 steps


def test_phase_overrides_in_the_controller() -> None:
    """A schedule's default warm-up (100 steps) freezes nothing in a short loop of one's own: the
    controller takes the same overrides as `freezeopt train`, checked the same way."""
    sched = _with_frozen(_schedule(Phases()), {0: {"s0.g0": "0-1"}})
    assert sched.phases.warmup_steps == 100
    c = FreezeController(sched, stages=[0], warmup_steps=1, full_update_every=0)
    got = []
    for step in range(4):
        c.begin_step(step)
        got.append(c.phase)
    assert got == ["warmup", "freeze", "freeze", "freeze"]
    with pytest.raises(InputError, match="warmup_steps must not be negative"):
        FreezeController(sched, stages=[0], warmup_steps=-1)


def test_end_step_without_the_inputs_of_a_drift_rule_warns_once() -> None:
    sched = _with_frozen(_schedule(Phases(drift=Drift(step_time_error=1e6))), {0: {"s0.g0": "0-1"}})
    c = FreezeController(sched, stages=[0], warmup_steps=0, full_update_every=0)
    with pytest.warns(UserWarning) as seen:
        for step in range(25):
            c.begin_step(step)
            c.end_step(loss=3.0)  # neither grad_norms nor step_ms
    texts = sorted(str(w.message) for w in seen)
    assert len(texts) == 2, texts
    assert "no grad_norms for 10 freezing steps: the gradient-spike drift rule is off" in texts[0]
    assert "no step_ms for 10 freezing steps: the step-time drift rule is off" in texts[1]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        full = FreezeController(sched, stages=[0], warmup_steps=0, full_update_every=0)
        for step in range(25):
            full.begin_step(step)
            full.end_step(loss=3.0, grad_norms={"s0.g0": 1.0}, step_ms=10.0)  # everything given


# --- the groups held to the schedule's fingerprints ---------------------------------------------


def _groups(width: int) -> list[list[torch.nn.Parameter]]:
    """Two groups of real parameters, as a loop of one's own passes them (no names)."""
    return [
        list(torch.nn.Linear(width, width).parameters()),
        list(torch.nn.Linear(width, 2 * width).parameters()),
    ]


def _fingerprinted(sched, width: int):
    fps = tuple(tuple(fingerprint(g) for g in _groups(width)) for _ in sched.pipeline.groups)
    return dataclasses.replace(
        sched, pipeline=dataclasses.replace(sched.pipeline, fingerprints=fps)
    )


def test_groups_of_another_width_are_refused_with_one_line() -> None:
    base = _schedule()
    sched = _fingerprinted(base, 256)
    c = FreezeController(sched, stages=[0, 1])
    c.check_groups(0, _groups(256))
    c.check_groups(1, [list(reversed(g)) for g in _groups(256)])  # order inside a group: free
    with pytest.raises(MismatchError) as e:
        c.check_groups(0, _groups(128))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("stage 0's group s0.g0 holds other parameters than the schedule was")
    assert f"{128 * 128 + 128}-" in msg and f"{256 * 256 + 256}-" in msg
    assert msg.endswith("profile and solve this model (`freezeopt profile` → `freezeopt solve`)")
    with pytest.raises(MismatchError, match=r"stage 1's group s1\.g0"):
        c.check_groups(1, _groups(256)[::-1])  # the groups in another order
    with pytest.raises(MismatchError, match=r"1 parameter groups given, but the schedule has 2"):
        c.check_groups(0, _groups(256)[:1])
    with pytest.raises(MismatchError, match="stage 5 is not in"):
        c.check_groups(5, _groups(256))
    # a schedule without fingerprints (synth's profiles, older files): the count only
    FreezeController(base, stages=[0]).check_groups(0, _groups(128))


def test_tensor_units_are_checked_group_by_group() -> None:
    """For the `random_tensors` realisation the loop passes one unit per tensor (what
    `enable_freezing` gets); the controller regroups them by the tensor counts."""
    sched = _realised(_fingerprinted(_schedule(), 64), kind="random_tensors")
    c = FreezeController(sched, stages=[0], tensors={0: [2, 2]})
    c.check_groups(0, [[p] for g in _groups(64) for p in g])
    c.check_groups(0, _groups(64))  # or the groups themselves
    with pytest.raises(MismatchError, match=r"stage 0's group s0\.g0"):
        c.check_groups(0, [[p] for g in _groups(32) for p in g])


def test_a_replan_with_fingerprints_replaces_a_plan_without() -> None:
    """A re-plan is solved from the profile: its fingerprints may be new beside an older
    schedule's none; what else the pipeline says must still agree."""
    old = _schedule()
    c = FreezeController(old, stages=[0])
    c.set_schedule(_fingerprinted(old, 64))
    c.set_schedule(old)
    other = dataclasses.replace(old, pipeline=dataclasses.replace(old.pipeline, n_microbatches=8))
    with pytest.raises(MismatchError, match="same pipeline"):
        c.set_schedule(_fingerprinted(other, 64))


def test_input_grad_is_not_needed_only_below_stages_frozen_whole() -> None:
    """Backward truncation's decision (`enable_freezing`'s `input_grad`): stage 1 needs no input
    gradient in a microbatch where stage 0 is frozen whole — every group listed, every parameter
    grouped — and only while freezing."""
    s0, s1 = _schedule().pipeline.groups
    sched = _with_frozen(
        _schedule(Phases(warmup_steps=1, full_update_every=0)),
        {0: {s0[0]: "0,2", s0[1]: "0"}, 1: {s1[0]: "0-3"}},
    )
    ctrl = FreezeController(sched, stages=[1], all_grouped=(True, True))
    ctrl.begin_step(0)  # warm-up: full updates, every backward whole
    assert all(ctrl.input_grad_needed(1, m) for m in range(4))
    ctrl.begin_step(1)
    assert [ctrl.input_grad_needed(1, m) for m in range(4)] == [False, True, True, True]
    assert ctrl.input_grad_needed(0, 0)  # stage 0's input is data
    for grouped in (None, (False, True)):  # unknown, or stage 0 holds ungrouped parameters
        other = FreezeController(sched, stages=[1], all_grouped=grouped)
        other.begin_step(1)
        assert other.input_grad_needed(1, 0)
    with pytest.raises(MismatchError, match="all_grouped names 3 stages"):
        FreezeController(sched, stages=[1], all_grouped=(True, True, True))


def _progressive(progression):
    """A schedule that freezes nothing by its plan and grows a prefix by `progression`."""
    from freezeopt.formats.schedule import Progression

    sched = _with_frozen(_schedule(Phases(warmup_steps=0, full_update_every=0)), {})
    return dataclasses.replace(sched, progression=Progression(**progression))


def test_a_linear_progression_freezes_a_growing_prefix_of_whole_groups() -> None:
    sched = _progressive({"kind": "linear", "start": 0.5, "level": 1.0, "total_steps": 8})
    ctrl = FreezeController(sched, stages=[0, 1], all_grouped=(True, True))
    grown = {}
    for step in range(10):
        events = ctrl.begin_step(step)
        grown[step] = [e["frozen_groups"] for e in events if e["event"] == "progression"]
        ctrl.end_step(loss=1.0, grad_norms={})
    # 4 groups: none until half-way, then one more every step; the last group always trains
    assert grown == {0: [], 1: [], 2: [], 3: [], 4: [], 5: [1], 6: [2], 7: [3], 8: [], 9: []}
    ctrl = FreezeController(sched, stages=[0, 1], all_grouped=(True, True))
    ctrl.begin_step(6)  # stage 0 frozen whole: every microbatch, grad None, stage 1 truncates
    assert [ctrl.frozen_groups(0, m) for m in range(4)] == [frozenset({0, 1})] * 4
    assert ctrl.frozen_groups(1, 0) == frozenset()
    assert ctrl.grad_scales(0) == {0: None, 1: None} and ctrl.grad_scales(1) == {}
    assert not any(ctrl.input_grad_needed(1, m) for m in range(4))
    ctrl.begin_step(7)
    assert ctrl.frozen_groups(1, 2) == frozenset({0}) and ctrl.frozen_plan(1)[3] == {0}
    again = FreezeController(sched, stages=[0, 1])
    again.load_state_dict(ctrl.state_dict())
    assert again.frozen_groups(1, 2) == frozenset({0})
    # a full-update phase keeps the prefix frozen: it is frozen for good
    windows = dataclasses.replace(sched, phases=Phases(warmup_steps=0, full_update_every=2))
    ctrl = FreezeController(windows, stages=[0, 1], all_grouped=(True, True))
    for step in range(7):
        ctrl.begin_step(step)
    assert ctrl.phase == "full_window" and ctrl.frozen_groups(0, 1) == frozenset({0, 1})
    assert ctrl.grad_scales(0) == {0: None, 1: None} and not ctrl.input_grad_needed(1, 1)


def test_a_gradient_change_progression_freezes_the_groups_that_changed_least() -> None:
    sched = _progressive({"kind": "gradient_change", "every": 2, "percentile": 0.5})
    names = [f"{s}/{g}" for s, row in enumerate(sched.pipeline.groups) for g in row]
    ctrl = FreezeController(sched, stages=[0, 1])
    windows = [
        [1.0, 1.0, 1.0, 1.0],
        [1.0, 1.01, 2.0, 3.0],  # changes 0, 0.01, 1, 2: the median threshold is 0.01
        [1.0, 1.01, 2.0, 3.0],  # no change for the two still trained: all but the last
    ]
    got = []
    step = 0
    for norms in windows:
        for _ in range(2):
            ctrl.begin_step(step)
            d = ctrl.end_step(loss=1.0, grad_norms=dict(zip(names, norms, strict=True)))
            got += [e["frozen_groups"] for e in d.events if e["event"] == "progression"]
            step += 1
    assert got == [2, 3]  # never the last group
    assert ctrl.frozen_groups(1, 0) == frozenset({0})
