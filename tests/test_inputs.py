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
