"""What a user gives freezeopt, read as an attacker or a careless copy would write it: inputs that
are not regular files, outputs that are devices, YAML that expands without bound, duplicate keys,
wrong versions, paths with newlines, and sizes that would allocate without bound. Each is one
line on stderr and a documented exit code, before any work, and nothing is replaced."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from freezeopt.cli import app
from freezeopt.errors import InputError
from freezeopt.fileio import MAX_YAML_NODES, load_json_file, load_yaml_file

runner = CliRunner()


def run(*args: object):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [str(a) for a in args])


def one_error(r, code: int = 2) -> str:  # type: ignore[no-untyped-def]
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A profile, its schedule and a FIFO, in `tmp_path`."""
    prof, sched = tmp_path / "p.json", tmp_path / "s.yaml"
    assert run("synth", "--ranks", "2", "--microbatches", "4", "-o", prof).exit_code == 0
    assert (
        run("solve", prof, "--mode", "heuristic", "--time-limit", "2", "-o", sched).exit_code == 0
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"profile": prof, "schedule": sched, "fifo": fifo}


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_an_input_that_is_not_a_regular_file_is_refused_not_read(
    files: dict[str, Path], special: str
) -> None:
    """/dev/zero reports size 0 and never ends; a FIFO blocks until someone writes: each is
    refused as a profile, a schedule, an action log and a CSV schedule, at once."""
    bad = files["fifo"] if special == "fifo" else Path(special)
    p, s = files["profile"], files["schedule"]
    csv = p.parent / "rows.csv"  # a CSV schedule is named by its suffix
    if special == "fifo":
        os.mkfifo(csv)
    else:
        os.symlink(special, csv)
    for argv in (
        ["solve", bad],
        ["validate", bad],
        ["validate", s, "--profile", bad],
        ["simulate", s, "--profile", p, "--measured", bad],
        ["synth", "--schedule", csv, "-o", p.parent / "x.json"],
    ):
        line = one_error(run(*argv))
        assert "not a regular file" in line, (argv, line)


def test_a_csv_through_a_link_to_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "z.csv"
    os.symlink("/dev/urandom", link)
    line = one_error(run("synth", "--schedule", link, "-o", tmp_path / "x.json"))
    assert "not a regular file" in line


