"""Faults at the edges: solver failures, full disks, and files that must never run code."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import freezeopt.solver.pulp_model as pulp_model
import freezeopt.solver.time_limits as time_limits
from freezeopt.cli import app
from freezeopt.errors import LpUnsolved, SolverError
from freezeopt.fileio import atomic_write_text
from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.solver import SolveOptions, solve
from freezeopt.solver.lp_arrays import FastLP
from tests.conftest import make_profile

runner = CliRunner()


def _profile_file(tmp_path: Path) -> Path:
    out = tmp_path / "p.json"
    assert (
        runner.invoke(
            app, ["synth", "--ranks", "2", "--microbatches", "4", "-o", str(out)]
        ).exit_code
        == 0
    )
    return out


def test_solver_missing_is_exit_5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pulp.COIN_CMD.available", lambda self: False)
    r = runner.invoke(app, ["solve", str(_profile_file(tmp_path))])
    assert r.exit_code == 5
    assert (
        r.stderr
        == "error: CBC is not available: install pulp==3.3.2 (it bundles CBC) or use --solver highs\n"
    )


def test_solver_failure_with_and_without_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = make_profile(ranks=4, microbatches=8)
    dag = build_dag(p)
    monkeypatch.setattr(pulp_model, "run_pulp", lambda *a, **k: "no_solution")
    with pytest.raises(SolverError, match="did not solve"):
        solve(dag, estimate_signal(p), SolveOptions(mode="milp"))
    r = solve(dag, estimate_signal(p), SolveOptions(mode="milp", budget=0.1, fallback="heuristic"))
    assert r.status == "heuristic_fallback"
    assert r.mode == "milp"
    assert r.frozen and r.signal_dropped <= 0.1 + 1e-9
    assert r.predicted_ms < r.baseline_ms
    # the bound without the LP: the rank-load bound, never under the all-frozen floor
    assert r.all_frozen_ms - 1e-9 <= r.lp_bound_ms <= r.predicted_ms
    assert any("--fallback heuristic" in n for n in r.notes)
    assert any("rank-load bound" in n for n in r.notes)


def test_an_lp_that_highs_cannot_solve_in_time_says_how_to_answer_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = make_profile(ranks=4, microbatches=8)
    dag, signal = build_dag(p), estimate_signal(p)

    def out_of_time(self: FastLP, deadline: float, *, phase: int, may_stop: bool = False) -> int:
        raise LpUnsolved(
            f"the LP relaxation did not solve (time_limit in phase {phase}); raise --time-limit"
        )

    monkeypatch.setattr(FastLP, "_run", out_of_time)
    for mode in ("lp", "milp"):
        with pytest.raises(LpUnsolved) as e:
            solve(dag, signal, SolveOptions(mode=mode, solver="highs"))
        assert str(e.value) == (
            "the LP relaxation did not solve (time_limit in phase 1); raise --time-limit; "
            "or answer without the LP: --mode heuristic, or --fallback heuristic"
        )
        assert e.value.exit_code == 5  # a SolverError
    r = solve(dag, signal, SolveOptions(mode="lp", solver="highs", fallback="heuristic"))
    assert r.status == "heuristic_fallback"
    assert not any("or answer without the LP" in n for n in r.notes)  # it did


def test_cli_fallback_writes_a_valid_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pulp_model, "run_pulp", lambda *a, **k: "no_solution")
    prof, out = _profile_file(tmp_path), tmp_path / "s.yaml"
    r = runner.invoke(app, ["solve", str(prof), "-o", str(out)])
    assert r.exit_code == 5
    assert r.stderr == (  # one line that says what would answer
        "error: the LP relaxation did not solve (no_solution); raise --time-limit, or use --solver "
        "highs (far faster on large LPs); or answer without the LP: --mode heuristic, or "
        "--fallback heuristic\n"
    )
    assert not out.exists()
    r = runner.invoke(
        app, ["solve", str(prof), "-o", str(out), "--fallback", "heuristic", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["status"] == "heuristic_fallback"
    assert runner.invoke(app, ["validate", str(out), "--profile", str(prof)]).exit_code == 0
    assert yaml.safe_load(out.read_text())["provenance"]["status"] == "heuristic_fallback"


def test_an_lp_that_cannot_fit_the_time_limit_fails_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the LP's floor on its solve time (`CBC_LP_SECONDS_PER_PAIR2`, here raised so that a
    tiny profile needs hours) exceeds the time limit, `milp` and `lp` say so at once instead of
    failing after the limit, and `--fallback heuristic` answers without ever starting CBC."""

    def no_cbc(*a: object, **k: object) -> str:
        raise AssertionError("CBC was started")

    monkeypatch.setattr(time_limits, "CBC_LP_SECONDS_PER_PAIR2", 1.0)  # 2×4 → 64 s or more
    monkeypatch.setattr(pulp_model, "run_pulp", no_cbc)
    prof, out = _profile_file(tmp_path), tmp_path / "s.yaml"
    for mode in ("milp", "lp"):
        r = runner.invoke(app, ["solve", str(prof), "-o", str(out), "--mode", mode])
        assert r.exit_code == 5, r.output
        assert r.stderr.startswith(
            "error: no time for the LP relaxation: at 2×4 it takes 64 s or more with CBC, and the "
            "time limit leaves "
        )
        assert r.stderr.endswith(
            " s; raise --time-limit, or use --solver highs (far faster on large LPs); or answer "
            "without the LP: --mode heuristic, or --fallback heuristic\n"
        )
        assert not out.exists()
    # where HiGHS would most likely not finish either, the hint says how long it takes
    highs_floor = time_limits.LP_SECONDS_PER_PAIR2
    monkeypatch.setattr(time_limits, "LP_SECONDS_PER_PAIR2", 0.5)  # 2×4 → 32 s or more
    r = runner.invoke(app, ["solve", str(prof), "--time-limit", "60"])
    assert r.exit_code == 5
    assert (
        "; raise --time-limit (also with --solver highs, far faster on large LPs: 32 s or more);"
        in r.stderr
    )
    monkeypatch.setattr(time_limits, "LP_SECONDS_PER_PAIR2", highs_floor)
    r = runner.invoke(app, ["solve", str(prof), "--time-limit", "100", "--json"])
    assert str(r.exception) == "CBC was started"  # 64 s fit in 100 s: it is tried
    r = runner.invoke(
        app, ["solve", str(prof), "-o", str(out), "--fallback", "heuristic", "--json"]
    )
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout)
    assert answer["status"] == "heuristic_fallback"
    assert any(n.startswith("no time for the LP relaxation: at 2×4") for n in answer["notes"])
    assert runner.invoke(app, ["validate", str(out), "--profile", str(prof)]).exit_code == 0
    # HiGHS has a floor of its own, and the message no hint to switch to it
    monkeypatch.setattr(time_limits, "LP_SECONDS_PER_PAIR2", 1.0)
    p = make_profile(ranks=2, microbatches=4)
    dag, signal = build_dag(p), estimate_signal(p)
    with pytest.raises(
        LpUnsolved, match=r"with HiGHS, and the time limit leaves .* s; raise --time-limit; or"
    ):
        solve(dag, signal, SolveOptions(mode="lp", solver="highs"))

    # between half the time and all of it the LP is tried, unless an answer without it is allowed
    def no_highs(*a: object, **k: object) -> int:
        raise AssertionError("HiGHS was started")

    monkeypatch.setattr(FastLP, "_run", no_highs)
    with pytest.raises(AssertionError, match="HiGHS was started"):
        solve(dag, signal, SolveOptions(mode="milp", solver="highs", time_limit=100))
    r = solve(
        dag, signal, SolveOptions(mode="milp", solver="highs", time_limit=100, fallback="heuristic")
    )
    assert r.status == "heuristic_fallback"
    assert r.notes[0].startswith(
        "no time for the LP relaxation: at 2×4 it takes 64 s or more with HiGHS, over 50% of the "
    )


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_full_disk_leaves_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    target = tmp_path / "s.yaml"
    target.write_text("previous\n")

    def enospc(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "fsync":
        monkeypatch.setattr(os, "fsync", enospc)
    elif where == "replace":
        monkeypatch.setattr(os, "replace", enospc)
    else:
        import builtins

        import freezeopt.fileio as fileio

        real_open = builtins.open

        class Full:
            def __init__(self, f):  # type: ignore[no-untyped-def]
                self.f = f

            def __enter__(self):  # type: ignore[no-untyped-def]
                return self

            def __exit__(self, *a):  # type: ignore[no-untyped-def]
                self.f.close()

            def write(self, data):  # type: ignore[no-untyped-def]
                enospc()

        def opener(f, mode="r", *a, **k):  # type: ignore[no-untyped-def]
            return (
                Full(real_open(f, mode, *a, **k)) if mode == "wb" else real_open(f, mode, *a, **k)
            )

        monkeypatch.setattr(fileio, "open", opener, raising=False)  # fileio's writes only
    with pytest.raises(Exception, match="No space left on device; the previous file is unchanged"):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "previous\n"
    assert [f.name for f in tmp_path.iterdir()] == ["s.yaml"], "no temporary file left behind"


def test_full_disk_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = _profile_file(tmp_path)
    out = tmp_path / "s.yaml"
    out.write_text("previous\n")

    def enospc(*a: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", enospc)
    r = runner.invoke(app, ["solve", str(prof), "-o", str(out)])
    assert r.exit_code == 1
    assert r.stderr.startswith("error: cannot write") and "previous file is unchanged" in r.stderr
    assert out.read_text() == "previous\n"


def test_files_are_data_only(tmp_path: Path) -> None:
    """No loader imports, evaluates or executes anything a profile or schedule says."""
    marker = tmp_path / "ran"
    payloads = [
        f"!!python/object/apply:os.system ['touch {marker}']",
        f"!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
        "!!python/name:os.system",
    ]
    prof = _profile_file(tmp_path)
    sched = tmp_path / "s.yaml"
    assert runner.invoke(app, ["solve", str(prof), "-o", str(sched)]).exit_code == 0
    text = sched.read_text()
    for payload in payloads:
        evil = tmp_path / "evil.yaml"
        evil.write_text(text.replace("mode: milp", f"mode: {payload}"))
        r = runner.invoke(app, ["validate", str(evil), "--profile", str(prof)])
        assert r.exit_code == 2 and "not valid YAML" in r.stderr
        data = json.loads(prof.read_text())
        data["pipeline"]["schedule"] = "__import__('os').system('touch " + str(marker) + "')"
        evilp = tmp_path / "evil.json"
        evilp.write_text(json.dumps(data))
        r = runner.invoke(app, ["solve", str(evilp), "--mode", "heuristic"])
        assert r.exit_code == 0  # the name is just a string: nothing is evaluated
    assert not marker.exists()
