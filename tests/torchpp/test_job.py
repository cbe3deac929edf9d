"""Job specs load, validate with one-line errors, and the built-in example model and data are sound.

Nothing here starts a process: bad specs must be rejected before any rank is spawned.
"""

from __future__ import annotations

import math
import re
import sysconfig
from pathlib import Path

import pytest
import torch

from freezeopt.errors import InputError
from freezeopt.examples import builtin_job_path
from freezeopt.examples.tiny_gpt import build_model, stdlib_bytes, stdlib_files
from freezeopt.profiling.run import _one_rank_fault, profile_job
from freezeopt.torchpp.faults import RANK_FAULTS, Fault, parse_faults
from freezeopt.torchpp.job import (
    Job,
    ModelParts,
    load_job,
    parse_job,
    replace_job,
    resolve_data,
    resolve_groups,
    resolve_model,
)

REPO = Path(__file__).resolve().parents[2]


def one_line(e: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg, f"error must be one non-empty line: {msg!r}"
    return msg


def test_builtin_job_loads_by_name_and_from_the_shipped_file() -> None:
    by_name = load_job("tiny-gpt")
    assert by_name.name == "tiny-gpt" and by_name.schedule == "1F1B" and by_name.ranks == 2
    shipped = load_job(REPO / "examples" / "tiny-gpt.yaml")
    assert shipped == by_name
    path = builtin_job_path("tiny-gpt")
    assert (
        path is not None and path.read_text() == (REPO / "examples" / "tiny-gpt.yaml").read_text()
    )


def test_defaults_and_derived_fields() -> None:
    job = parse_job({"name": "x"})
    assert job.model == "tiny-gpt" and job.data == "stdlib-bytes" and job.device == "cpu"
    assert job.microbatch_size == job.batch_size // job.microbatches
    assert not job.is_csv


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"name": "x", "shedule": "1F1B"}, "at shedule: unknown key (the fields are in docs/"),
        ({"name": "x", "schedule": "2F2B"}, "unknown schedule '2F2B'"),
        ({"name": "x", "batch_size": 10, "microbatches": 4}, "not a multiple of microbatches"),
        ({"name": "x", "model": "no colon here"}, "package.module:function"),
        ({"name": "x", "ranks": 0}, "ranks"),
        ({"name": "x", "device": "tpu"}, "device"),
        ({"name": "x", "warmup_steps": 0}, "warmup_steps"),
        ({"name": "x", "groups": {}}, "groups is empty"),
        ({"name": "bad name!"}, "name"),
        (["not", "a", "mapping"], "YAML mapping"),
    ],
)
def test_bad_specs_give_one_clear_line(data: object, needle: str) -> None:
    with pytest.raises(InputError) as e:
        parse_job(data, source="job.yaml")
    assert needle in one_line(e)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("lr: .inf", "invalid job spec at lr: Input should be a finite number"),
        ("lr: 1e999", "invalid job spec at lr: Input should be a finite number"),
        ("weight_decay: .nan", "invalid job spec at weight_decay: Input should be a finite number"),
        ("hang_timeout_s: .inf", "invalid job spec at hang_timeout_s: Input should be a finite"),
        # free-form arguments: passed to user code and recorded in the profile
        (
            "model_args: {d_model: .nan}",
            "invalid job spec at model_args.d_model: nan is not a finite",
        ),
        ("data_args: {w: [1, -.inf]}", "invalid job spec at data_args.w.1: -inf is not a finite"),
        ("data_args: {a: {b: .inf}}", "invalid job spec at data_args.a.b: inf is not a finite"),
        # past what the run can use: a timedelta overflows, torch's seed has 64 bits
        ("hang_timeout_s: 1.0e+300", "at hang_timeout_s: Input should be less than or equal to"),
        ("timeout_s: 1.0e+12", "at timeout_s: Input should be less than or equal to"),
        ("seed: 18446744073709551616", "at seed: Input should be less than or equal to 4294967295"),
        ("seed: -1", "at seed: Input should be greater than or equal to 0"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_refused_at_load(
    tmp_path: Path, text: str, needle: str
) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(f"name: x\n{text}\n")
    with pytest.raises(InputError) as e:
        load_job(f)
    assert needle in one_line(e)
    with pytest.raises(InputError, match="seed"):  # the command line's overrides too
        replace_job(load_job("tiny-gpt"), seed=2**64)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        load_job(tmp_path / "nope.yaml")
    assert "not found" in one_line(e)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(InputError) as e:
        load_job(bad)
    assert "not valid YAML" in one_line(e)
    bad.write_text("\n# nothing but a comment\n")
    with pytest.raises(InputError) as e:
        load_job(bad)
    assert one_line(e).endswith(
        "is empty; a job spec is a YAML mapping (e.g. `name: my-job`; docs/profiling.md lists the fields)"
    )


def test_replace_job_validates() -> None:
    job = load_job("tiny-gpt")
    assert replace_job(job, measure_steps=3).measure_steps == 3
    with pytest.raises(InputError) as e:
        replace_job(job, nonsense=1)
    assert "nonsense" in one_line(e)
    with pytest.raises(InputError):
        replace_job(job, microbatches=3)  # 16 is not a multiple of 3


def test_csv_schedule_path_is_relative_to_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "order.csv").write_text("0F0,0B0\n1F0,1B0\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: c\nschedule: order.csv\nmicrobatches: 1\nbatch_size: 2\n")
    job = load_job(spec)
    assert job.is_csv and Path(job.schedule) == (tmp_path / "order.csv").resolve()


