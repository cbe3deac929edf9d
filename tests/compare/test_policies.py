"""Baseline policies: each is a valid schedule for the profile, built the way its paper does."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from freezeopt.compare.policies import (
    MATCH_TOLERANCE,
    POLICIES,
    matched_stage_cap,
    merged_profile,
    policy_schedule,
)
from freezeopt.compare.timelyfreeze import solve_timelyfreeze_lp
from freezeopt.formats.schedule import check_fits, dump_schedule, parse_microbatches, parse_schedule
from freezeopt.model.dag import build_dag, schedule_plan
from freezeopt.model.sensitivity import estimate_signal
from tests.conftest import make_profile


@pytest.fixture(scope="module")
def profile():
    return make_profile(ranks=4, microbatches=8, groups=3, seed=2)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_a_valid_fitting_schedule(profile, policy: str) -> None:
    sched, r = policy_schedule(profile, policy, budget=0.1, time_limit=20)  # type: ignore[arg-type]
    again = parse_schedule(yaml.safe_load(dump_schedule(sched)))
    assert check_fits(again, profile) == []
    assert again.provenance.mode == policy
    assert r.predicted_ms <= r.baseline_ms + 1e-9
    if policy == "timelyfreeze-matched":
        assert abs(r.signal_dropped - 0.1) <= MATCH_TOLERANCE * 0.1
    elif policy != "timelyfreeze":
        assert r.signal_dropped <= 0.1 + 1e-9


def test_none_freezes_nothing(profile) -> None:
    sched, r = policy_schedule(profile, "none")
    assert sched.frozen == {} and r.predicted_ms == pytest.approx(r.baseline_ms)


def test_uniform_spreads_evenly(profile) -> None:
    sched, r = policy_schedule(profile, "uniform", budget=0.2, seed=1)
    per_action: dict = {}
    for a, _ in r.frozen:
        per_action[a] = per_action.get(a, 0) + 1
    backwards = [a for a in build_dag(profile).order if a.has_weight_grad]
    counts = [per_action.get(a, 0) for a in backwards]
    assert max(counts) - min(counts) <= 1 and sum(counts) > 0
    other, _ = policy_schedule(profile, "uniform", budget=0.2, seed=2)
    assert other.frozen != sched.frozen, "groups are drawn at random per seed"


def test_stability_freezes_whole_groups_most_stable_first(profile) -> None:
    # give one group (stage 2, third group) the lowest effective perturbation: it goes first
    traces = tuple(
        dataclasses.replace(
            t, effective_perturbation=(0.01,) if (t.stage, t.group) == (2, "s2.g2") else (0.9,)
        )
        for t in profile.gradients
    )
    p = dataclasses.replace(profile, gradients=traces)
    share = next(g.share for row in estimate_signal(p, "gns") for g in row if g.group == "s2.g2")
    sched, _ = policy_schedule(p, "stability", budget=share + 1e-9)
    m = profile.pipeline.n_microbatches
    assert sched.frozen == {2: {"s2.g2": f"0-{m - 1}"}}
    sched, _ = policy_schedule(p, "stability", budget=0.5)
    assert "s2.g2" in sched.frozen[2] and len(sched.frozen) > 1
    for groups in sched.frozen.values():
        for mbs in groups.values():
            assert parse_microbatches(mbs, m) == tuple(range(m))


def test_timelyfreeze_is_its_lp_and_realisation(profile) -> None:
    sched, r = policy_schedule(profile, "timelyfreeze", stage_cap=0.9)
    assert sched.realisation.kind == "random_tensors"
    assert sched.realisation.redraw_every == 10 and sched.realisation.rescale is False
    tf = solve_timelyfreeze_lp(build_dag(merged_profile(profile)), stage_cap=0.9)
    assert r.predicted_ms == pytest.approx(tf.makespan, rel=1e-6)
    # one ratio per action, applied to every group of the stage
    dag = build_dag(profile)
    plan = schedule_plan(sched, dag)
    for a, ratio in tf.ratios.items():
        for g in range(len(dag.group_names[a.stage])):
            assert plan.get((a, g), 0.0) == pytest.approx(ratio, abs=1e-4)


@pytest.mark.parametrize("budget", [0.03, 0.1, 0.3])
def test_matched_cap_drops_the_budget(profile, budget: float) -> None:
    cap, r = matched_stage_cap(profile, budget, time_limit=20)
    assert 0 < cap < 1
    assert abs(r.signal_dropped - budget) <= MATCH_TOLERANCE * budget
    assert matched_stage_cap(profile, budget, time_limit=20)[0] == cap, "deterministic"
    # it is TimelyFreeze's LP at that cap, written as a TimelyFreeze schedule
    tf = solve_timelyfreeze_lp(build_dag(merged_profile(profile)), stage_cap=cap)
    assert r.predicted_ms == pytest.approx(tf.makespan, rel=1e-6)
    sched, again = policy_schedule(profile, "timelyfreeze-matched", budget=budget, time_limit=20)
    assert sched.provenance.stage_cap == pytest.approx(cap)
    assert sched.realisation.kind == "random_tensors" and sched.realisation.rescale is False
    assert again.signal_dropped == pytest.approx(r.signal_dropped)


def test_matched_cap_grows_with_the_budget_and_stops_at_1(profile) -> None:
    caps = [matched_stage_cap(profile, b, time_limit=20)[0] for b in (0.05, 0.1, 0.2)]
    assert caps == sorted(caps) and len(set(caps)) == 3
    top, r = matched_stage_cap(profile, 1.0, time_limit=20)
    assert top == 1.0 and r.signal_dropped < 1.0 and "cannot drop more" in r.notes[-1]


def test_the_progressive_policies_carry_their_rules(profile) -> None:
    """`composer` and `autofreeze` plan nothing up front: their schedules carry the rule the
    runtime grows a frozen prefix by, scaled to the run's length."""
    composer, r = policy_schedule(profile, "composer", total_steps=300)
    assert composer.frozen == {} and r.predicted_ms == pytest.approx(r.baseline_ms)
    assert composer.progression is not None
    assert (composer.progression.kind, composer.progression.start) == ("linear", 0.5)
    assert (composer.progression.level, composer.progression.total_steps) == (1.0, 300)
    auto, _ = policy_schedule(profile, "autofreeze", total_steps=300)
    assert auto.progression is not None and auto.progression.kind == "gradient_change"
    assert auto.progression.every == 15  # 5 % of the run
    back = parse_schedule(yaml.safe_load(dump_schedule(auto)))
    assert back.progression == auto.progression
    assert "progression" not in dump_schedule(policy_schedule(profile, "none")[0])
