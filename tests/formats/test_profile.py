"""Profile files: validated at the boundary, deterministic, schema committed and in sync."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from freezeopt.errors import InputError
from freezeopt.formats.profile import (
    dump_profile,
    load_profile,
    parse_profile,
    profile_json_schema,
    save_profile,
)
from freezeopt.formats.schedule import schedule_json_schema
from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "make"), [("profile", profile_json_schema), ("schedule", schedule_json_schema)]
)
def test_committed_schema_matches_the_code(name: str, make) -> None:
    committed = json.loads((ROOT / "schema" / f"{name}.v1.json").read_text())
    assert committed == make(), f"regenerate with: freezeopt schema {name} > schema/{name}.v1.json"


def test_round_trip_is_byte_identical(tmp_path: Path) -> None:
    p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4)
    save_profile(p, tmp_path / "a.json")
    again = load_profile(tmp_path / "a.json")
    assert dump_profile(again) == (tmp_path / "a.json").read_text()
    assert dump_profile(
        make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4)
    ) == dump_profile(p)


def _rounded(x):  # the rule: 6 significant digits, tuples as lists
    if isinstance(x, float):
        return 0.0 if x == 0 else float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_rounded(v) for v in x]
    return x


def _as_json_writes(p) -> str:
    """What `json` writes for a profile: its fields rounded, indent 1, ASCII; a group's
    `fingerprint` left out where it is None, a rank's `composites` and a trace's `loss_change`
    where they are empty, and the `probe` where there is none (as files written before they were
    recorded hold them)."""
    plain = _rounded(dataclasses.asdict(p))
    for st in plain["stages"]:
        for g in st["groups"]:
            if g["fingerprint"] is None:
                del g["fingerprint"]
    for rank in plain["ranks"]:
        if not rank["composites"]:
            del rank["composites"]
    for t in plain["gradients"]:
        if not t["loss_change"]:
            del t["loss_change"]
    for st in plain["stages"]:
        if not st["truncation_ms"]:
            del st["truncation_ms"]
        if st["all_grouped"] is None:
            del st["all_grouped"]
    if plain["probe"] is None:
        del plain["probe"]
    return json.dumps(plain, indent=1, ensure_ascii=True, allow_nan=False) + "\n"


def test_the_committed_profile_is_written_back_byte_for_byte() -> None:
    """`dump_profile` (one pass over the dataclasses) keeps the bytes of the committed profile,
    which holds every kind of field (nested extras, a timeline, gradient traces), so hashes in
    committed schedules stay valid."""
    path = Path(__file__).resolve().parents[2] / "profiles" / "tiny-gpt-1f1b.json"
    p = load_profile(path)
    assert p.extra and p.timeline and p.gradients
    assert dump_profile(p) == path.read_text()
    for schedule in ("ZBVZeroBubble", "DualPipeV"):  # DualPipeV's ranks hold composites
        fresh = make_profile(schedule=schedule, ranks=2, microbatches=4)  # floats unrounded
        assert dump_profile(fresh) == _as_json_writes(fresh)
        assert parse_profile(json.loads(dump_profile(fresh))).ranks == fresh.ranks


def test_dump_profile_writes_odd_extras_as_json_does() -> None:
    """The one-pass writer against `json` on every kind of value extras can hold; a dict with
    keys that are not strings goes to `json` itself, and so does the error for NaN."""
    odd = {
        "": {"": [], "nested": {"deeper": [[], {}, [[1.0]]]}},
        "text": 'quote " back \\ new\nline tab\t é ü 雪 \u2028',
        "flags": [True, False, None],
        "ints": [0, -1, 2**70, True],
        "floats": [0.0, -0.0, 1e-300, 1e300, -123456789.123, 3.14159265, 2.5e-05, 1e16, 5e-324],
        "tuple": (1, 2.000001, "x"),
        "np": np.float64(0.1234567891),
        "empty": {},
        "names": ["0F1", "é", 'q"', "\n", ""],
        "mixed": [1.0, 2, "3"],
        "pi": 3.14159265358979,
        "negzero": -0.0,
        "one": 1,
        "big": -(2**70),
        "yes": True,
    }
    p = dataclasses.replace(make_profile(), extra=odd)
    assert dump_profile(p) == _as_json_writes(p)
    int_keys = dataclasses.replace(make_profile(), extra={"m": {1: 2.0, 3: [4.0]}})
    assert dump_profile(int_keys) == _as_json_writes(int_keys)
    for bad in (float("nan"), float("inf"), -float("inf")):
        for extra in ({"x": [bad]}, {"x": bad}, {"x": [1.0, bad]}):
            with pytest.raises(ValueError, match="not JSON compliant"):
                dump_profile(dataclasses.replace(make_profile(), extra=extra))


def _write(tmp_path: Path, data) -> Path:
    f = tmp_path / "p.json"
    f.write_text(data if isinstance(data, str) else json.dumps(data))
    return f


def _data():
    return json.loads(dump_profile(make_profile()))


@pytest.mark.parametrize(
    ("mutate", "msg"),
    [
        (lambda d: d.update(schema_version=0), "schema_version 0 is not supported"),
        (lambda d: d.pop("schema_version"), r"not a freezeopt profile \(no schema_version"),
        # gradient traces the sensitivity estimates would have averaged silently
        (lambda d: d["gradients"][0].update(group="nope"), r"gradients\.0 names group 'nope'"),
        (
            lambda d: d["gradients"][0].update(
                microbatch_sq_norms=[[1.0, 2.0]] * len(d["gradients"][0]["step_sq_norms"])
            ),
            "a step with 2 microbatch norms; the pipeline has 4",
        ),
        (
            lambda d: d["gradients"][0].update(step_sq_norms=[]),
            "steps of microbatch norms but 0 of step norms",
        ),
        (lambda d: d.pop("ranks"), "ranks"),
        (lambda d: d["actions"][0]["cost_ms"].update(median=-1.0), "greater than or equal to 0"),
        (lambda d: d["actions"][0].update(action="0X1"), "actions.0.action"),
        (lambda d: d["pipeline"].update(n_microbatches="many"), "pipeline.n_microbatches"),
        (lambda d: d.update(bogus=2), r"invalid profile at bogus: unknown key \(the fields are in"),
        (lambda d: d["stages"][0]["groups"][0].update(name=""), "at least 1 character"),
        # found by the fuzz suite: a huge count made the DAG check allocate until killed
        (lambda d: d["pipeline"].update(world_size=10**12), "pipeline.world_size"),
        (lambda d: d["pipeline"].update(n_microbatches=2**40), "pipeline.n_microbatches"),
    ],
)
def test_bad_profiles(tmp_path: Path, mutate, msg: str) -> None:
    d = _data()
    mutate(d)
    with pytest.raises(InputError, match=msg) as e:
        load_profile(_write(tmp_path, d))
    assert "\n" not in str(e.value)


def test_nan_and_truncated_json(tmp_path: Path) -> None:
    text = dump_profile(make_profile())
    with pytest.raises(InputError, match="not valid JSON"):
        load_profile(_write(tmp_path, text[: len(text) // 2]))
    with_nan = re.sub(r'"median": [0-9.e+-]+', '"median": NaN', text, count=1)
    assert with_nan != text
    with pytest.raises(InputError, match="not valid JSON"):
        load_profile(_write(tmp_path, with_nan))
    with pytest.raises(InputError, match="not found"):
        load_profile(tmp_path / "missing.json")
    for empty in ("", "\n  \n"):
        with pytest.raises(InputError, match=r"profile .* is empty; create one with"):
            load_profile(_write(tmp_path, empty))


# --- non-finite and degenerate numbers: refused at load, never written ------------------------


def _write_big(tmp_path: Path, d) -> Path:
    """`d` as JSON text with every infinity written `1e999` (which `json` reads as one: the way
    an infinity gets into a file JSON's grammar has no word for)."""
    text = json.dumps(d).replace("-Infinity", "-1e999").replace("Infinity", "1e999")
    return _write(tmp_path, text)


def _timed(d) -> dict:
    """`_data()` with the measured-only fields a synthetic profile leaves out filled in."""
    stat = {"median": 1.0, "p10": 1.0, "p90": 1.0, "n": 3}
    d["step_ms"] = dict(stat)
    d["ranks"][0]["optimizer_ms"] = dict(stat)
    d["timeline"] = [
        {"action": d["ranks"][0]["actions"][0], "rank": 0, "start_ms": 0.0, "end_ms": 1.0}
    ]
    d["loss"], d["val_loss"] = [2.0, 1.5], [1.9]
    return d


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        # free-form fields, which no type checks: the loader walks them
        (lambda d: d["extra"].update(x=math.inf), "extra.x"),
        (lambda d: d["extra"].update(self_check={"error": -math.inf}), "extra.self_check.error"),
        (lambda d: d["extra"].update(runs=[{"ms": [1.0, math.inf]}]), "extra.runs.0.ms.1"),
        (lambda d: d["provenance"]["job"].update(forward_ms=math.inf), "provenance.job.forward_ms"),
        # typed fields: pydantic, through the same one line
        (lambda d: d.update(loss=[1.0, math.inf]), "loss.1"),
        (lambda d: d.update(val_loss=[math.inf]), "val_loss.0"),
        (lambda d: d["actions"][2]["cost_ms"].update(p90=math.inf), "actions.2.cost_ms.p90"),
        (lambda d: d["lags"][0]["ms"].update(median=math.inf), "lags.0.ms.median"),
        (lambda d: d["step_ms"].update(p10=math.inf), "step_ms.p10"),
        (lambda d: d["ranks"][0]["optimizer_ms"].update(median=math.inf), "ranks.0.optimizer_ms"),
        (lambda d: d["timeline"][0].update(end_ms=math.inf), "timeline.0.end_ms"),
        (
            lambda d: d["gradients"][0]["microbatch_sq_norms"][0].__setitem__(1, math.inf),
            "gradients.0.microbatch_sq_norms.0.1",
        ),
        (
            lambda d: d["stages"][1]["groups"][0]["weight_grad_ms"].update(median=math.inf),
            "stages.1.groups.0.weight_grad_ms.median",
        ),
    ],
)
def test_a_non_finite_number_anywhere_is_refused_naming_its_field(
    tmp_path: Path, mutate, where: str
) -> None:
    d = _timed(_data())
    load_profile(_write(tmp_path, d))  # the base is valid
    mutate(d)
    with pytest.raises(InputError, match=rf"invalid profile at {re.escape(where)}\b") as e:
        load_profile(_write_big(tmp_path, d))
    assert "\n" not in str(e.value) and "finite" in str(e.value)


