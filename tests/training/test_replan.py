"""Online re-planning during `freezeopt train`: the cost window, the controller's switch, real runs.

The real runs (2 ranks, gloo, the small tiny GPT of `test_train`) check what the feature promises
and never timings: a re-plan is triggered after the expected step, every rank switches at the same
step (the trainer all-reduces the plan version every step and the report checks each rank's
records), the event and the schedule file are written and load, a slowed stage shows up in the
re-plan's costs and moves the freezing to that stage, and with re-planning off (or never due) the
run is exactly the old one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from freezeopt.actions import Action
from freezeopt.cli import app
from freezeopt.commands import validate_files
from freezeopt.formats.profile import load_profile, profile_sha256, save_profile
from freezeopt.formats.schedule import load_schedule, parse_microbatches
from freezeopt.model.dag import build_dag
from freezeopt.profiling.synth import SynthOptions, synth_profile
from freezeopt.solver.lp_arrays import LpCache
from freezeopt.training.options import CheckpointOptions, ReplanOptions, TrainOptions
from freezeopt.training.replan import CostWindow, ReplanSpec, measured_dag, replan, skipped_ms
from freezeopt.training.runtime import FreezeController
from freezeopt.training.train import TrainReport, format_train_report, train_job
from tests.training.test_train import SMALL, events, metrics, small_job, write_schedule

runner = CliRunner()

# --- units ------------------------------------------------------------------------------------------


def test_cost_window_keeps_the_last_steps_and_takes_medians() -> None:
    w = CostWindow(3)
    for c in (100.0, 1.0, 2.0, 3.0):
        w.add({"0F0": c, "0B0": 2 * c})
    assert len(w) == 3
    assert w.medians() == {"0B0": 4.0, "0F0": 2.0}


def test_skipped_cost_of_groups_and_of_tensor_units() -> None:
    cost = [1.0, 2.0, 4.0]
    assert skipped_ms(cost, frozenset({0, 2})) == 5.0
    # tensors: group 0 has 2 tensors (units 0-1), group 1 has 4 (2-5), group 2 has 1 (6)
    assert skipped_ms(cost, frozenset({1, 2, 3, 6}), unit="tensor", tensors=[2, 4, 1]) == (
        pytest.approx(0.5 + 1.0 + 4.0)
    )


def test_measured_dag_replaces_costs_but_keeps_group_costs_as_a_floor() -> None:
    dag = build_dag(synth_profile(SynthOptions(ranks=2, microbatches=2, groups=2)))
    b = next(a for a in dag.order if a.kind == "B")
    f = Action(0, "F", 0)
    new = measured_dag(dag, {str(f): 123.0, str(b): 0.0})
    assert new.cost[f] == 123.0
    assert new.cost[b] == pytest.approx(sum(dag.group_cost[b.stage]))
    assert new.group_cost == dag.group_cost and new.graph is dag.graph
    untouched = [a for a in dag.order if a not in (f, b)]
    assert all(new.cost[a] == dag.cost[a] for a in untouched)


def test_controller_switches_plans_and_replans_instead_of_falling_back(tmp_path: Path) -> None:
    job = small_job()
    old = load_schedule(
        write_schedule(tmp_path / "a.yaml", job, {0: {"blocks.0": "0-1"}}, step_time_error=0.25)
    )
    new = load_schedule(write_schedule(tmp_path / "b.yaml", job, {1: {"blocks.3": "2-3"}}))
    ctrl = FreezeController(old, stages=(0, 1), replan_on_drift=True)
    ctrl.begin_step(0)
    assert ctrl.frozen_groups(0, 0) == {0} and ctrl.frozen_groups(1, 2) == frozenset()
    ctrl.set_schedule(new)
    ctrl.begin_step(1)
    assert ctrl.frozen_groups(0, 0) == frozenset() and ctrl.frozen_groups(1, 2) == {1}
    # the step-time rule (5 freezing steps far off the 9 ms prediction) asks for a re-plan, no fallback
    ctrl = FreezeController(old, stages=(0, 1), replan_on_drift=True)
    decisions = []
    for step in range(5):
        ctrl.begin_step(step)
        decisions.append(ctrl.end_step(loss=1.0, step_ms=50.0))
    assert [d.replan for d in decisions] == [False] * 4 + [True]
    assert decisions[-1].drift == ("step_time",) and not decisions[-1].rollback
    assert decisions[-1].events[0]["response"] == "replan"
    assert ctrl.fallbacks == 0 and ctrl.phase_at(5) == "freeze"
    # without it the same drift falls back
    plain = FreezeController(old, stages=(0, 1))
    for step in range(5):
        plain.begin_step(step)
        d = plain.end_step(loss=1.0, step_ms=50.0)
    assert not d.replan and plain.fallbacks == 1 and plain.phase_at(5) == "fallback"


def test_replans_of_one_run_share_a_warm_lp(tmp_path: Path) -> None:
    """With one `LpCache` for a run, the second re-plan re-solves the first's LP from its basis;
    the plans are those of cold re-plans in step time, within budget, and a CBC schedule is
    re-planned with HiGHS (the same LP optimum)."""
    from freezeopt.commands import solve_file
    from freezeopt.formats.schedule import Drift, Phases
    from freezeopt.solver import SolveOptions

    prof = synth_profile(SynthOptions(schedule="1F1B", ranks=4, microbatches=8, groups=3))
    path = tmp_path / "p.json"
    save_profile(prof, path)
    phases = Phases(warmup_steps=0, full_update_every=0, drift=Drift(step_time_error=1e6))
    _, sched = solve_file(path, SolveOptions(mode="heuristic", budget=0.1), phases=phases, out=None)
    assert sched.provenance.solver == "cbc"
    spec = ReplanSpec(profile=prof, profile_sha256=profile_sha256(prof), every=5)
    dag = build_dag(prof)
    cache = LpCache()
    for i, slow in enumerate((0, 2, 3)):  # stage `slow`'s actions measured 30 % dearer
        measured = {str(a): c * (1.3 if a.stage == slow else 1.0) for a, c in dag.cost.items()}
        got = replan(spec, sched, measured, step=5 * i, reason="every", lp_cache=cache)
        cold = replan(spec, sched, measured, step=5 * i, reason="every")
        assert got.warm == (i > 0) and not cold.warm
        assert got.schedule.provenance.solver == "highs"
        assert got.new_predicted_ms == pytest.approx(cold.new_predicted_ms, rel=0.02)
        assert got.schedule.prediction.signal_dropped <= 0.1 + 1e-9
        sched = got.schedule if got.adopted else sched
    assert cache.solves == 3 and cache.warm_solves == 2


def test_a_runs_replans_build_the_profiles_dag_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`profile_dag` builds the DAG of a profile once and hands the same one back; another
    profile object gets its own."""
    import freezeopt.training.replan as rp

    built: list[object] = []

    def counting(profile: Any) -> Any:
        built.append(profile)
        return build_dag(profile)

    monkeypatch.setattr(rp, "build_dag", counting)
    a = synth_profile(SynthOptions(schedule="1F1B", ranks=2, microbatches=4, groups=2))
    b = synth_profile(SynthOptions(schedule="1F1B", ranks=2, microbatches=4, groups=2))
    first = rp.profile_dag(a)
    assert rp.profile_dag(a) is first and len(built) == 1
    other = rp.profile_dag(b)
    assert other is not first and built == [a, b]
    assert other.order == first.order and other.cost == first.cost
    assert rp.measured_dag(first, {"0F0": 99.0}).cost[first.order[0]] == 99.0
    assert first.cost[first.order[0]] != 99.0  # the shared DAG is copied, never changed


