"""Schedule files: deterministic, validated on load, refused for another pipeline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from freezeopt.errors import InputError, MismatchError
from freezeopt.formats.fingerprint import fingerprint_of
from freezeopt.formats.profile import profile_sha256
from freezeopt.formats.schedule import (
    Phases,
    check_fits,
    dump_schedule,
    format_microbatches,
    load_schedule,
    parse_microbatches,
    parse_schedule,
    save_schedule,
)
from freezeopt.model.dag import build_dag, schedule_plan
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.solver import SolveOptions, schedule_from_result, solve
from tests.conftest import make_profile


def _schedule(profile, **kw):
    opts = SolveOptions(**kw)
    dag = build_dag(profile)
    r = solve(dag, estimate_signal(profile, opts.sensitivity), opts)
    return dag, r, _file_of(r, profile, dag, opts)


def _file_of(r, profile, dag, opts):
    """The schedule `solve` writes for result `r`."""
    return schedule_from_result(
        r,
        profile=profile,
        profile_sha256=profile_sha256(profile),
        dag=dag,
        opts=opts,
        phases=Phases(),
    )


@pytest.mark.parametrize(
    ("mbs", "text"),
    [([0, 1, 2, 5], "0-2,5"), ([3], "3"), ([], ""), ([7, 0, 1], "0-1,7"), ([1, 3, 5], "1,3,5")],
)
def test_microbatch_ranges(mbs: list[int], text: str) -> None:
    assert format_microbatches(mbs) == text
    if mbs:
        assert parse_microbatches(text, 8) == tuple(sorted(mbs))


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("0-9", "outside microbatches 0..7"),
        ("3-1", r"runs backwards; write it low-high \(1-3\)"),
        ("a", "not a microbatch"),
        ("1,,2", "empty entry"),
        ("0-2,1", "repeats"),
        ("-1", "not a microbatch"),
        ("8", "outside"),
    ],
)
def test_bad_microbatch_lists(bad: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_microbatches(bad, 8)


def test_byte_identical_and_round_trips(tmp_path: Path) -> None:
    p = make_profile(ranks=4, microbatches=8)
    texts = [
        dump_schedule(_schedule(p, mode="milp", budget=0.1, time_limit=20)[2]) for _ in range(2)
    ]
    assert texts[0] == texts[1]
    assert texts[0].splitlines()[2] == "schema_version: 1"
    again = parse_schedule(yaml.safe_load(texts[0]))
    assert dump_schedule(again) == texts[0]


def test_the_file_says_whether_its_bound_is_the_lps() -> None:
    """`prediction.bound_from_lp` follows the solve (false where the bound was its own, as past
    the LP's reach); a file without it (written before it was recorded) loads as unknown and is
    written back without it."""
    import dataclasses

    p = make_profile(ranks=2, microbatches=4)
    dag, r, sched = _schedule(p, mode="milp", budget=0.2)
    assert r.bound_from_lp and "\n  bound_from_lp: true\n" in dump_schedule(sched)
    own = dataclasses.replace(r, bound_from_lp=False)
    text = dump_schedule(_file_of(own, p, dag, SolveOptions(mode="milp", budget=0.2)))
    assert parse_schedule(yaml.safe_load(text)).prediction.bound_from_lp is False
    old = text.replace("  bound_from_lp: false\n", "")
    assert old != text
    back = parse_schedule(yaml.safe_load(old))
    assert back.prediction.bound_from_lp is None
    assert dump_schedule(back) == old


def test_plan_reproduces_the_prediction() -> None:
    from freezeopt.model.simulate import simulate

    for mode in ("milp", "lp"):
        p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4)
        dag, r, sched = _schedule(p, mode=mode, budget=0.3, time_limit=5)
        text = dump_schedule(sched)
        plan = schedule_plan(parse_schedule(yaml.safe_load(text)), dag)
        # the file rounds ratios to 4 decimals
        assert simulate(dag, dag.durations(plan)).makespan == pytest.approx(
            r.predicted_ms, rel=1e-3
        )


def test_lp_mode_writes_fractions_separately() -> None:
    _, _r, sched = _schedule(make_profile(ranks=4, microbatches=8), mode="lp", budget=0.3)
    for groups in sched.ratios.values():
        for per_mb in groups.values():
            assert all(0 < x < 1 for x in per_mb.values())


def _valid_data():
    return yaml.safe_load(dump_schedule(_schedule(make_profile(), mode="heuristic", budget=0.2)[2]))


@pytest.mark.parametrize(
    ("mutate", "msg"),
    [
        (lambda d: d.update(schema_version=2), "schema_version 2 is not supported"),
        (lambda d: d.pop("schema_version"), r"not a freezeopt schedule \(no schema_version"),
        (lambda d: d.update(surprise=1), "invalid schedule at surprise: unknown key"),
        (lambda d: d["provenance"].update(budget=3), "provenance.budget"),
        (lambda d: d["frozen"].update({0: {"nope": "0"}}), "has no group 'nope'"),
        (lambda d: d["frozen"].update({0: {"s0.g0": "0-9"}}), "outside microbatches"),
        (lambda d: d["frozen"].update({7: {"s0.g0": "0"}}), "names stage 7"),
        (lambda d: d["pipeline"].update(stage_to_rank=[0]), "ranks and"),
        (
            lambda d: d["pipeline"].update(
                stage_to_rank=[0] * (len(d["pipeline"]["groups"]) - 1) + [9]
            ),
            r"stage_to_rank names rank 9, but world_size is",
        ),
        (lambda d: d["phases"].update(warmup_steps=-1), "phases.warmup_steps"),
        (lambda d: d["pipeline"].update(fingerprints=[["1-0123456789abcdef"]]), "lists 1 stages"),
        (
            lambda d: d["pipeline"].update(fingerprints=[["1-0123456789abcdef"], []]),
            "has 1 for stage 0's 2 groups",
        ),
        (
            lambda d: d["pipeline"].update(fingerprints=[["1-0123456789abcdef", "x"], []]),
            r"pipeline\.fingerprints\.0\.1",
        ),
    ],
)
def test_invalid_files_are_refused_with_one_line(mutate, msg: str) -> None:
    d = _valid_data()
    mutate(d)
    with pytest.raises(InputError, match=msg) as e:
        parse_schedule(d)
    assert "\n" not in str(e.value)


def test_integer_microbatch_is_accepted() -> None:
    d = _valid_data()
    d["frozen"] = {0: {"s0.g0": 2}}
    assert parse_schedule(d).frozen[0]["s0.g0"] == 2


def test_yaml_tags_are_never_executed(tmp_path: Path) -> None:
    f = tmp_path / "evil.yaml"
    f.write_text("schema_version: 1\nprovenance: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_schedule(f)
    assert not (tmp_path / "pwned").exists()


def test_a_key_given_twice_or_a_tab_is_refused_with_its_line(tmp_path: Path) -> None:
    """YAML keeps the last of two equal keys silently; a hand edit that adds a second
    `warmup_steps:` must not win unnoticed."""
    text = dump_schedule(_schedule(make_profile(), mode="heuristic", budget=0.2)[2])
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("warmup_steps:"))
    f = tmp_path / "twice.yaml"
    f.write_text("\n".join([*lines[: at + 1], lines[at].replace(": ", ": 7 #"), *lines[at + 1 :]]))
    with pytest.raises(
        InputError, match=rf"line {at + 2}, column \d+: key 'warmup_steps' is given twice"
    ):
        load_schedule(f)
    f.write_text(text.replace("\n  ", "\n\t", 1))
    with pytest.raises(InputError, match=r"not valid YAML at line \d+, column 1: found character"):
        load_schedule(f)


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_schedule(tmp_path / "none.yaml")
    (tmp_path / "g.yaml").write_text("- a\n- b\n")
    with pytest.raises(InputError, match="not a freezeopt schedule"):
        load_schedule(tmp_path / "g.yaml")
    (tmp_path / "t.yaml").write_text("schema_version: 1\nfrozen: {0: [\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_schedule(tmp_path / "t.yaml")


@pytest.mark.parametrize(
    ("other", "what"),
    [
        ({"microbatches": 8}, "microbatches"),
        ({"schedule": "GPipe"}, "schedule"),
        ({"groups": 3}, "stage 0's group list"),
        ({"ranks": 3}, "ranks"),
    ],
)
def test_schedule_for_another_pipeline_is_refused(other: dict, what: str) -> None:
    _, _, sched = _schedule(make_profile(), mode="heuristic", budget=0.1)
    with pytest.raises(MismatchError, match=what):
        check_fits(sched, make_profile(**other))


def test_other_profile_of_same_pipeline_warns() -> None:
    _, _, sched = _schedule(make_profile(seed=0), mode="heuristic", budget=0.1)
    other = make_profile(seed=1)
    assert check_fits(sched, other, profile_sha256=profile_sha256(other))
    same = make_profile(seed=0)
    assert check_fits(sched, same, profile_sha256=profile_sha256(same)) == []


def _fingerprinted(profile, width: int):
    """`profile` with a fingerprint on every group, as `freezeopt profile` records them: group g
    of a stage holds a `width` × (`width` + g) weight."""
    stages = tuple(
        dataclasses.replace(
            st,
            groups=tuple(
                dataclasses.replace(g, fingerprint=fingerprint_of([((width, width + i), "f32")]))
                for i, g in enumerate(st.groups)
            ),
        )
        for st in profile.stages
    )
    return dataclasses.replace(profile, stages=stages)


def test_fingerprints_are_copied_and_a_profile_of_another_model_is_refused(
    tmp_path: Path,
) -> None:
    wide = _fingerprinted(make_profile(), 256)
    _, _, sched = _schedule(wide, mode="heuristic", budget=0.1)
    assert sched.pipeline.fingerprints == tuple(
        tuple(g.fingerprint for g in st.groups) for st in wide.stages
    )
    text = dump_schedule(sched)
    assert text == dump_schedule(_schedule(wide, mode="heuristic", budget=0.1)[2])
    assert "fingerprints:\n  - [65536-" in text
    save_schedule(sched, tmp_path / "s.yaml")
    assert load_schedule(tmp_path / "s.yaml").pipeline == sched.pipeline
    assert check_fits(sched, wide) == []
    with pytest.raises(MismatchError) as e:
        check_fits(sched, _fingerprinted(make_profile(), 128))
    msg = str(e.value)
    assert "\n" not in msg
    assert "stage 0's group s0.g0 is 65536-" in msg and "but 16384-" in msg
    assert "re-solve with `freezeopt solve`" in msg
    # one side without fingerprints (synth's profiles, older files): only the names are checked
    assert check_fits(sched, make_profile()) == []
    _, _, plain = _schedule(make_profile(), mode="heuristic", budget=0.1)
    assert plain.pipeline.fingerprints is None and "fingerprints" not in dump_schedule(plain)
    assert check_fits(plain, wide) == []


# --- non-finite and out-of-range numbers ---------------------------------------------------------


def _schedule_yaml(**kw) -> str:
    return dump_schedule(_schedule(make_profile(), mode="heuristic", budget=0.3, **kw)[2])


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("prediction", "baseline_ms"), ".inf"),
        (("prediction", "gap"), "-.inf"),
        (("provenance", "budget"), ".nan"),
        (("provenance", "tolerance"), ".inf"),
        (("phases", "drift", "loss_rise"), ".nan"),
        (("phases", "drift", "step_time_error"), ".inf"),
        (("phases", "warmup_steps"), ".inf"),
        (("realisation", "seed"), ".nan"),
    ],
)
def test_a_non_finite_number_is_refused_naming_its_field(
    tmp_path: Path, path: tuple[str, ...], value: str
) -> None:
    data = yaml.safe_load(_schedule_yaml())
    holder = data
    for k in path[:-1]:
        holder = holder[k]
    holder[path[-1]] = "PLACEHOLDER"
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False).replace("PLACEHOLDER", value))
    with pytest.raises(InputError, match=rf"invalid schedule at {'.'.join(path)}: .*finite") as e:
        load_schedule(f)
    assert "\n" not in str(e.value)


def test_a_prediction_past_any_step_a_profile_can_give_is_refused(tmp_path: Path) -> None:
    from freezeopt.formats.profile import MAX_STEP_MS

    data = yaml.safe_load(_schedule_yaml())
    data["prediction"]["predicted_ms"] = MAX_STEP_MS
    assert parse_schedule(data).prediction.predicted_ms == MAX_STEP_MS  # the limit itself is fine
    for name in ("baseline_ms", "all_frozen_ms", "lp_bound_ms", "predicted_ms"):
        bad = yaml.safe_load(_schedule_yaml())
        bad["prediction"][name] = 1e308
        with pytest.raises(
            InputError,
            match=rf"invalid schedule at prediction\.{name}: 1e\+308 ms is over the 1e18 ms",
        ):
            parse_schedule(bad)
