"""The command line end to end: data on stdout, one-line errors with documented exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from freezeopt.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    out = tmp_path / "p.json"
    r = run(
        "synth",
        "--schedule",
        "1F1B",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--groups",
        "2",
        "-o",
        out,
    )
    assert r.exit_code == 0, r.output
    return out


def test_synth_solve_simulate_validate(tmp_path: Path, profile: Path) -> None:
    sched = tmp_path / "s.yaml"
    r = run("solve", profile, "--budget", "0.2", "-o", sched, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    for key in (
        "status",
        "mode",
        "solver",
        "baseline_ms",
        "all_frozen_ms",
        "lp_bound_ms",
        "predicted_ms",
        "gap",
        "signal_dropped",
        "solve_seconds",
    ):
        assert key in data
    assert data["predicted_ms"] <= data["baseline_ms"]
    png = tmp_path / "g.png"
    r = run("simulate", sched, "--profile", profile, "--gantt", png, "--json")
    assert r.exit_code == 0, r.output
    sim = json.loads(r.stdout)
    assert sim["predicted_ms"] == pytest.approx(data["predicted_ms"], rel=1e-4)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = run("validate", sched, "--profile", profile)
    assert r.exit_code == 0 and r.stdout.startswith("ok:")


def test_solve_is_deterministic(tmp_path: Path, profile: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for out in (a, b):
        assert run("solve", profile, "-o", out).exit_code == 0
    assert a.read_bytes() == b.read_bytes()


def test_the_committed_schedule_is_what_solve_writes(tmp_path: Path) -> None:
    """schedules/tiny-gpt-1f1b.yaml is README's `solve` of the committed profile, byte for byte:
    a change to the solver or the file format that moves it shows here. If the change is meant,
    write it again with README's command (`freezeopt solve profiles/tiny-gpt-1f1b.json --budget
    0.1 -o schedules/tiny-gpt-1f1b.yaml`) and commit it with the change (a version bump changes
    it too: the file records freezeopt's version)."""
    root = Path(__file__).parent.parent
    committed = root / "schedules" / "tiny-gpt-1f1b.yaml"
    profile = root / "profiles" / "tiny-gpt-1f1b.json"
    out = tmp_path / "s.yaml"
    r = run("solve", profile, "--budget", "0.1", "-o", out)
    assert r.exit_code == 0, r.output
    assert out.read_text() == committed.read_text()
    r = run("validate", committed, "--profile", profile)
    assert r.exit_code == 0 and r.stdout.startswith("ok:"), r.output


@pytest.mark.parametrize("mode", ["lp", "heuristic"])
@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_modes_and_solvers(profile: Path, mode: str, solver: str) -> None:
    r = run("solve", profile, "--mode", mode, "--solver", solver, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["mode"] == mode


def test_human_output(tmp_path: Path, profile: Path) -> None:
    r = run("solve", profile)
    assert r.exit_code == 0
    assert "LP bound" in r.stdout and "predicted" in r.stdout
    assert r.stdout.rstrip().endswith("no schedule written (pass -o FILE.yaml to write one)")
    r = run("solve", profile, "-o", tmp_path / "s.yaml")
    assert r.stdout.rstrip().endswith(f"wrote {tmp_path / 's.yaml'}")


def test_human_output_without_the_lp_names_its_bound(
    tmp_path: Path, profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the heuristic answers without the LP, the bound it prints is not the LP's."""
    import freezeopt.solver.modes as solve_mod

    monkeypatch.setattr(solve_mod, "LP_BUILD_PER_TIMER", 1e12)
    model = tmp_path / "m.lp"
    r = run("solve", profile, "--mode", "heuristic", "--solver", "highs", "--write-model", model)
    assert r.exit_code == 0, r.output
    assert "heuristic_fallback" in r.stdout and "bound (no LP)" in r.stdout
    assert not re.search(r"^LP bound", r.stdout, re.M) and "of the bound gain" in r.stdout
    assert "note: --write-model: nothing written (the answer came without the LP)" in r.stdout
    assert not model.exists()
    sched = tmp_path / "s.yaml"
    r = run("solve", profile, "--mode", "heuristic", "--solver", "highs", "--json", "-o", sched)
    assert json.loads(r.stdout)["bound_from_lp"] is False
    assert "\n  bound_from_lp: false\n" in sched.read_text()  # and the schedule file says so


def test_a_milp_that_keeps_its_start_still_has_the_lp_bound(
    tmp_path: Path, profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`heuristic_fallback` from `milp` after the LP solved: the bound printed is the LP's, and
    `--write-model` says why it wrote nothing."""
    from freezeopt.solver.pulp_model import PulpModel

    monkeypatch.setattr(PulpModel, "no_time_for_milp", lambda self, deadline: "no time")
    model = tmp_path / "m.lp"
    r = run("solve", profile, "--write-model", model)
    assert r.exit_code == 0, r.output
    assert "status          heuristic_fallback" in r.stdout
    assert re.search(r"^LP bound", r.stdout, re.M) and "bound (no LP)" not in r.stdout
    assert "note: --write-model: nothing written (no time for the MILP)" in r.stdout
    assert not model.exists()
    out = json.loads(run("solve", profile, "--json").stdout)
    assert out["status"] == "heuristic_fallback" and out["bound_from_lp"] is True


def test_every_option_field_in_the_flag_table_names_a_flag_of_the_cli() -> None:
    """`cli.FLAGS` maps the option fields the library's errors name to flags: each flag it
    names exists on some command (the two library-only options name themselves)."""
    import typer.main

    from freezeopt.cli import FLAGS, app

    group = typer.main.get_command(app)
    flags = {o for cmd in group.commands.values() for p in cmd.params for o in p.opts}  # type: ignore[attr-defined]
    assert {f for f in FLAGS.values() if f.startswith("--")} <= flags
    assert {f for f in FLAGS.values() if not f.startswith("--")} == {
        "stop_at_val_loss",
        "stop_from",
    }


@pytest.mark.parametrize(
    ("args", "code", "msg"),
    [
        (["solve", "missing.json"], 2, "not found"),
        (["solve", "{p}", "--budget", "1.5"], 2, "--budget must be"),
        (["solve", "{p}", "--mode", "magic"], 2, "unknown mode"),
        (["solve", "{p}", "--sensitivity", "vibes"], 2, "unknown sensitivity"),
        (["synth", "--schedule", "Nope", "-o", "{t}/x.json"], 2, "unknown schedule"),
        (["synth", "--ranks", "0", "-o", "{t}/x.json"], 2, "at least 1"),
        (["schema", "thing"], 2, "unknown schema"),
        (["validate", "{p}"], 2, r"\.json is a profile, not a schedule; .*freezeopt solve"),
        (["simulate", "{t}/s.yaml", "--profile", "{t}/s.yaml"], 2, r"s\.yaml: not a profile \("),
        (["simulate", "{t}/s.yaml", "-p", "{p}", "--gantt", "{t}"], 2, "is a folder; name a file"),
        (["synth", "--forward-ms", "nan", "-o", "{t}/x.json"], 2, "--forward-ms must be a finite"),
        (["solve", "{p}", "--time-limit", "inf"], 2, "--time-limit must be a positive, finite"),
        (
            ["profile", "tiny-gpt", "--steps", "0", "-o", "{t}/x.json"],
            2,
            "--steps must be at least",
        ),
        (
            ["profile", "tiny-gpt", "--warmup", "0", "-o", "{t}/x.json"],
            2,
            "--warmup must be at least",
        ),
        (["synth", "--lag-ms", "inf", "-o", "{t}/x.json"], 2, "--lag-ms must be a finite"),
        (["synth", "-o", "{t}"], 2, "is a folder; name a file"),
        (["synth", "--stages-per-rank", "0", "-o", "{t}/x.json"], 2, "must be at least 1 \\(got 0"),
        (
            ["synth", "--schedule", "examples/zb-2ranks.csv", "--ranks", "4", "-o", "{t}/x.json"],
            2,
            r"--ranks 4, but the CSV schedule examples/zb-2ranks\.csv has 2; leave --ranks out",
        ),
        (["train", "tiny-gpt", "--steps", "2", "--out-dir", "{p}"], 2, "is not a folder"),
        (["compare", "tiny-gpt", "-o", "{p}"], 2, "is not a folder"),
        (["simulate", "{t}/s.yaml", "-p", "{p}", "--gantt", "{t}/s.yaml"], 2, "is an input of"),
        (["compare", "tiny-gpt", "--warmup-steps", "-1"], 2, "--warmup-steps must not be neg"),
        # the training options' own checks, their fields named by the flags they came from
        (
            ["train", "tiny-gpt", "--steps", "2", "--keep-checkpoints", "0"],
            2,
            "--keep-checkpoints must",
        ),
        (
            ["train", "tiny-gpt", "--steps", "2", "--warmup-steps", "3"],
            2,
            "--warmup-steps and --full-update-every need --schedule$",
        ),
        (
            ["train", "tiny-gpt", "--steps", "2", "--replan-every", "2"],
            2,
            "--replan-every, --replan-on-drift and --adaptive need --schedule$",
        ),
        (
            ["train", "tiny-gpt", "--steps", "2", "--adaptive"],
            2,
            "--replan-every, --replan-on-drift and --adaptive need --schedule$",
        ),
        (
            ["train", "tiny-gpt", "--steps", "2", "--replan-mode", "x"],
            2,
            "--replan-mode must be one",
        ),
    ],
)
def test_user_errors_are_one_line(
    tmp_path: Path, profile: Path, args: list[str], code: int, msg: str
) -> None:
    assert run("solve", profile, "-o", tmp_path / "s.yaml").exit_code == 0
    argv = [a.format(p=profile, t=tmp_path) for a in args]
    r = run(*argv)
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")

    assert re.search(msg, lines[0])


@pytest.fixture
def main() -> Iterator[Callable[[list[str]], None]]:
    """The console-script entry point, with the collector's thresholds it sets put back."""
    import gc

    from freezeopt import entry

    before = gc.get_threshold()
    yield entry.main
    gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (
            ["solve", "{p}", "--budget", "abc"],
            r"Invalid value for '--budget'.*\(see freezeopt solve -h\)",
        ),
        (["synth"], r"Missing option '-o'"),
        (["simulate", "{p}"], r"Missing option '--profile'"),
        (["solve"], r"Missing argument 'profile'"),
        (["solve", "{p}", "--no-such"], r"No such option: --no-such"),
        (["no-such"], r"No such command 'no-such'.*\(see freezeopt -h\)"),
    ],
)
def test_usage_errors_are_one_line_too(
    capsys: pytest.CaptureFixture[str],
    main: Callable[[list[str]], None],
    profile: Path,
    args: list[str],
    msg: str,
) -> None:
    """The entry point turns click's usage block (usage, hint, blank line, error) into one line."""
    with pytest.raises(SystemExit) as exited:
        main([a.format(p=profile) for a in args])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(msg, lines[0]), lines[0]


def test_a_full_stdout_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """`freezeopt schema profile > /dev/full`: the output cannot be written, and says so."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        out = subprocess.run(
            [sys.executable, "-m", "freezeopt", "schema", "profile"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert out.returncode == 1
    assert out.stderr == "error: cannot write the output: No space left on device\n"


def test_the_entry_point_keeps_help_and_exit_codes(
    capsys: pytest.CaptureFixture[str], main: Callable[[list[str]], None]
) -> None:
    for argv, code in ((["--version"], 0), (["solve", "-h"], 0), ([], 2)):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == code, argv
    out, err = capsys.readouterr()
    assert out.startswith("freezeopt ") and "Usage: freezeopt solve" in out
    assert err.startswith("Usage: freezeopt [OPTIONS] COMMAND")  # `freezeopt` alone: the help


def test_schedule_for_another_job_exits_4(tmp_path: Path, profile: Path) -> None:
    sched = tmp_path / "s.yaml"
    assert run("solve", profile, "-o", sched).exit_code == 0
    other = tmp_path / "o.json"
    assert run("synth", "--ranks", "2", "--microbatches", "8", "-o", other).exit_code == 0
    r = run("simulate", sched, "--profile", other)
    assert r.exit_code == 4
    assert "does not fit" in r.stderr


def test_no_partial_file_on_failure(tmp_path: Path, profile: Path) -> None:
    out = tmp_path / "s.yaml"
    assert run("solve", profile, "--budget", "-1", "-o", out).exit_code == 2
    assert not out.exists()
    out.write_text("previous\n")
    assert run("solve", profile, "--mode", "nope", "-o", out).exit_code == 2
    assert out.read_text() == "previous\n"
    assert not list(tmp_path.glob(".*.tmp"))


def test_unwritable_output_is_a_clear_error_before_the_solve(tmp_path: Path, profile: Path) -> None:
    """Checked before the work, not after it (a solve can take its whole time limit first)."""
    d = tmp_path / "d"
    d.mkdir()
    blocker = d / "file"
    blocker.write_text("x")
    cases = [
        (["-o", str(blocker / "s.yaml")], f"error: -o {blocker / 's.yaml'}: {blocker} is not a"),
        (["-o", str(d)], f"error: -o {str(d)!r} is a folder; name a file"),
        (["-o", ""], "error: -o '.' is a folder; name a file"),
        (["-o", str(profile)], f"error: -o {profile} is an input of this command"),
        (["--write-model", str(d)], "error: --write-model"),
        (["--write-model", str(profile)], f"error: --write-model {profile} is an input"),
        (["--warmup-steps", "-1", "-o", str(d / "s.yaml")], "error: --warmup-steps must"),
        (["--full-update-every", "-5"], "error: --full-update-every must not be negative"),
    ]
    before = profile.read_bytes()
    for args, start in cases:
        r = run("solve", profile, "--mode", "lp", "--time-limit", "0.001", *args)
        assert r.exit_code == 2 and r.stderr.startswith(start), (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1
    assert [p.name for p in d.iterdir()] == ["file"], "nothing written"
    assert profile.read_bytes() == before


def test_an_output_folder_without_write_permission_is_refused_first(
    tmp_path: Path, profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a user without the permission (faked: as root `os.access` always grants it)."""
    import os

    real = os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    r = run("solve", profile, "-o", locked / "new" / "s.yaml")
    assert r.exit_code == 2
    assert r.stderr == (
        f"error: -o {locked / 'new' / 's.yaml'}: cannot create files in {locked} "
        "(permission denied)\n"
    )
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")  # a broken link is not a folder
    r = run("train", "tiny-gpt", "--steps", "2", "--out-dir", tmp_path / "gone")
    assert r.exit_code == 2 and "is not a folder (a file or a broken link)" in r.stderr


def test_every_command_has_help_with_an_example() -> None:
    for cmd in ("synth", "solve", "simulate", "validate", "schema"):
        r = run(cmd, "--help")
        assert r.exit_code == 0
        assert "Example:" in r.stdout, cmd


def test_version_and_module_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "freezeopt", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("freezeopt ")


@pytest.mark.parametrize("args", [["--solver", "highs", "--mode", "lp"], ["--solver", "highs"], []])
def test_highs_prints_no_banner(profile: Path, args: list[str]) -> None:
    """highspy prints a banner on fd 1 when constructed; it goes nowhere (the default `milp` with
    CBC dives with HiGHS, and printed it on every solve)."""
    out = subprocess.run(
        [sys.executable, "-m", "freezeopt", "solve", str(profile), *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    json.loads(out.stdout)  # nothing but the JSON object
    assert "HiGHS" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("command", "module", "func", "args", "want"),
    [
        (
            "profile",
            "freezeopt.profiling.run",
            "profile_job",
            ["--schedule", "GPipe", "--ranks", "4", "--steps", "7", "--warmup", "2", "--seed", "3"],
            {"schedule": "GPipe", "ranks": 4, "measure_steps": 7, "warmup_steps": 2, "seed": 3},
        ),
        (
            "train",
            "freezeopt.training.train",
            "train_job",
            ["--steps", "5", "--pipeline", "1F1B", "--microbatches", "8", "--batch-size", "16"],
            {"schedule": "1F1B", "microbatches": 8, "batch_size": 16},
        ),
        ("train", "freezeopt.training.train", "train_job", ["--steps", "5"], None),
    ],
)
def test_job_overrides_reach_the_library(
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    module: str,
    func: str,
    args: list[str],
    want: dict | None,
) -> None:
    """Only the job fields given on the command line are overridden, under the library's names."""
    import importlib

    from freezeopt.errors import InputError

    seen: dict[str, object] = {}

    def fake(*a: object, overrides: dict | None = None, **kw: object) -> None:
        seen["overrides"] = overrides
        raise InputError("stopped by the test")

    monkeypatch.setattr(importlib.import_module(module), func, fake)
    r = run(command, "tiny-gpt", *args)
    assert "stopped by the test" in r.output
    assert seen["overrides"] == want


def test_the_entry_point_collects_garbage_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """`main` raises the collector's thresholds before running the command (see GC_THRESHOLD)."""
    import gc

    from freezeopt import entry

    seen: list[tuple[int, ...]] = []
    before = gc.get_threshold()
    monkeypatch.setattr(entry, "app", lambda **_: seen.append(gc.get_threshold()))
    try:
        with pytest.raises(SystemExit) as exited:
            entry.main()
    finally:
        gc.set_threshold(*before)
    assert exited.value.code == 0
    assert seen == [entry.GC_THRESHOLD]
    assert entry.GC_THRESHOLD[0] > before[0]