# --- real runs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from freezeopt.profiling.run import profile_job

    out = tmp_path_factory.mktemp("replan") / "p.json"
    profile_job(small_job(), out=out, progress=False)
    return out


def _frozen_mbs(sched: Any, stage: int) -> int:
    n = sched.pipeline.n_microbatches
    return sum(len(parse_microbatches(v, n)) for v in sched.frozen.get(stage, {}).values())


@pytest.mark.slow
def test_periodic_replan_moves_freezing_to_a_slowed_stage(
    tmp_path: Path, small_profile: Path
) -> None:
    """Stage 1 spins 20 ms per action from the start; the schedule freezes stage 0 only, which
    saves nothing once rank 1 is the bottleneck. Re-planning after every 4th step must see stage
    1's costs go up and freeze stage 1 instead; both ranks switch at the same step."""
    job = small_job()
    sched = write_schedule(tmp_path / "s.yaml", job, {0: {"blocks.0": "0-2", "blocks.1": "0-2"}})
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=10,
            out_dir=tmp_path / "run",
            fault="slow:stage=1,ms=20,step=0",
            progress=False,
            replan=ReplanOptions(profile=small_profile, every=4),
        ),
    )
    evs = [e for e in rep.events if e["event"].startswith("replan")]
    assert evs and evs[0]["event"] == "replan" and evs[0]["reason"] == "every"
    assert evs[0]["trigger_step"] == 3  # after step 3: (3 + 1) % 4 == 0, 3 measured steps
    assert evs[0]["warm"] is False  # the run's first LP is solved cold; later ones may be warm
    assert all(isinstance(e["warm"], bool) for e in evs)
    assert all(e["trigger_step"] in (3, 7) for e in evs)
    first = evs[0]
    assert 3 < first["step"] <= 10
    assert rep.replans == sum(e["event"] == "replan" for e in evs) >= 1
    # (a re-plan finished after the last step would run from step 10: adopted, never run here)
    assert rep.replan_steps == tuple(
        e["step"] for e in evs if e["event"] == "replan" and e["step"] < 10
    )
    assert evs == [e for e in events(tmp_path / "run") if e["event"].startswith("replan")]
    text = format_train_report(rep)
    assert f"{rep.replans} re-plans" in text and text.endswith(", replans/")
    assert f"step {evs[0]['step']}: replan (every, triggered after step 3)" in text
    # the plan version each step ran, as rank 0 logged it, switches exactly at the re-plan steps
    plans = [(m["step"], m["plan"]) for m in metrics(tmp_path / "run") if "plan" in m]
    switched = [s for (s, v), (_, u) in zip(plans[1:], plans, strict=False) if v != u]
    assert tuple(switched) == rep.replan_steps
    # the file: loads, validates against the profile, and its prediction is the event's
    path = Path(first["file"])
    assert path == tmp_path / "run" / "replans" / f"step-{first['step']:08d}.yaml"
    new = load_schedule(path)
    validate_files(path, small_profile)
    assert new.prediction.predicted_ms == pytest.approx(first["new_predicted_ms"], rel=1e-4)
    # the slowed stage: its 8 actions spin 20 ms more each (of thread-CPU time, which is what
    # the run measures), so the no-freeze step time on the measured costs is far above the
    # profile's (half of it is required: the profile's other work and bubbles may shrink)
    prof_baseline = _profile_baseline(small_profile)
    assert first["baseline_ms"] > prof_baseline + 8 * 20 / 2
    assert first["new_predicted_ms"] < first["old_predicted_ms"]
    old = load_schedule(sched)
    assert _frozen_mbs(old, 1) == 0 and _frozen_mbs(new, 1) > 0
    # both ranks run the last plan adopted before the end (on a host so slow that the first
    # re-plan's solve outlasts the run, the first schedule): each action's skipped groups are
    # that file's
    ran = [e for e in evs if e["event"] == "replan" and e["step"] < 10]
    _assert_actions_follow(rep, load_schedule(Path(ran[-1]["file"])) if ran else old)
    # the active plan is in the checkpoints: a resume (re-planning off now) continues with it
    adopted = [e for e in evs if e["event"] == "replan"]
    more = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=12,
            out_dir=tmp_path / "run",
            progress=False,
            checkpoints=CheckpointOptions(resume=True),
        ),
    )
    assert more.start_step == 10 and more.replans == 0
    _assert_actions_follow(more, load_schedule(Path(adopted[-1]["file"])))


