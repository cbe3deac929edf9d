"""Fuzzing the file boundary: whatever a profile, schedule or job file holds, loading it (and the
CLI commands that read it) either works or fails with a documented one-line error.

`make test` runs a fast subset; `make reliability` raises FREEZEOPT_FUZZ_EXAMPLES to run well over
10,000 cases and writes benchmarks/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from freezeopt.cli import app
from freezeopt.errors import EXIT_CODES, FreezeoptError
from freezeopt.formats.profile import dump_profile, load_profile
from freezeopt.formats.schedule import Phases, check_fits, dump_schedule, load_schedule
from freezeopt.model.dag import build_dag, schedule_plan
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.model.simulate import simulate
from freezeopt.solver import SolveOptions, schedule_from_result, solve
from freezeopt.torchpp.job import load_job
from tests.conftest import make_profile

EXAMPLES = int(os.environ.get("FREEZEOPT_FUZZ_EXAMPLES", "150"))
_LOG = os.environ.get("FREEZEOPT_FUZZ_LOG")  # `make reliability` collects outcomes here


def _record(test: str, outcome: str) -> None:
    """Append one case's outcome (`ok`, or the documented error class) for the reliability report."""
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(json.dumps({"test": test, "outcome": outcome}) + "\n")


def _expect_documented(test: str, fn: Any) -> None:
    """Run one case: success, or a FreezeoptError of one line; anything else fails the test."""
    try:
        fn()
    except FreezeoptError as e:
        assert "\n" not in str(e)
        _record(test, type(e).__name__)
    else:
        _record(test, "ok")


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
ROOT = Path(__file__).resolve().parent.parent

_PROFILE = json.loads(
    dump_profile(
        make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=2, groups=2, trace_steps=1)
    )
)


def _schedule_data() -> dict[str, Any]:
    from freezeopt.formats.profile import profile_sha256

    p = make_profile(ranks=2, microbatches=4, groups=2)
    dag = build_dag(p)
    opts = SolveOptions(mode="heuristic", budget=0.3)
    r = solve(dag, estimate_signal(p), opts)
    s = schedule_from_result(
        r, profile=p, profile_sha256=profile_sha256(p), dag=dag, opts=opts, phases=Phases()
    )
    return yaml.safe_load(dump_schedule(s))


_SCHEDULE = _schedule_data()
_JOB = yaml.safe_load((ROOT / "examples" / "tiny-gpt.yaml").read_text())

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_json_value = st.recursive(
    _json_leaf,
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)
    ),
    max_leaves=8,
)


def test_fuzz_bases_are_valid(tmp_path: Path) -> None:
    """The documents the fuzzers mutate load cleanly, so mutations test what they claim to."""
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_PROFILE))
    _profile_pipeline(f)
    g = tmp_path / "s.yaml"
    g.write_text(yaml.safe_dump(_SCHEDULE))
    p = make_profile(ranks=2, microbatches=4, groups=2)
    s = load_schedule(g)
    check_fits(s, p)
    assert schedule_plan(s, build_dag(p))
    load_job(ROOT / "examples" / "tiny-gpt.yaml")


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            out += _paths(v, (*prefix, i))
    return out