@pytest.mark.parametrize(
    ("mutate", "where", "why"),
    [
        (
            lambda d: d["actions"][0]["cost_ms"].update(median=1e308, p90=1e308),
            "actions.0.cost_ms.median",
            "over the 1e9 ms a profile's times may be (the solver adds them up",
        ),
        (lambda d: d["lags"][1]["ms"].update(p90=1.5e9), "lags.1.ms.p90", "over the 1e9 ms"),
        (lambda d: d["step_ms"].update(p90=2e9), "step_ms.p90", "over the 1e9 ms"),
        (
            lambda d: d["stages"][0]["groups"][1]["weight_grad_ms"].update(p90=1e10),
            "stages.0.groups.1.weight_grad_ms.p90",
            "over the 1e9 ms",
        ),
        (lambda d: d["timeline"][0].update(end_ms=1e19), "timeline.0.end_ms", "1e18 ms a step"),
        (
            lambda d: d["gradients"][1].update(
                step_sq_norms=[1e101] * len(d["gradients"][1]["step_sq_norms"])
            ),
            "gradients.1.step_sq_norms.0",
            "over the 1e100 the sensitivity estimates can take",
        ),
        (
            lambda d: d["pipeline"].update(microbatch_size=10**400),
            "pipeline.microbatch_size",
            "over the 4,294,967,296 samples",
        ),
        (
            lambda d: d["stages"][0]["groups"][0].update(numel=2**60),
            "stages.0.groups.0.numel",
            "weigh groups by it as a float",
        ),
    ],
)
def test_values_past_what_the_arithmetic_stands_are_refused_with_the_reason(
    tmp_path: Path, mutate, where: str, why: str
) -> None:
    d = _timed(_data())
    mutate(d)
    with pytest.raises(
        InputError, match=rf"invalid profile at {re.escape(where)}: .*{re.escape(why)}"
    ) as e:
        load_profile(_write(tmp_path, d))
    assert "\n" not in str(e.value)