def _profile_baseline(profile: Path) -> float:
    from freezeopt.model.simulate import simulate

    return simulate(build_dag(load_profile(profile))).makespan


def _assert_actions_follow(rep: TrainReport, sched: Any, kind: str = "B") -> None:
    want: dict[str, set[str]] = {}
    n = sched.pipeline.n_microbatches
    for s, groups in sched.frozen.items():
        for name, mbs in groups.items():
            for m in parse_microbatches(mbs, n):
                want.setdefault(f"{s}{kind}{m}", set()).add(name)
    got = {a["action"]: set(a["frozen"]) for a in rep.actions if a["frozen"]}
    assert got == want  # rank 0's actions (stage 0) and rank 1's (stage 1) alike


@pytest.mark.slow
def test_replan_on_a_split_backward_schedule(tmp_path: Path) -> None:
    """ZBVZeroBubble (I and W actions, 4 stages on 2 ranks): the skipped work is added back to the
    `W` actions, the re-plan fits the pipeline, and both ranks run it."""
    from freezeopt.profiling.run import profile_job

    job = small_job(schedule="ZBVZeroBubble", stages_per_rank=2)
    profile_job(job, out=tmp_path / "p.json", progress=False)
    sched = write_schedule(tmp_path / "s.yaml", job, {0: {"blocks.0": "0-3"}})
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=10,
            out_dir=tmp_path / "run",
            fault="slow:stage=2,ms=20,step=0",
            progress=False,
            replan=ReplanOptions(profile=tmp_path / "p.json", every=4),
        ),
    )
    evs = [e for e in rep.events if e["event"] == "replan"]
    assert evs and evs[0]["trigger_step"] == 3
    assert rep.replan_steps == tuple(e["step"] for e in evs if e["step"] < 10)
    new = load_schedule(Path(evs[0]["file"]))
    validate_files(Path(evs[0]["file"]), tmp_path / "p.json")
    assert _frozen_mbs(new, 2) > 0  # the slowed stage gets frozen work
    assert evs[0]["new_predicted_ms"] < evs[0]["old_predicted_ms"]
    # the ranks run the schedule in force at the end: the last re-plan adopted before step 10, or
    # (on a host slow enough that the re-plan's solve outlasts the run) the first schedule
    adopted = [e for e in evs if e["step"] < 10]
    in_force = load_schedule(Path(adopted[-1]["file"])) if adopted else load_schedule(sched)
    _assert_actions_follow(rep, in_force, kind="W")


