"""Profile files: validated at the boundary, deterministic, schema committed and in sync."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from freezeopt.errors import InputError
from freezeopt.formats.profile import dump_profile, load_profile, profile_json_schema, save_profile
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
    """What `json` writes for a profile: its fields rounded, indent 1, ASCII."""
    plain = _rounded(dataclasses.asdict(p))
    return json.dumps(plain, indent=1, ensure_ascii=True, allow_nan=False) + "\n"


def test_the_committed_profile_is_written_back_byte_for_byte() -> None:
    """`dump_profile` (one pass over the dataclasses) keeps the bytes of the committed profile,
    which holds every kind of field (nested extras, a timeline, gradient traces), so hashes in
    committed schedules stay valid."""
    path = Path(__file__).resolve().parents[2] / "profiles" / "tiny-gpt-1f1b.json"
    p = load_profile(path)
    assert p.extra and p.timeline and p.gradients
    assert dump_profile(p) == path.read_text()
    fresh = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4)  # floats unrounded
    assert dump_profile(fresh) == _as_json_writes(fresh)


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