def test_an_output_that_is_a_device_or_fifo_is_never_replaced(files: dict[str, Path]) -> None:
    fifo, p = files["fifo"], files["profile"]
    line = one_error(run("solve", p, "-o", fifo))
    assert "not a regular file" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO
    line = one_error(run("synth", "-o", fifo))
    assert "not a regular file" in line and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    line = one_error(run("simulate", files["schedule"], "-p", p, "--gantt", "/dev/null"))
    assert "not a regular file" in line and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_output_name_of_legal_length_is_written_and_a_longer_one_refused_first(
    files: dict[str, Path],
) -> None:
    """A 250-byte name is legal: it is written (the temporary name beside it used to embed it and
    fail with "File name too long" after the solve); one over 255 bytes is refused at once."""
    legal = files["profile"].parent / ("s" * 245 + ".yaml")
    assert (
        run(
            "solve", files["profile"], "--mode", "heuristic", "--time-limit", "1", "-o", legal
        ).exit_code
        == 0
    )
    assert legal.exists()
    long = files["profile"].parent / ("s" * 260 + ".yaml")
    line = one_error(run("solve", files["profile"], "-o", long))
    assert "the file name is too long (at most 255 bytes)" in line


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    """Nine levels of nine aliases: 1.3 KB that expand to 9^9 (387 million) values. Loading it
    stops once the walk passes `MAX_YAML_NODES`; CPU time is bounded by that count, not by the
    expansion (a wide band: under a minute even on a loaded machine)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        ref = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([ref] * 9)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 2000
    code = (
        "import resource, sys\n"
        "from freezeopt.fileio import load_yaml_file\n"
        "from freezeopt.errors import InputError\n"
        "try:\n"
        f"    load_yaml_file({str(bomb)!r}, what='job spec', limit=2**20, missing_hint='')\n"
        "except InputError as e:\n"
        "    print('refused', 'aliases' in str(e))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_utime)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    first, cpu = done.stdout.split("\n")[:2]
    assert first == "refused True" and float(cpu) < 60
    for argv in (["validate", bomb], ["train", bomb, "--steps", "1"]):
        assert "aliases expand to more than" in one_error(run(*argv))
    assert MAX_YAML_NODES >= 1_000_000  # real schedules are far below


def test_yaml_merge_keys_are_read_and_own_keys_win(tmp_path: Path) -> None:
    f = tmp_path / "j.yaml"
    f.write_text("base: &b {ranks: 2, microbatches: 4}\njob:\n  <<: *b\n  microbatches: 8\n")
    got = load_yaml_file(f, what="job spec", limit=2**20, missing_hint="")
    assert got["job"] == {"ranks": 2, "microbatches": 8}
    f.write_text("job:\n  <<: {ranks: 2}\n  ranks: 4\n  ranks: 8\n")
    with pytest.raises(InputError, match="'ranks' is given twice"):
        load_yaml_file(f, what="job spec", limit=2**20, missing_hint="")


def test_a_key_given_twice_in_a_json_profile_is_refused(files: dict[str, Path]) -> None:
    p = files["profile"]
    text = p.read_text()
    assert text.startswith("{")
    p.write_text('{"schema_version": 1, ' + text[1:])  # schema_version twice
    with pytest.raises(InputError, match="'schema_version' is given twice"):
        load_json_file(p, what="profile", limit=2**28, missing_hint="")
    assert "given twice" in one_error(run("solve", p))


def test_schema_version_true_is_not_version_1(files: dict[str, Path]) -> None:
    p, s = files["profile"], files["schedule"]
    doc = json.loads(p.read_text())
    doc["schema_version"] = True
    p.write_text(json.dumps(doc))
    assert "schema_version True is not supported" in one_error(run("solve", p))
    s.write_text(s.read_text().replace("schema_version: 1", "schema_version: true"))
    assert "schema_version True is not supported" in one_error(run("validate", s))


def test_a_newline_in_a_path_keeps_the_error_on_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "two\nlines.yaml"
    line = one_error(run("validate", bad))
    assert "two\\nlines.yaml" in line


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["synth", "--ranks", "1000000000"], "--ranks must be at most 65,536"),
        (["synth", "--microbatches", "100000000"], "--microbatches must be at most"),
        (["synth", "--groups", "100000"], "--groups must be at most 1,024"),
        (["synth", "--trace-steps", "100000"], "--trace-steps must be at most 1,024"),
        (["synth", "--ranks", "4096", "--microbatches", "4096"], "over the 268,435,456 values"),
    ],
)
def test_sizes_are_bounded_before_anything_is_allocated(
    tmp_path: Path, argv: list[str], msg: str
) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert msg in one_error(run(*argv, "-o", tmp_path / "x.json"))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB
    assert not (tmp_path / "x.json").exists()


def test_solver_threads_are_bounded(files: dict[str, Path]) -> None:
    line = one_error(run("solve", files["profile"], "--threads", "1000000000"))
    assert "--threads must be between 1 and 1024" in line


def test_write_model_is_checked_like_every_output_and_written_atomically(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Phase 2's file (`M.phase2.lp`) is checked against the inputs too (it replaced the profile,
    exit 0), `-o X --write-model X` is refused, and a write that fails half-way leaves the
    previous model in place."""
    p, tmp = files["profile"], files["profile"].parent
    twin = tmp / "m.phase2.lp"
    twin.write_text(p.read_text())  # a profile that happens to be named like phase 2's file
    before = twin.read_text()
    line = one_error(run("solve", twin, "--mode", "lp", "--write-model", tmp / "m.lp"))
    assert "is an input of this command" in line and twin.read_text() == before
    line = one_error(run("solve", p, "-o", tmp / "x.lp", "--write-model", tmp / "x.lp"))
    assert "is the schedule file (-o)" in line
    model = tmp / "good.lp"
    assert run("solve", p, "--mode", "lp", "--write-model", model).exit_code == 0
    good = model.read_text()
    assert good and (tmp / "good.phase2.lp").exists()

    import pulp

    def half_then_fail(self: object, filename: str, *a: object, **k: object) -> None:
        Path(filename).write_text("\\* half a model")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pulp.LpProblem, "writeLP", half_then_fail)
    line = one_error(run("solve", p, "--mode", "lp", "--write-model", model), code=1)
    assert "No space left on device" in line and "previous file is unchanged" in line
    assert model.read_text() == good
    assert not [f for f in os.listdir(tmp) if f.startswith(".fo.")]  # no temporary file left