@pytest.mark.slow
def test_a_replan_still_solving_at_the_end_is_waited_for_and_reported(
    tmp_path: Path, small_profile: Path
) -> None:
    """The solver process waits 10 s before solving (test-only fault; two tiny steps take well under
    a second, tens of times that on a loaded host); the re-plan triggered after step 3 of 6 is
    still solving when the last step ends. The run waits for it and reports it at
    step 6: its event and file are written, no step ran it."""
    job = small_job()
    sched = write_schedule(tmp_path / "s.yaml", job, {0: {"blocks.0": "0-2"}})
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=6,
            out_dir=tmp_path / "run",
            fault="slow_replan:ms=10000",
            progress=False,
            replan=ReplanOptions(profile=small_profile, every=4),
        ),
    )
    evs = [e for e in rep.events if e["event"].startswith("replan")]
    assert len(evs) == 1 and evs[0]["trigger_step"] == 3 and evs[0]["step"] == 6
    assert evs[0]["event"] in ("replan", "replan_rejected")
    assert Path(evs[0]["file"]).is_file() and rep.replan_steps == ()
    assert evs == [e for e in events(tmp_path / "run") if e["event"].startswith("replan")]


@pytest.mark.slow
def test_step_time_drift_replans_instead_of_falling_back(
    tmp_path: Path, small_profile: Path
) -> None:
    """As in test_train's slowed-stage test the step-time rule fires after step 9; with
    --replan-on-drift the run keeps freezing and re-plans from that step."""
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml",
        job,
        {0: {"blocks.0": "0-2", "blocks.1": "0-2"}},
        warmup=5,
        fallback_steps=2,
        step_time_error=0.25,
    )
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=13,
            out_dir=tmp_path / "run",
            fault="slow:stage=1,ms=15,step=5",
            progress=False,
            replan=ReplanOptions(profile=small_profile, on_drift=True),
        ),
    )
    drifts = [e for e in rep.events if e["event"] == "drift"]
    assert drifts and drifts[0]["rules"] == ["step_time"] and drifts[0]["step"] == 9
    assert drifts[0]["response"] == "replan" and rep.fallbacks == 0
    assert not any(e["event"] == "phase" and e["to"] == "fallback" for e in rep.events)
    evs = [e for e in rep.events if e["event"].startswith("replan")]
    assert evs and evs[0]["trigger_step"] == 9 and evs[0]["reason"] == "step_time"
    assert evs[0]["event"] == "replan" and rep.replans >= 1
    assert load_schedule(Path(evs[0]["file"])).provenance.budget == 0.5  # the schedule's own