def test_model_and_data_functions_resolve() -> None:
    job = load_job("tiny-gpt")
    assert resolve_model(job) is build_model
    assert resolve_data(job) is stdlib_bytes
    with pytest.raises(InputError) as e:
        resolve_model(replace_job(job, model="freezeopt.examples.tiny_gpt:no_such_fn"))
    assert "has no function no_such_fn" in one_line(e)
    with pytest.raises(InputError) as e:
        resolve_data(replace_job(job, data="no_such_pkg_xyz.mod:fn"))
    assert "cannot import module no_such_pkg_xyz.mod" in one_line(e)


# --- bad jobs are rejected by profile_job before any rank starts ---------------------------------


def small(**kw: object) -> Job:
    base: dict[str, object] = {
        "measure_steps": 1,
        "warmup_steps": 1,
        "microbatches": 4,
        "batch_size": 8,
    }
    base.update(kw)
    return replace_job(load_job("tiny-gpt"), **base)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model": "freezeopt.examples.tiny_gpt:missing"}, "has no function missing"),
        ({"schedule": "1F1B", "stages_per_rank": 2}, "one stage per rank"),
        ({"schedule": "ZBVZeroBubble", "stages_per_rank": 3}, "exactly 2 stages per rank"),
        ({"schedule": "Interleaved1F1B", "stages_per_rank": 1}, "multi-stage schedule"),
        (
            {
                "schedule": "Interleaved1F1B",
                "stages_per_rank": 2,
                "microbatches": 5,
                "batch_size": 10,
            },
            "multiple of the number of rounds",
        ),
        ({"schedule": "1F1B", "ranks": 4, "microbatches": 2, "batch_size": 4}, "greater than"),
        ({"model_args": {"n_layers": 3}}, "cannot be split evenly over 2 stages"),
        ({"model_args": {"d_model": 30, "n_heads": 4}}, "divisible by n_heads"),
        ({"model_args": {"width": 3}}, "model_args accepts"),
    ],
)
def test_profile_rejects_bad_jobs_before_spawning(
    tmp_path: Path, changes: dict[str, object], needle: str
) -> None:
    out = tmp_path / "p.json"
    with pytest.raises(InputError) as e:
        profile_job(small(**changes), out=out, progress=False)
    assert needle in one_line(e)
    assert not out.exists()


