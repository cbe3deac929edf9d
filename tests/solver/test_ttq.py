"""The time-to-quality objective: the budget with the least predicted τ/ρ under the cap, or nothing
frozen (and why) where freezing does not pay; the schedule file says which."""

from __future__ import annotations

import dataclasses

import pytest

from freezeopt.formats.schedule import dump_schedule, parse_schedule
from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.solver import SolveOptions, schedule_from_result, solve, solve_ttq
from freezeopt.solver.ttq import TTQ_FRACTIONS, ttq_ratio
from tests.conftest import make_profile


def _scaled(signal, factor):
    """`signal` with every loss curve multiplied by `factor` (freezing `factor` times as costly)."""
    return tuple(
        tuple(dataclasses.replace(g, loss=tuple(v * factor for v in g.loss)) for g in row)
        for row in signal
    )


def _cheap(p):
    """A signal under which freezing pays on the synthetic profiles: a third of `numel`'s."""
    return _scaled(estimate_signal(p, "numel"), 1 / 3)


def test_the_chosen_plan_has_the_least_predicted_time_to_quality() -> None:
    p = make_profile(microbatches=8, groups=3)
    dag = build_dag(p)
    signal = _cheap(p)
    opts = SolveOptions(mode="lp", objective="ttq", budget=0.3, sensitivity="numel", time_limit=30)
    r = solve_ttq(dag, signal, opts)
    tried = [
        solve(
            dag, signal, dataclasses.replace(opts, objective="step", budget=0.3 * f, time_limit=5)
        )
        for f in TTQ_FRACTIONS
    ]
    assert r.status != "no_gain" and r.frozen
    assert ttq_ratio(r) == pytest.approx(min(ttq_ratio(t) for t in tried), rel=1e-6)
    assert r.budget in {t.budget for t in tried} and r.signal_dropped <= 0.3 + 1e-9
    assert r.time_to_quality == pytest.approx(
        (r.predicted_ms / r.baseline_ms) / (1 - r.signal_dropped)
    )
    assert any("time to quality" in n for n in r.notes)


def test_nothing_is_frozen_where_freezing_does_not_pay() -> None:
    p = make_profile(microbatches=8, groups=3)
    dag = build_dag(p)
    # every plan loses far more progress than it saves time: freezing never pays
    signal = _scaled(estimate_signal(p, "numel"), 20.0)
    opts = SolveOptions(mode="lp", objective="ttq", budget=1.0, sensitivity="numel", time_limit=30)
    r = solve_ttq(dag, signal, opts)
    assert r.status == "no_gain" and not r.frozen
    assert r.predicted_ms == pytest.approx(r.baseline_ms) and r.signal_dropped == 0
    assert r.lp_bound_ms == r.baseline_ms and r.gap == 0 and r.budget == 0  # budget 0: no room
    assert len(r.notes) == 1 and "does not pay" in r.notes[0] and "budgets tried" in r.notes[0]


def test_a_gain_inside_the_margin_is_no_gain(monkeypatch: pytest.MonkeyPatch) -> None:
    import freezeopt.solver.ttq as ttq

    p = make_profile(microbatches=8, groups=3)
    dag = build_dag(p)
    signal = _cheap(p)
    opts = SolveOptions(mode="lp", objective="ttq", budget=0.3, sensitivity="numel", time_limit=30)
    best = solve_ttq(dag, signal, opts)
    assert best.status != "no_gain"
    # a margin wider than the best plan's promise: not worth it
    monkeypatch.setattr(ttq, "TTQ_MARGIN", 1.0 - ttq_ratio(best) + 0.001)
    r = solve_ttq(dag, signal, opts)
    assert r.status == "no_gain" and not r.frozen


def test_the_schedule_records_the_objective_the_cap_and_the_prediction() -> None:
    p = make_profile(microbatches=8, groups=3)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp", objective="ttq", budget=0.3, sensitivity="numel", time_limit=30)
    r = solve_ttq(dag, _cheap(p), opts)
    assert r.status != "no_gain"
    from freezeopt.formats.profile import profile_sha256
    from freezeopt.formats.schedule import Phases

    sched = schedule_from_result(
        r, profile=p, profile_sha256=profile_sha256(p), dag=dag, opts=opts, phases=Phases()
    )
    text = dump_schedule(sched)
    back = parse_schedule(__import__("yaml").safe_load(text))
    assert back.provenance.objective == "ttq" and back.provenance.budget_cap == 0.3
    assert back.provenance.budget == pytest.approx(r.budget, abs=1e-6)
    assert back.prediction.progress_ratio == pytest.approx(1 - r.signal_dropped, abs=1e-4)
    assert back.prediction.time_to_quality == pytest.approx(ttq_ratio(r), abs=1e-4)
    step = schedule_from_result(
        solve(dag, estimate_signal(p, "numel"), dataclasses.replace(opts, objective="step")),
        profile=p,
        profile_sha256=profile_sha256(p),
        dag=dag,
        opts=dataclasses.replace(opts, objective="step"),
        phases=Phases(),
    )
    assert "objective" not in dump_schedule(step) and "budget_cap" not in dump_schedule(step)


def test_an_unknown_objective_names_the_choices() -> None:
    from freezeopt.errors import InputError

    with pytest.raises(InputError, match="step or ttq"):
        SolveOptions(objective="fast")  # type: ignore[arg-type]


def test_auto_takes_time_to_quality_on_the_measured_cost_where_the_profile_has_it() -> None:
    auto = SolveOptions(objective="auto", sensitivity="auto")
    got = auto.for_profile(measured=True)
    assert (got.objective, got.sensitivity) == ("ttq", "measured")
    got = auto.for_profile(measured=False)  # a profile without a probe (synth, older files)
    assert (got.objective, got.sensitivity) == ("step", "gns")
    # ttq only on the measured cost: with a modelled one it froze far too much
    got = SolveOptions(objective="auto", sensitivity="gns").for_profile(measured=True)
    assert (got.objective, got.sensitivity) == ("step", "gns")
    got = SolveOptions(objective="ttq", sensitivity="numel").for_profile(measured=True)
    assert (got.objective, got.sensitivity) == ("ttq", "numel")
    with pytest.raises(Exception, match="resolve it"):
        _ = auto.estimator


def test_solve_on_the_command_line_defaults_to_auto(tmp_path) -> None:
    import subprocess
    import sys

    from freezeopt.formats.profile import save_profile
    from freezeopt.formats.schedule import load_schedule
    from tests.model.test_sensitivity import _probed

    p = make_profile(microbatches=8, groups=3)
    drops = {(st.stage, g.name): 0.1 for st in p.stages for g in st.groups}
    for name, prof in (("plain", p), ("probed", _probed(p, drops))):
        save_profile(prof, tmp_path / f"{name}.json")
        cmd = [sys.executable, "-m", "freezeopt", "solve", str(tmp_path / f"{name}.json")]
        cmd += ["--mode", "lp", "--time-limit", "20", "-o", str(tmp_path / f"{name}.yaml")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert load_schedule(tmp_path / "plain.yaml").provenance.sensitivity == "gns"
    assert load_schedule(tmp_path / "plain.yaml").provenance.objective == "step"
    probed = load_schedule(tmp_path / "probed.yaml").provenance
    assert (probed.objective, probed.sensitivity) == ("ttq", "measured")