@pytest.mark.slow
def test_replanning_off_or_never_due_is_the_old_run(tmp_path: Path, small_profile: Path) -> None:
    job = small_job()
    sched = write_schedule(tmp_path / "s.yaml", job, {0: {"blocks.0": "0-1"}, 1: {"blocks.3": "3"}})
    off_opts = TrainOptions(schedule=sched, steps=5, progress=False, out_dir=tmp_path / "off")
    off = train_job(job, off_opts)
    replan = ReplanOptions(profile=small_profile, every=100)
    idle = train_job(job, dataclasses.replace(off_opts, out_dir=tmp_path / "idle", replan=replan))
    assert off.losses == idle.losses and off.val_loss == idle.val_loss
    assert off.replans == idle.replans == 0 and off.replan_steps == idle.replan_steps == ()
    assert not (tmp_path / "off" / "replans").exists()
    assert not (tmp_path / "idle" / "replans").exists()

    def strip(evs: list[dict[str, Any]]) -> list[Any]:
        return [{k: v for k, v in e.items() if k != "path"} for e in evs]

    assert strip(events(tmp_path / "off")) == strip(events(tmp_path / "idle"))
    assert all("plan" not in m for m in metrics(tmp_path / "off"))
    assert [m["plan"] for m in metrics(tmp_path / "idle") if "loss" in m] == [0] * 5


# --- user errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--replan-every", "4"], "need --profile"),
        (["--replan-on-drift", "--profile", "p.json", "--replan-mode", "fast"], "--replan-mode"),
        (["--replan-every", "-1"], "must not be negative"),
        (["--replan-every", "2", "--profile", "p.json", "--replan-time-limit", "0"], "positive"),
    ],
)
def test_replan_user_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    job = small_job()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "small", **SMALL}))
    write_schedule(tmp_path / "s.yaml", job, {0: {"blocks.0": "0"}})
    (tmp_path / "p.json").write_text("{}")
    res = runner.invoke(
        app, ["train", "job.yaml", "--steps", "3", "--schedule", "s.yaml", *extra, "--no-progress"]
    )
    assert res.exit_code != 0
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert message in res.stderr


def test_replan_needs_a_schedule_and_a_fitting_profile(tmp_path: Path) -> None:
    from freezeopt.errors import InputError, MismatchError
    from freezeopt.formats.profile import save_profile

    job = small_job()
    with pytest.raises(
        InputError, match=r"^replan\.every, replan\.on_drift and replan\.costs need schedule$"
    ):
        TrainOptions(steps=3, out_dir=tmp_path / "x", replan=ReplanOptions(every=2))
    sched = write_schedule(tmp_path / "s.yaml", job, {0: {"blocks.0": "0"}})
    other = synth_profile(SynthOptions(ranks=2, microbatches=4, groups=2))
    save_profile(other, tmp_path / "other.json")
    with pytest.raises(MismatchError, match="does not fit the schedule"):
        train_job(
            job,
            TrainOptions(
                schedule=sched,
                steps=3,
                out_dir=tmp_path / "x",
                progress=False,
                replan=ReplanOptions(profile=tmp_path / "other.json", every=2),
            ),
        )
    assert not (tmp_path / "x").exists()