def test_user_model_with_wrong_stage_count_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "onestage.py").write_text(
        "import torch\n"
        "from freezeopt.torchpp.job import ModelParts\n"
        "def build(n_stages, seq_len, **kw):\n"
        "    return ModelParts(stages=[torch.nn.Linear(4, 4)], loss_fn=torch.nn.functional.mse_loss)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError) as e:
        profile_job(small(model="onestage:build"), out=tmp_path / "p.json", progress=False)
    assert "returned 1 stages" in one_line(e) and "needs 2" in one_line(e)


@pytest.mark.parametrize(
    ("rows", "changes", "needle"),
    [
        ("0F0,0B0\n", {}, "has 1 rows but the job has 2 ranks"),
        ("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", {}, "deadlocks"),
        ("0F0,0F1,0B1,0B0\n1B0,1F0,1F1,1B1\n", {}, "without first running Forward"),
        ("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", {"stages_per_rank": 2}, "stages_per_rank is 2"),
        ("0F0,0X1\n1F0,1B0\n", {}, "schedule CSV"),
    ],
)
def test_bad_csv_schedules(
    tmp_path: Path, rows: str, changes: dict[str, object], needle: str
) -> None:
    csv = tmp_path / "order.csv"
    csv.write_text(rows)
    job = small(schedule=str(csv), microbatches=2, batch_size=4, **changes)
    with pytest.raises(InputError) as e:
        profile_job(job, out=tmp_path / "p.json", progress=False)
    assert needle in one_line(e)


def test_fault_spec_parsing() -> None:
    """One vocabulary for profile's and train's injected faults; profile takes one rank fault."""
    (f,) = parse_faults("crash:rank=1,step=2", kinds=RANK_FAULTS)
    assert (f.kind, f.rank, f.step) == ("crash", 1, 2)
    assert parse_faults("hang: rank=0, step=3", kinds=RANK_FAULTS)[0].kind == "hang"
    for text in ("explode:rank=1", "lr_spike:step=2", "crash:rank=1,step=2;kill:rank=0,step=1"):
        with pytest.raises(InputError) as e:
            profile_job(small(), out=Path("unused.json"), progress=False, fault=text)
        assert "crash:rank=1,step=2" in one_line(e), text
    with pytest.raises(InputError) as e:
        profile_job(small(), out=Path("unused.json"), progress=False, fault="crash:rank=5,step=0")
    assert "rank 5" in one_line(e)
    # profile takes nan_loss too (a diverging run); and a value must be a finite number
    assert _one_rank_fault("nan_loss:step=2,steps=3") == Fault(kind="nan_loss", step=2, steps=3)
    for text in ("lr_spike:step=inf", "slow:stage=0,ms=nan", "lr_spike:step=1,factor=-inf"):
        with pytest.raises(InputError, match="is not a finite number"):
            parse_faults(text)


# --- parameter groups ------------------------------------------------------------------------------


def test_tiny_gpt_groups_cover_every_parameter_once() -> None:
    parts = build_model(n_stages=2, seq_len=16, d_model=32, n_heads=2, n_layers=4)
    assert isinstance(parts, ModelParts) and len(parts.stages) == 2 and parts.groups is not None
    for st, groups in zip(parts.stages, parts.groups, strict=True):
        names = [n for n, _ in st.named_parameters()]
        flat = [n for members in groups.values() for n in members]
        assert sorted(flat) == sorted(names)
    assert list(parts.groups[0]) == ["blocks.0", "blocks.1"]
    assert any(n.startswith("embed.") for n in parts.groups[0]["blocks.0"])
    assert {"norm.weight", "head.weight"} <= set(parts.groups[1]["blocks.3"])


def test_explicit_group_patterns() -> None:
    names = ["embed.tok.weight", "blocks.0.qkv.weight", "blocks.0.fc.weight", "blocks.1.qkv.weight"]
    child = {n: n.split(".")[0] for n in names}
    job = parse_job(
        {"name": "x", "groups": {"attn": ["*.qkv.*"], "rest": ["embed.*", "blocks.0.fc.*"]}}
    )
    got = resolve_groups(job, 0, names, None, child)
    assert got == (
        ("rest", ("embed.tok.weight", "blocks.0.fc.weight")),
        ("attn", ("blocks.0.qkv.weight", "blocks.1.qkv.weight")),
    )
    overlap = parse_job(
        {"name": "x", "groups": {"a": ["blocks.*"], "b": ["*.qkv.*"], "c": ["embed.*"]}}
    )
    with pytest.raises(InputError) as e:
        resolve_groups(overlap, 0, names, None, child)
    assert "matches groups" in one_line(e)
    gap = parse_job({"name": "x", "groups": {"a": ["blocks.*"]}})
    with pytest.raises(InputError) as e:
        resolve_groups(gap, 0, names, None, child)
    assert "embed.tok.weight matches no group" in one_line(e)


def test_default_groups_are_top_level_children() -> None:
    job = parse_job({"name": "x"})
    names = ["enc.weight", "enc.bias", "dec.weight", "scale"]
    child = {"enc.weight": "enc", "enc.bias": "enc", "dec.weight": "dec", "scale": ""}
    assert resolve_groups(job, 0, names, None, child) == (
        ("enc", ("enc.weight", "enc.bias")),
        ("dec", ("dec.weight",)),
        ("params", ("scale",)),
    )
    with pytest.raises(InputError) as e:
        resolve_groups(job, 0, names, {"g": ["enc.weight", "nope"]}, child)
    assert "'nope'" in one_line(e)


# --- the stdlib corpus ----------------------------------------------------------------------------


def test_stdlib_corpus_is_real_deterministic_text_with_a_disjoint_validation_split() -> None:
    base = Path(sysconfig.get_paths()["stdlib"])
    rel = [f.relative_to(base).as_posix() for f in stdlib_files()]
    assert len(rel) > 100 and rel == sorted(rel) and all(r.endswith(".py") for r in rel)
    assert not any({"site-packages", "test", "idlelib"} & set(Path(r).parts[:-1]) for r in rel)
    d1 = stdlib_bytes(
        batch_size=4, seq_len=32, seed=0, max_train_bytes=200_000, max_val_bytes=50_000
    )
    d2 = stdlib_bytes(
        batch_size=4, seq_len=32, seed=0, max_train_bytes=200_000, max_val_bytes=50_000
    )
    x, y = d1.train(3)
    assert x.shape == (4, 32) and x.dtype == torch.long
    assert torch.equal(x, d2.train(3)[0]) and not torch.equal(x, d1.train(4)[0])
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one byte"
    sample = bytes(torch.cat([d1.train(k)[0].flatten() for k in range(8)]).tolist())
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in sample) / len(sample)
    assert printable > 0.95, (
        "source text is almost all printable ASCII (random bytes would be ~40 %)"
    )
    prov = d1.provenance
    assert prov["train_sha256"] != prov["val_sha256"] and len(prov["train_sha256"]) == 64
    assert prov["python"].count(".") == 2 and prov["train_bytes"] == 200_000
    vx, vy = d1.val(0)
    assert torch.equal(vx, d2.val(0)[0]) and torch.equal(vx[:, 1:], vy[:, :-1])