def test_a_schedule_of_huge_ranges_validates_without_expanding_them(tmp_path: Path) -> None:
    """500 groups each frozen in `0-1048575` of 2^20 microbatches: a 20 KB file that expands to
    half a billion entries. Validating it checks each range, it does not list them (CPU time
    bounded by the parts, with a wide band)."""
    import yaml

    committed = Path(__file__).resolve().parents[1] / "schedules" / "tiny-gpt-1f1b.yaml"
    doc = yaml.safe_load(committed.read_text())
    groups = [[f"s{s}g{i}" for i in range(250)] for s in range(2)]
    doc["pipeline"].update(n_microbatches=2**20, groups=groups)
    doc["frozen"] = {s: {g: "0-1048575" for g in groups[s]} for s in range(2)}
    f = tmp_path / "huge.yaml"
    f.write_text(yaml.safe_dump(doc))
    code = (
        "import resource\n"
        "from freezeopt.formats.schedule import load_schedule\n"
        f"s = load_schedule({str(f)!r})\n"
        "print(len(s.frozen[0]), resource.getrusage(resource.RUSAGE_SELF).ru_utime)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    n, cpu = done.stdout.split()
    assert n == "250" and float(cpu) < 30
    doc["frozen"] = {0: {"s0g0": "0-5,3"}}
    f.write_text(yaml.safe_dump(doc))
    assert "repeats a microbatch" in one_error(run("validate", f))


# --- non-finite and degenerate numbers: refused where they enter, before any work ---------------


def _edited(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the profile `src` with `edit(data)` applied, infinities written `1e999` (the
    JSON text `json` reads as an infinity)."""
    data = json.loads(src.read_text())
    edit(data)
    dst.write_text(json.dumps(data).replace("Infinity", "1e999"))
    return dst


def _set_costs(data: dict, ms: float) -> None:  # type: ignore[type-arg]
    for a in data["actions"]:
        a["cost_ms"].update(median=ms, p10=ms, p90=ms)


@pytest.mark.parametrize(
    ("edit", "msg"),
    [
        # the examples: an infinity in a free-form field (solve crashed after solving,
        # simulate and validate at once), all-zero costs (a division by zero after the schedule
        # was written), costs of 1e308 (a schedule holding .inf that validate refused)
        (lambda d: d["extra"].update(note={"x": [float("inf")]}), "at extra.note.x.0: inf is not"),
        (lambda d: _set_costs(d, 0.0), "every action costs 0 ms: there is nothing to optimise"),
        (lambda d: _set_costs(d, 1e308), "1e+308 is over the 1e9 ms a profile's times may be"),
        # and the other fields numbers enter by
        (lambda d: d["provenance"]["job"].update(noise=-float("inf")), "at provenance.job.noise"),
        (lambda d: d.update(loss=[float("inf")]), "at loss.0: Input should be a finite number"),
        (lambda d: d["lags"][0]["ms"].update(p90=1e10), "at lags.0.ms.p90: 1e+10 is over the 1e9"),
        (
            lambda d: d["gradients"][0]["step_sq_norms"].__setitem__(0, 1e300),
            "at gradients.0.step_sq_norms.0: 1e+300 is over the 1e100",
        ),
    ],
)
def test_a_profile_with_non_finite_or_degenerate_numbers_is_refused_by_every_command(
    files: dict[str, Path], edit, msg: str
) -> None:  # type: ignore[no-untyped-def]
    tmp = files["profile"].parent
    bad = _edited(files["profile"], tmp / "bad.json", edit)
    out = tmp / "out.yaml"
    for argv in (
        ["solve", bad, "--mode", "heuristic", "--time-limit", "5", "-o", out],
        ["simulate", files["schedule"], "--profile", bad],
        ["validate", files["schedule"], "--profile", bad],
    ):
        assert msg in one_error(run(*argv)), argv
        assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--forward-ms", "1e308"], "the largest stage cost, max(--forward-ms, --backward-ms) ×"),
        (["--backward-ms", "1e308"], "is 1.1e+308 ms; it must be at most 1e8 ms"),
        (["--last-stage-factor", "1e308"], "must be at most 1e8 ms"),
        (["--forward-ms", "6e7", "--last-stage-factor", "2"], "is 1.32e+08 ms; it must be at most"),
        (["--lag-ms", "1e308"], "--lag-ms must be at most 1e8 ms"),
        (["--lag-ms", "inf"], "--lag-ms must be a finite number"),
        (["--jitter", "nan"], "--jitter must be a finite number"),
        (["--microbatch-size", "10000000000"], "--microbatch-size must be at most 4,294,967,296"),
    ],
)
def test_synth_refuses_costs_its_profile_could_not_hold(
    tmp_path: Path, argv: list[str], msg: str
) -> None:
    out = tmp_path / "x.json"
    assert msg in one_error(run("synth", "--ranks", "2", "--microbatches", "2", *argv, "-o", out))
    assert not out.exists()


def test_a_job_spec_with_a_non_finite_argument_is_refused_before_any_rank_starts(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: j\ndata_args: {max_train_bytes: .nan}\n")
    out = tmp_path / "p.json"
    line = one_error(run("profile", job, "-o", out, "--no-progress"))
    assert "invalid job spec at data_args.max_train_bytes: nan is not a finite number" in line
    assert not out.exists()
    job.write_text("name: j\n")
    line = one_error(run("profile", job, "--seed", 2**64, "-o", out, "--no-progress"))
    assert "at seed: Input should be less than or equal to 4294967295" in line


def test_a_schedule_with_a_prediction_past_any_step_is_refused(files: dict[str, Path]) -> None:
    import yaml

    doc = yaml.safe_load(files["schedule"].read_text())
    doc["prediction"]["baseline_ms"] = 1e308
    bad = files["schedule"].parent / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    for argv in (["validate", bad], ["simulate", bad, "--profile", files["profile"]]):
        assert "prediction.baseline_ms: 1e+308 ms is over the 1e18 ms a step may take" in one_error(
            run(*argv)
        )


def test_a_plan_that_freezes_the_whole_step_away_is_reported_not_divided_by(
    files: dict[str, Path],
) -> None:
    """Forward costs 0 and every backward is weight-gradient work: freezing every group leaves a
    step of 0 ms. `solve` and `simulate` print it (no speed-up ratio), and the file validates."""
    tmp = files["profile"].parent

    def all_freezable(d: dict) -> None:  # type: ignore[type-arg]
        for st in d["stages"]:
            for g in st["groups"]:
                g["weight_grad_ms"].update(median=1.0, p10=1.0, p90=1.0)
        for a in d["actions"]:
            ms = 0.0 if "F" in a["action"] else float(len(d["stages"][0]["groups"]))
            a["cost_ms"].update(median=ms, p10=ms, p90=ms)
        for lag in d["lags"]:
            lag["ms"].update(median=0.0, p10=0.0, p90=0.0)

    prof = _edited(files["profile"], tmp / "free.json", all_freezable)
    out = tmp / "free.yaml"
    r = run("solve", prof, "--budget", "1", "--group-cap", "1", "--sensitivity", "flat", "-o", out)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert "predicted             0.00 ms   (no step time left" in r.stdout
    assert run("validate", out, "--profile", prof).exit_code == 0
    r = run("simulate", out, "--profile", prof)
    assert r.exit_code == 0 and "(no step time left)" in r.stdout, r.output