def _window(profile: Any, drops: dict[tuple[int, str], float], steps: int = 3) -> Any:
    """`WindowCosts` whose probe loss falls by `drops[(stage, group)]` per group over `steps`."""
    from freezeopt.training.replan import WindowCosts

    per = {k: -d / steps for k, d in drops.items()}
    loss = [4.0]
    for _ in range(steps):
        loss.append(loss[-1] + sum(per.values()))
    return WindowCosts(
        loss_change={k: (v,) * steps for k, v in per.items()}, probe_loss=tuple(loss), steps=steps
    )


def test_replans_from_a_windows_loss_costs_open_and_close_the_gate(tmp_path: Path) -> None:
    """A window whose progress comes from one group makes freezing the others pay (the re-plan
    freezes them); one whose progress is spread evenly makes no plan pay (the re-plan freezes
    nothing, and is adopted: the current plan's time to quality is then worse than not freezing).
    The time-to-quality solve keeps the schedule's budget cap."""
    from freezeopt.commands import solve_file
    from freezeopt.formats.schedule import Drift, Phases
    from freezeopt.solver import SolveOptions
    from tests.model.test_sensitivity import _probed

    prof = synth_profile(SynthOptions(schedule="1F1B", ranks=2, microbatches=4, groups=4))
    keys = [(st.stage, g.name) for st in prof.stages for g in st.groups]
    even = {k: 0.1 for k in keys}
    one = {k: (0.4 if k == keys[-1] else 0.0005) for k in keys}  # the last group's progress
    prof = _probed(prof, even)
    path = tmp_path / "p.json"
    save_profile(prof, path)
    phases = Phases(warmup_steps=2, full_update_every=0, drift=Drift(step_time_error=1e6))
    opts = SolveOptions(budget=0.5, objective="ttq", sensitivity="measured")
    _, sched = solve_file(path, opts, phases=phases, out=None)
    assert not sched.frozen  # even shares: nothing pays
    spec = ReplanSpec(profile=prof, profile_sha256=profile_sha256(prof), costs=True)
    measured = {str(a): c for a, c in build_dag(prof).cost.items()}

    opened = replan(spec, sched, measured, step=1, reason="costs", costs=_window(prof, one))
    assert opened.adopted and opened.schedule.frozen, opened.why
    new = opened.schedule
    assert new.provenance.objective == "ttq" and new.provenance.budget_cap == 0.5
    assert new.provenance.sensitivity == "measured"
    assert new.prediction.time_to_quality < 0.95
    assert new.prediction.signal_dropped <= 0.5 + 1e-9
    frozen_groups = {(s, g) for s, per in new.frozen.items() for g in per}
    assert (keys[-1][0], keys[-1][1]) not in frozen_groups  # the group that makes the progress

    closed = replan(spec, new, measured, step=9, reason="costs", costs=_window(prof, even))
    assert closed.adopted and not closed.schedule.frozen, closed.why
    assert "no_gain" in closed.status or closed.schedule.prediction.time_to_quality == 1.0

    # the same window again: the same plan, not adopted
    again = replan(spec, new, measured, step=9, reason="costs", costs=_window(prof, one))
    assert not again.adopted and again.why == "the same plan"


def test_a_window_must_cover_every_group_and_its_steps() -> None:
    from freezeopt.training.replan import WindowCosts, with_window_costs
    from tests.model.test_sensitivity import _probed

    prof = synth_profile(SynthOptions(schedule="1F1B", ranks=2, microbatches=4, groups=2))
    keys = [(st.stage, g.name) for st in prof.stages for g in st.groups]
    prof = _probed(prof, {k: 0.1 for k in keys})
    got = with_window_costs(prof, _window(prof, {k: 0.2 for k in keys}, steps=2))
    assert all(t.loss_change == (-0.1, -0.1) for t in got.gradients)
    assert got.probe is not None and len(got.probe.loss) == 3
    assert got.probe.batches == prof.probe.batches  # and the branch runs' calibration kept
    with pytest.raises(ValueError, match="no loss change for stage"):
        with_window_costs(prof, WindowCosts(loss_change={}, probe_loss=(1.0,)))
    bad = _window(prof, {k: 0.2 for k in keys}, steps=2)
    with pytest.raises(ValueError, match="same steps"):
        with_window_costs(prof, WindowCosts(loss_change=bad.loss_change, probe_loss=(1.0,)))
    with pytest.raises(ValueError, match="one per stretch"):
        WindowCosts(loss_change=bad.loss_change, probe_loss=bad.probe_loss, steps=1)
    # one stretch over 3 steps (an adaptive run's measurement): the shares as they are
    one = WindowCosts(loss_change={k: (-0.3,) for k in keys}, probe_loss=(4.0, 2.8), steps=3)
    assert all(t.loss_change == (-0.3,) for t in with_window_costs(prof, one).gradients)