def test_values_at_the_limits_load() -> None:
    """The limits are the largest values allowed, not the first refused."""
    from freezeopt.formats.profile import (
        MAX_MICROBATCH_SIZE,
        MAX_MS,
        MAX_SQ_NORM,
        MAX_STEP_MS,
        parse_profile,
    )

    d = _timed(_data())
    for a in d["actions"]:
        a["cost_ms"].update(median=MAX_MS, p10=MAX_MS, p90=MAX_MS)
    d["timeline"][0].update(end_ms=MAX_STEP_MS)
    d["gradients"][0]["step_sq_norms"][0] = MAX_SQ_NORM
    d["pipeline"]["microbatch_size"] = MAX_MICROBATCH_SIZE
    p = parse_profile(d)
    assert p.actions[0].cost_ms.median == MAX_MS and p.timeline[0].end_ms == MAX_STEP_MS


def test_all_zero_action_costs_are_refused_and_zero_group_costs_load(tmp_path: Path) -> None:
    zero = {"median": 0.0, "p10": 0.0, "p90": 0.0, "n": 1}
    d = _data()
    for st in d["stages"]:
        for g in st["groups"]:
            g["weight_grad_ms"] = dict(zero)
    assert load_profile(_write(tmp_path, d))  # nothing to freeze, but a step to run: fine
    for a in d["actions"]:
        a["cost_ms"] = dict(zero)
    with pytest.raises(InputError, match="every action costs 0 ms: there is nothing to optimise"):
        load_profile(_write(tmp_path, d))


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            lambda p: dataclasses.replace(p, extra={"data": {"seen": [1.0, math.nan]}}),
            "extra.data.seen.1",
        ),
        (lambda p: dataclasses.replace(p, loss=(1.0, math.nan)), "loss.1"),
        (
            lambda p: dataclasses.replace(
                p,
                actions=(
                    dataclasses.replace(
                        p.actions[0], cost_ms=dataclasses.replace(p.actions[0].cost_ms, median=5e9)
                    ),
                    *p.actions[1:],
                ),
            ),
            "actions.0.cost_ms.median",
        ),
    ],
)
def test_save_profile_never_writes_what_the_loader_refuses(
    tmp_path: Path, change, where: str
) -> None:
    out = tmp_path / "p.json"
    with pytest.raises(
        InputError,
        match=rf"^profile {re.escape(str(out))} \(not written\): invalid profile at {re.escape(where)}\b",
    ) as e:
        save_profile(change(make_profile()), out)
    assert "\n" not in str(e.value)
    assert not out.exists()
