"""`freezeopt compare` on a tiny real job: every policy runs (the matched TimelyFreeze too); the
freezing policies train past N until they reach `none`'s validation loss, or report "never"; the
report, Gantt charts and results parse, and bench_compare rebuilds RESULTS.md from them. Plus the
aggregation and the table on hand-made runs, where both outcomes are certain."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from freezeopt.compare.policies import BUDGETED, MATCH_TOLERANCE, POLICIES
from freezeopt.compare.run import (
    CompareOptions,
    CompareReport,
    Run,
    _aggregate,
    compare_job,
    format_compare,
    load_compare,
)
from freezeopt.errors import InputError
from freezeopt.torchpp.job import load_job, replace_job
from freezeopt.tracking import TrackingOptions

ROOT = Path(__file__).resolve().parents[2]


def tiny_job():  # type: ignore[no-untyped-def]
    return replace_job(
        load_job("tiny-gpt"),
        measure_steps=4,
        warmup_steps=1,
        cost_samples=3,
        lag_samples=5,
        val_batches=1,
        model_args={"d_model": 32, "n_heads": 2, "n_layers": 4, "mlp_ratio": 2},
        data_args={"max_train_bytes": 100000, "max_val_bytes": 10000, "val_every": 10},
    )


@pytest.mark.slow
def test_compare_tiny(tmp_path: Path) -> None:
    n, longest, budget = 14, 21, 0.2
    opts = CompareOptions(
        policies=POLICIES,
        steps=n,
        warmup_steps=3,
        val_every=5,
        budget=budget,
        overrun=1.5,
        sweep=(0.1,),
        time_limit=20,
    )
    out = tmp_path / "cmp"
    # the job leaves its first 3 steps unmeasured, as many as compare's warm-up: no run measures a
    # full-update step of its own (compare times every policy against `none`'s run instead)
    job = replace_job(tiny_job(), warmup_steps=3)
    tracking = TrackingOptions(
        mlflow=f"sqlite:///{tmp_path / 'mlflow.db'}", tensorboard=tmp_path / "tb"
    )
    rep = compare_job(
        job, out_dir=out, opts=opts, progress=False, command="cmd under test", tracking=tracking
    )
    assert [r.policy for r in rep.results] == list(opts.policies)
    res = {r.policy: r for r in rep.results}
    none = res["none"]
    assert none.ratio == pytest.approx(1.0) and none.gain_captured is None
    assert none.time_ratio == pytest.approx(1.0) and none.reached == 1
    for r in rep.results:
        assert r.step_ms > 0 and r.val_loss > 0 and r.loss > 0

    # none runs N steps and sets the target; the others run on until they reach it, or to 1.5·N
    assert rep.runs[0].policy == "none"
    target = rep.runs[0].val_loss
    for run in rep.runs:
        vals = json.loads((Path(run.out_dir) / "report.json").read_text())["val_losses"]
        steps = [s for s, _ in vals]
        assert n in steps and steps[-1] == run.end_step
        assert run.val_loss == dict(vals)[n]
        if run.policy == "none":
            assert run.max_steps == run.end_step == n and run.target == run.val_loss
            assert run.time_to_target_s is not None
            continue
        assert run.max_steps == longest and run.target == target
        if run.time_to_target_s is None:
            assert run.end_step == longest and all(v > target for _, v in vals)
            assert run.steps_to_target is None
        else:
            hit = run.steps_to_target
            assert hit is not None and dict(vals)[hit] <= target
            assert all(v > target for s, v in vals if s < hit)
            assert run.end_step == min(s for s in steps if s >= max(n, hit))
    own = json.loads((Path(rep.runs[-1].out_dir) / "report.json").read_text())["warnings"]
    assert any(w.startswith("no full-update step was measured") for w in own)
    assert not any("no full-update step was measured" in w for w in rep.warnings)
    table = format_compare(rep)
    # runs taken while other processes loaded the host mark the whole table unreliable
    saved = json.loads((out / "results.json").read_text())
    assert saved["unreliable"] == list(rep.unreliable)
    assert table.startswith("**UNRELIABLE**") == bool(rep.unreliable)
    busy = format_compare(dataclasses.replace(rep, unreliable=(rep.runs[0].out_dir,)))
    assert busy.startswith("**UNRELIABLE**: other processes kept the host busy during 1 of ")
    for r in rep.results:
        row = next(ln for ln in table.splitlines() if ln.startswith(f"| {r.policy} |"))
        assert (f"never within {r.max_steps} steps" in row) == (r.time_to_target_s is None)

    # TimelyFreeze at its own cap, and at the cap that drops the budget
    assert res["timelyfreeze"].stage_cap == pytest.approx(0.9)
    matched = res["timelyfreeze-matched"]
    assert matched.stage_cap is not None
    assert (
        abs(matched.signal_dropped - budget) <= MATCH_TOLERANCE * budget or matched.stage_cap == 1.0
    )

    # files: report, results, plots (Gantt charts for none and freezeopt), schedules
    md = (out / "report.md").read_text()
    assert md.startswith("# freezeopt compare") and "`cmd under test`" in md
    figures = {"loss_vs_time.png", "gantt-none.png", "gantt-freezeopt.png", "budget_sweep.png"}
    assert set(rep.figures) == figures
    for png in figures:
        assert (out / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in md
    again = load_compare(out)
    assert again.results == rep.results and again.runs == rep.runs
    assert again.run_info["command"] == "cmd under test" and again.run_info["wall_s"] > 0
    swept = [p for p in opts.policies if p in BUDGETED]
    assert [r.policy for r in again.sweep] == swept
    assert all(r.end_step == n for r in again.sweep)
    assert len(list((out / "schedules").glob("*.yaml"))) == len(opts.policies) + len(swept)

    # tracked: the comparison a parent run (its figures), each trained run a child
    _check_tracked(rep, out, tracking)

    # bench_compare --report-only rebuilds RESULTS.md from the folder, quoting its own record
    bench = tmp_path / "bench"
    shutil.copytree(out, bench / "compare-tiny-gpt-1f1b")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_compare.py"), "--report-only"]
    cmd += ["--out", str(bench / "RESULTS.md"), "--cases", "tiny-gpt-1f1b,tiny-gpt-zbv"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    text = (bench / "RESULTS.md").read_text()
    assert "Rebuilt with `--report-only`" in text and "`cmd under test`: started " in text
    assert "## tiny-gpt-zbv\n\nNot run in this benchmark run." in text
    assert table in text and "](compare-tiny-gpt-1f1b/gantt-freezeopt.png)" in text


def _check_tracked(rep: CompareReport, out: Path, tracking: TrackingOptions) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    client = MlflowClient(tracking_uri=tracking.mlflow)
    exp = client.get_experiment_by_name("freezeopt")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if r is not parent}
    folders = sorted(p.name for p in (out / "runs").iterdir())
    assert sorted(children) == folders and len(folders) == len(rep.runs) + len(rep.sweep)
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children.values())
    assert parent.info.run_name == f"compare {rep.job}" and parent.info.status == "FINISHED"
    res = {r.policy: r for r in rep.results}
    assert parent.data.metrics["freezeopt/ratio"] == pytest.approx(res["freezeopt"].ratio)
    assert parent.data.params["compare.budget"] == "0.2"
    top = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "results.json", "figures", "schedules"} <= top
    figures = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert figures == {f"figures/{f}" for f in rep.figures}
    frz = children[Path(next(r.out_dir for r in rep.runs if r.policy == "freezeopt")).name]
    assert "schedule.yaml" in {a.path for a in client.list_artifacts(frz.info.run_id)}
    assert frz.data.params["solve.mode"] == "freezeopt" and frz.data.metrics["frozen_share"] >= 0
    assert rep.tracked and rep.tracked[0].startswith(f"mlflow: run {parent.info.run_id}")
    (tb,) = (tracking.tensorboard or Path()).iterdir()
    assert sorted(p.name for p in tb.iterdir() if p.is_dir()) == folders
    acc = EventAccumulator(str(tb / frz.info.run_name))
    acc.Reload()
    assert "loss" in acc.Tags()["scalars"] and "frozen_share" in acc.Tags()["scalars"]
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert "figures/gantt-freezeopt" in acc.Tags()["images"]


def _run(policy: str, repeat: int, ms: float, t: float | None, **kw: object) -> Run:
    base: dict = {
        "policy": policy,
        "budget": 0.1,
        "repeat": repeat,
        "step_ms": ms,
        "loss": 2.0,
        "val_loss": 2.0,
        "curve": (),
        "loss_curve": (),
        "out_dir": "x",
        "end_step": 30 if t is None else 20,
        "max_steps": 20 if policy == "none" else 30,
        "time_to_target_s": t,
    }
    return Run(**{**base, **kw})  # type: ignore[arg-type]


def test_aggregate_medians_spread_and_never() -> None:
    runs = [
        _run("none", 0, 100.0, 10.0),
        _run("none", 1, 110.0, 12.0),
        _run("none", 2, 90.0, 8.0),
        _run("fast", 0, 80.0, 9.0),  # reached in every repeat
        _run("fast", 1, 99.0, 11.0),
        _run("fast", 2, 81.0, 6.0),
        _run("lossy", 0, 70.0, None),  # never
        _run("lossy", 1, 70.0, None),
        _run("lossy", 2, 70.0, None),
        _run("once", 0, 95.0, 9.0),  # reached in 1 of 3: the median is "never"
        _run("once", 1, 95.0, None),
        _run("once", 2, 95.0, None),
    ]
    pred = SimpleNamespace(predicted_ms=50.0, lp_bound_ms=40.0, signal_dropped=0.1)
    policies = ("none", "fast", "lossy", "once")
    predicted = {(p, 0.1): pred for p in policies}
    opts = SimpleNamespace(policies=policies, repeats=3, budget=0.1)  # made-up policies
    res = {r.policy: r for r in _aggregate(runs, predicted, {}, opts)}
    assert res["none"].ratio == 1.0 and res["none"].time_ratio == 1.0
    fast = res["fast"]
    assert fast.ratio == pytest.approx(0.9) and fast.step_ms == 81.0
    assert (fast.ratio_min, fast.ratio_max) == (pytest.approx(0.8), pytest.approx(0.9))
    assert fast.time_to_target_s == 9.0 and fast.reached == 3
    assert fast.time_ratio == pytest.approx(0.9)  # 9/10, 11/12, 6/8
    assert res["lossy"].time_to_target_s is None and res["lossy"].time_ratio is None
    assert res["once"].time_to_target_s is None and res["once"].reached == 1
    rep = CompareReport(
        job="j", out_dir="o", options={"steps": 20}, results=tuple(res.values()), runs=()
    )
    rows = {ln.split(" | ")[0][2:]: ln for ln in format_compare(rep).splitlines() if "|" in ln}
    assert "| 0.900 (0.800–0.900) |" in rows["fast"] and "| 9.0 s (3/3) | 0.900 |" in rows["fast"]
    assert "| never within 30 steps (0/3) | — |" in rows["lossy"]
    assert "| never within 30 steps (1/3) | — |" in rows["once"]


def test_load_compare_refuses_results_of_an_earlier_version(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"job": "j", "options": {"steps": 1}}))
    with pytest.raises(InputError, match="earlier `freezeopt compare`"):
        load_compare(tmp_path)
    with pytest.raises(InputError, match="not found"):
        load_compare(tmp_path / "nothing")


@pytest.mark.parametrize(
    ("change", "msg"),
    [
        ({"overrun": 0.5}, "^overrun must"),
        ({"repeats": 0}, "^repeats must"),
        ({"val_every": 0}, "^val_every must"),
        ({"policies": ("uniform",)}, "`none` policy"),
        ({"policies": ("none", "nope")}, "unknown policy 'nope'"),
        ({"sweep": (1.5,)}, "outside"),
    ],
)
def test_bad_options_are_one_line_errors_before_any_run(
    tmp_path: Path, change: dict, msg: str
) -> None:
    """`CompareOptions` checks itself when it is made, its errors naming the field."""
    with pytest.raises(InputError, match=msg) as e:
        compare_job("tiny-gpt", out_dir=tmp_path / "x", opts=CompareOptions(**change))
    assert "\n" not in str(e.value) and not (tmp_path / "x").exists()