def test_cost_windows_measure_their_last_steps_whatever_the_cadence() -> None:
    """A measurement starts where at most `LCA_STEPS` steps of its window are left — also when
    the next window starts within `LCA_STEPS` steps of this one."""
    from types import SimpleNamespace

    from freezeopt.formats.schedule import Phases
    from freezeopt.training.online import OnlinePlanning

    def due(warmup: int, every: int, length: int, steps: int) -> list[int]:
        """The steps before which a measurement starts if none runs (this stub never starts
        one, so a stretch's later steps are listed too)."""
        phases = Phases(warmup_steps=warmup, full_update_every=every, full_update_steps=length)
        run = OnlinePlanning()
        run.replan_spec = SimpleNamespace(costs=True)  # type: ignore[assignment]
        run.ctrl = SimpleNamespace(schedule=SimpleNamespace(phases=phases))
        run.spec = SimpleNamespace(options=SimpleNamespace(steps=steps))
        run.lca = None
        return [s for s in range(steps) if run._cost_due(s)]

    # warm-up 0-4 (its last 3 steps from 2), then 2-step windows from every 4th step after it
    assert due(5, 4, 2, 16) == [2, 3, 4, 9, 10, 13, 14]
    # 1-step windows every 3 steps: each window is measured (8, 11, 14), the warm-up from 2
    assert due(5, 3, 1, 16) == [2, 3, 4, 8, 11, 14]
    # without windows after warm-up, warm-up alone; a window cut by the run's end still counts
    assert due(5, 0, 1, 16) == [2, 3, 4]
    assert due(5, 4, 3, 10) == [2, 3, 4, 9]


def _adaptive_run(
    tmp_path: Path, profile: Path, drift: Any, *, steps: int, fault: str | None = None
) -> tuple[Path, TrainReport]:
    """A ttq schedule of `profile` with warm-up 5 and 2-step full-update windows every 4 steps,
    trained `steps` steps with `--adaptive`: (the schedule, the run's report)."""
    from freezeopt.commands import solve_file
    from freezeopt.formats.schedule import Phases
    from freezeopt.solver import SolveOptions

    phases = Phases(warmup_steps=5, full_update_every=4, full_update_steps=2, drift=drift)
    opts = SolveOptions(budget=0.3, objective="ttq", sensitivity="measured", mode="heuristic")
    sched = tmp_path / "s.yaml"
    solve_file(profile, opts, phases=phases, out=sched)
    rep = train_job(
        small_job(),
        TrainOptions(
            schedule=sched,
            steps=steps,
            out_dir=tmp_path / "run",
            progress=False,
            fault=fault,
            replan=ReplanOptions(profile=profile, costs=True),
        ),
    )
    return sched, rep