def _get(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def _mutate(base: Any, seed: int, value: Any, how: int) -> Any:
    """Copy `base` and change one place: replace a value, delete a key, add one, or alter a number."""
    data = json.loads(json.dumps(base))
    rnd = random.Random(seed)
    paths = [p for p in _paths(data) if p]
    path = rnd.choice(paths)
    parent = data
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if how == 3:  # a plausible-looking number: exercises the checks past the schema
        nums = [
            p
            for p in paths
            if isinstance(_get(data, p), int | float) and not isinstance(_get(data, p), bool)
        ]
        if nums:
            target = rnd.choice(nums)
            holder = _get(data, target[:-1])
            old = holder[target[-1]]
            choices = [0, 1, -1, old * 2, old / 3, old * 1e6, 2**31, 1e-9]
            new = rnd.choice(choices)
            holder[target[-1]] = int(new) if isinstance(old, int) and abs(new) < 2**62 else new
        return data
    if how == 0:
        parent[last] = value
    elif how == 1 and isinstance(parent, dict):
        del parent[last]
    elif how == 1 and isinstance(parent, list):
        parent.pop(last)
    elif isinstance(parent, dict):
        parent[f"x{seed % 7}"] = value
    else:
        parent.append(value)
    return data


def _text_mutation(text: str, seed: int) -> str:
    rnd = random.Random(seed)
    kind = seed % 4
    i = rnd.randrange(len(text) + 1)
    if kind == 0:
        return text[:i]  # truncated
    if kind == 1:
        return (
            text[:i]
            + rnd.choice(
                ["\x00", "{", "]", "!!python/object:os.system", "&a *a", "\ufffd", "1e999"]
            )
            + text[i:]
        )
    if kind == 2:
        j = min(len(text), i + rnd.randrange(1, 40))
        return text[:i] + text[j:]
    return text[:i] + text[i:][::-1][:20] + text[i + 20 :]


def _profile_pipeline(path: Path) -> None:
    """Everything solve does with a profile, short of the LP."""
    p = load_profile(path)
    dag = build_dag(p)
    simulate(dag)
    for est in ("gns", "numel"):
        with contextlib.suppress(FreezeoptError):
            estimate_signal(p, est)  # type: ignore[arg-type]


@FUZZ
@given(seed=st.integers(0, 2**32), value=_json_value, how=st.integers(0, 3))
def test_profile_structure_fuzz(tmp_path: Path, seed: int, value: Any, how: int) -> None:
    f = tmp_path / "p.json"
    f.write_text(_json_text(_mutate(_PROFILE, seed, value, how), seed))
    _expect_documented("profile (structure mutations)", lambda: _profile_pipeline(f))


def _json_text(data: Any, seed: int) -> str:
    """`data` as JSON; for odd seeds with infinities written `1e999`, which `json` reads as one
    (`Infinity` is refused by the reader, `1e999` only where a number is checked)."""
    text = json.dumps(data, allow_nan=True)
    return text.replace("Infinity", "1e999") if seed % 2 else text


@FUZZ
@given(seed=st.integers(0, 2**32))
def test_profile_text_fuzz(tmp_path: Path, seed: int) -> None:
    f = tmp_path / "p.json"
    f.write_text(_text_mutation(json.dumps(_PROFILE), seed))
    _expect_documented("profile (text mutations)", lambda: _profile_pipeline(f))


@FUZZ
@given(seed=st.integers(0, 2**32), value=_json_value, how=st.integers(0, 3))
def test_schedule_fuzz(tmp_path: Path, seed: int, value: Any, how: int) -> None:
    f = tmp_path / "s.yaml"
    data = _mutate(_SCHEDULE, seed, value, how)
    try:
        f.write_text(yaml.safe_dump(data))
    except (yaml.YAMLError, ValueError, TypeError):
        return
    if seed % 3 == 0:
        f.write_text(_text_mutation(f.read_text(), seed))
    p = make_profile(ranks=2, microbatches=4, groups=2)

    def case() -> None:
        s = load_schedule(f)
        check_fits(s, p)
        schedule_plan(s, build_dag(p))

    _expect_documented("schedule", case)


@FUZZ
@given(seed=st.integers(0, 2**32), value=_json_value, how=st.integers(0, 3))
def test_job_fuzz(tmp_path: Path, seed: int, value: Any, how: int) -> None:
    f = tmp_path / "job.yaml"
    try:
        f.write_text(yaml.safe_dump(_mutate(_JOB, seed, value, how)))
    except (yaml.YAMLError, ValueError, TypeError):
        return
    if seed % 3 == 0:
        f.write_text(_text_mutation(f.read_text(), seed))
    _expect_documented("job spec", lambda: load_job(f))


runner = CliRunner()


@settings(
    max_examples=max(20, EXAMPLES // 10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(seed=st.integers(0, 2**32), value=_json_value, how=st.integers(0, 3))
def test_cli_fuzz(tmp_path: Path, seed: int, value: Any, how: int) -> None:
    prof = tmp_path / "p.json"
    prof.write_text(_json_text(_mutate(_PROFILE, seed, value, how), seed))
    sched = tmp_path / "s.yaml"
    sched.write_text(_text_mutation(yaml.safe_dump(_SCHEDULE), seed))
    for args in (
        ["solve", str(prof), "--mode", "heuristic", "--time-limit", "20"],
        ["validate", str(sched), "--profile", str(prof)],
        ["simulate", str(sched), "--profile", str(prof)],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code in EXIT_CODES, (args, r.exit_code, r.output)
        assert "Traceback" not in r.output
        if r.exit_code:
            assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        _record(f"CLI {args[0]}", f"exit {r.exit_code}")


def test_oversized_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("w") as f:
        f.write('{"schema_version": 1, "pad": "')
        f.write("x" * (300 * 2**20))
        f.write('"}')
    with pytest.raises(FreezeoptError, match="too large"):
        load_profile(big)
    bigy = tmp_path / "big.yaml"
    bigy.write_text("schema_version: 1\n" + "#" * (20 * 2**20))
    with pytest.raises(FreezeoptError, match="too large"):
        load_schedule(bigy)


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "deep.json"
    f.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(FreezeoptError):
        load_profile(f)
    g = tmp_path / "deep.yaml"
    g.write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(FreezeoptError):
        load_schedule(g)


# --- what freezeopt writes passes its own validation ---------------------------------------------


def _scaled(p: Any, k: float) -> Any:
    """Profile `p` with every time (actions, groups, lags) multiplied by `k`."""
    import dataclasses

    def sc(s: Any) -> Any:
        return dataclasses.replace(s, median=s.median * k, p10=s.p10 * k, p90=s.p90 * k)

    return dataclasses.replace(
        p,
        actions=tuple(dataclasses.replace(a, cost_ms=sc(a.cost_ms)) for a in p.actions),
        lags=tuple(dataclasses.replace(lag, ms=sc(lag.ms)) for lag in p.lags),
        stages=tuple(
            dataclasses.replace(
                st,
                groups=tuple(
                    dataclasses.replace(g, weight_grad_ms=sc(g.weight_grad_ms)) for g in st.groups
                ),
            )
            for st in p.stages
        ),
    )


def _at_the_limit(p: Any) -> Any:
    """`p` scaled so that its largest time is `MAX_MS` itself (rounding kept under it)."""
    from freezeopt.formats.profile import MAX_MS

    top = max(max(a.cost_ms.p90 for a in p.actions), max(lag.ms.p90 for lag in p.lags))
    return _scaled(p, MAX_MS * (1 - 1e-5) / top)


def _no_group_costs(p: Any) -> Any:
    import dataclasses

    zero = dataclasses.replace(p.stages[0].groups[0].weight_grad_ms, median=0.0, p10=0.0, p90=0.0)
    return dataclasses.replace(
        p,
        stages=tuple(
            dataclasses.replace(
                st, groups=tuple(dataclasses.replace(g, weight_grad_ms=zero) for g in st.groups)
            )
            for st in p.stages
        ),
    )


_EDGES: list[tuple[str, dict[str, Any], Any]] = [
    # (name, SynthOptions fields, a change made after synthesis)
    ("tiny costs", {"forward_ms": 1e-6, "backward_ms": 2e-6, "lag_ms": 1e-7}, None),
    ("subnormal costs", {"forward_ms": 1e-310, "backward_ms": 1e-310, "lag_ms": 0.0}, None),
    ("huge costs", {"forward_ms": 5e7, "backward_ms": 9e7, "jitter": 0.1, "lag_ms": 1e8}, None),
    ("costs at the limit", {"schedule": "ZBVZeroBubble"}, _at_the_limit),
    ("no group costs", {}, _no_group_costs),
    ("one microbatch", {"schedule": "GPipe", "microbatches": 1}, None),
    ("one rank, one microbatch", {"ranks": 1, "microbatches": 1}, None),
    ("one group, no noise", {"groups": 1, "noise": 0.0, "jitter": 0.0}, None),
    ("all weight work", {"weight_share": 1.0, "schedule": "ZBVZeroBubble"}, None),
    ("no lags, last stage heavy", {"lag_ms": 0.0, "last_stage_factor": 50.0}, None),
    ("DualPipeV", {"schedule": "DualPipeV", "microbatches": 4}, None),
    ("no traces", {"trace_steps": 0, "schedule": "Interleaved1F1B"}, None),
]


def _random_edges(n: int) -> list[tuple[str, dict[str, Any], Any]]:
    """`n` seeded draws of the options above, mixed."""
    rnd = random.Random(20240531)
    out = []
    for i in range(n):
        opts = {
            "schedule": rnd.choice(["1F1B", "GPipe", "ZBVZeroBubble", "Interleaved1F1B"]),
            "microbatches": rnd.choice([1, 2, 3, 8]),
            "groups": rnd.choice([1, 2, 5]),
            "forward_ms": rnd.choice([1e-9, 1e-3, 10.0, 1e7]),
            "backward_ms": rnd.choice([1e-9, 2e-3, 20.0, 9e7]),
            "weight_share": rnd.choice([0.01, 0.5, 1.0]),
            "noise": rnd.choice([0.0, 0.02, 0.49]),
            "jitter": rnd.choice([0.0, 0.1, 0.1]),
            "lag_ms": rnd.choice([0.0, 1e-6, 0.1, 1e8]),
            "seed": i,
        }
        out.append((f"random {i}", opts, rnd.choice([None, None, _no_group_costs])))
    return out


@pytest.mark.parametrize(
    ("name", "opts", "change"),
    _EDGES + _random_edges(max(4, EXAMPLES // 25)),
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_what_solve_writes_from_an_edge_profile_validates_against_it(
    tmp_path: Path, name: str, opts: dict[str, Any], change: Any
) -> None:
    """For profiles at the edges (tiny, subnormal, huge and at-the-limit costs, no group costs,
    one microbatch, one group, no noise, no traces): the saved profile reloads byte for byte,
    and the schedule each mode writes from it reloads and `validate --profile` accepts it."""
    from freezeopt.commands import solve_file, validate_files
    from freezeopt.profiling.synth import SynthOptions, synth_profile

    base = {"ranks": 2, "microbatches": 4, "groups": 2, **opts}
    try:
        p = synth_profile(SynthOptions(**base))
    except FreezeoptError as e:  # a random draw torch has no schedule for (1F1B, 1 microbatch)
        assert name.startswith("random") and "\n" not in str(e)
        _record("edge profiles", type(e).__name__)
        return
    p = change(p) if change is not None else p
    prof = tmp_path / "p.json"
    try:
        from freezeopt.formats.profile import save_profile

        save_profile(p, prof)
    except FreezeoptError as e:  # refused (all costs underflowed to 0, say): nothing written
        assert "\n" not in str(e) and not prof.exists()
        _record("edge profiles", type(e).__name__)
        return
    assert dump_profile(load_profile(prof)) == prof.read_text()
    sens = "numel" if p.pipeline.n_microbatches < 2 or not p.gradients else "gns"
    modes = ["heuristic", "lp", "milp"]
    if name.startswith("random"):  # one mode each: the draws are many
        modes = [modes[int(opts["seed"]) % 3]]
    for mode in modes:
        out = tmp_path / f"{mode}.yaml"
        solve_opts = SolveOptions(mode=mode, time_limit=5, sensitivity=sens, budget=0.3)  # type: ignore[arg-type]
        solve_file(prof, solve_opts, phases=Phases(), out=out)
        sched, _ = validate_files(out, prof)  # what `validate --profile` runs
        assert sched.prediction.predicted_ms <= sched.prediction.baseline_ms * (1 + 1e-6) + 1e-9
        _record("edge profiles", "ok")
    for argv in (
        ["validate", str(out), "--profile", str(prof)],
        ["simulate", str(out), "-p", str(prof)],
    ):
        r = runner.invoke(app, argv)
        assert r.exit_code == 0 and "Traceback" not in r.output, (name, argv, r.output)