def test_the_documented_user_model_example_is_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/profiling.md's `mymodel.py` and `my-job.yaml` are a working pair."""
    import yaml

    from freezeopt.torchpp.pipeline import check_parts, plan_pipeline

    doc = (REPO / "docs" / "profiling.md").read_text()
    blocks = re.findall(r"```(python|yaml)\n(.*?)```", doc, flags=re.S)
    code = next(body for lang, body in blocks if lang == "python" and "def build(" in body)
    spec = next(body for lang, body in blocks if lang == "yaml" and "mymodel:build" in body)
    (tmp_path / "mymodel.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = parse_job(yaml.safe_load(spec), source="docs")
    parts = resolve_model(job)(n_stages=2, seq_len=job.seq_len, **job.model_args)
    groups = check_parts(job, plan_pipeline(job), parts)
    assert [g for g, _ in groups[0]] == ["embed", "mix"] and [g for g, _ in groups[1]] == [
        "hidden",
        "head",
    ]
    x, y = stdlib_bytes(
        batch_size=2, seq_len=8, seed=0, max_train_bytes=10_000, max_val_bytes=5_000
    ).train(0)
    loss = parts.loss_fn(parts.stages[1](parts.stages[0](x)), y)
    assert loss.ndim == 0 and math.isfinite(float(loss.detach()))