@pytest.mark.slow
def test_adaptive_run_measures_loss_costs_in_its_windows_and_replans_from_them(
    tmp_path: Path, small_profile: Path
) -> None:
    """`--adaptive`: the last 3 steps of warm-up and each full-update window (by the schedule's
    cadence) measure the probe's loss-change allocation on every rank, from the probe at the
    stretch's two ends; at a window's last step the run re-plans by time to quality from it
    (reason `costs`), and the event says what the window measured — its groups' shares add up to
    the probe loss's change. The probe passes' time is `probe_ms`, in those two steps only."""
    from freezeopt.formats.schedule import Drift

    sched, rep = _adaptive_run(tmp_path, small_profile, Drift(step_time_error=1e6), steps=16)
    rows = [m for m in metrics(tmp_path / "run") if "step_ms" in m]
    # the cost windows: warm-up 0-4 (its last 3 steps measured: probes before step 2 and after
    # step 4), then 2 steps from every 4th step after it (9-10, 13-14)
    probes = {2, 4, 9, 10, 13, 14}
    assert {m["step"] for m in rows if m["probe_ms"] > 0} == probes
    assert all(not m["freezing"] for m in rows if m["step"] in probes | {3})
    allr = [e for e in rep.events if e["event"].startswith("replan")]
    assert allr and all(e["reason"] == "costs" for e in allr), allr
    assert all(e["event"] != "replan_failed" for e in allr), allr
    evs = [e for e in allr if e["event"] in ("replan", "replan_rejected")]
    assert all(
        e["window"]["probe_loss"][1] >= e["window"]["probe_loss"][0]
        or e["window"]["allocated"] >= 0
        for e in allr
        if e["event"] == "replan_skipped"
    ), allr
    first = evs[0]
    assert first["trigger_step"] == 4  # the warm-up's window, re-planned at once
    w = first["window"]
    assert w["steps"] == 3
    change = w["probe_loss"][1] - w["probe_loss"][0]
    assert change < 0 and w["allocated"] == pytest.approx(change, rel=0.2)
    new = load_schedule(Path(first["file"]))
    assert new.provenance.objective == "ttq" and new.provenance.sensitivity == "measured"
    assert new.provenance.budget_cap == 0.3
    # later windows re-plan at their end, or once the re-plan in flight is in
    assert all(10 <= e["trigger_step"] <= 14 for e in evs[1:]), evs
    assert all(e["window"]["steps"] == 2 for e in evs[1:] if "window" in e), evs

    # measuring leaves training as it was: the same schedule without --adaptive, the same
    # losses up to the first adopted re-plan
    plain = train_job(
        small_job(),
        TrainOptions(schedule=sched, steps=16, out_dir=tmp_path / "plain", progress=False),
    )
    switch = min((e["step"] for e in evs if e["event"] == "replan"), default=16)
    mine = [m["loss"] for m in rows if m["step"] < switch]
    theirs = [m["loss"] for m in metrics(tmp_path / "plain") if "step_ms" in m][:switch]
    assert mine == theirs and len(mine) == switch
    assert plain.replans == 0


@pytest.mark.slow
def test_adaptive_window_whose_shares_add_up_to_a_rise_replans_nothing(
    tmp_path: Path, small_profile: Path
) -> None:
    """A window whose shares add up to a rise (here its first step climbs the gradient: an
    injected learning rate of −100×) has no shares of a fall to plan from: a `replan_skipped`
    event, and no re-plan from it."""
    from freezeopt.formats.schedule import Drift

    drift = Drift(step_time_error=1e6, loss_rise=1e6, grad_norm_spike=1e6)
    fault = "lr_spike:step=9,factor=-100"
    _, rep = _adaptive_run(tmp_path, small_profile, drift, steps=12, fault=fault)
    skipped = [e for e in rep.events if e["event"] == "replan_skipped"]
    assert [e["trigger_step"] for e in skipped] == [10], rep.events
    w = skipped[0]["window"]
    assert w["steps"] == 2 and w["allocated"] > 0
    assert skipped[0]["reason"] == "costs" and "did not fall" in skipped[0]["why"]
    later = [e for e in rep.events if e["event"] in ("replan", "replan_rejected")]
    assert all(e["trigger_step"] != 10 for e in later), later


def test_adaptive_needs_a_probe_and_gradient_traces(tmp_path: Path, small_profile: Path) -> None:
    from freezeopt.errors import InputError

    sched = write_schedule(tmp_path / "s.yaml", small_job(), {})
    for job, says in ((small_job(probe_batches=0), "probe_batches: 0"),):
        with pytest.raises(InputError, match=says):
            train_job(
                job,
                TrainOptions(
                    schedule=sched,
                    steps=2,
                    out_dir=tmp_path / "run",
                    progress=False,
                    replan=ReplanOptions(profile=small_profile, costs=True),
                ),
            )
    with pytest.raises(InputError, match="pass one of them"):
        ReplanOptions(profile=small_profile, costs=True, every=4)
