"""A run folder as tracking sees it: parameters, per-step scalars, events, texts and artifacts.

Pure reading: `read_run` turns a `freezeopt train` run folder (`metrics.jsonl`, `events.jsonl`,
`report.json`, `schedule.yaml`, `replans/`) into a `TrackedRun`, and `read_compare` a `freezeopt
compare` report folder into a parent run with one child per trained run. The stores
(`freezeopt.tracking.mlflow_store`, `freezeopt.tracking.tensorboard_store`) only write what this
module read, so both show the same numbers, and a run is logged the same way whether it was
tracked as it ended or later with `freezeopt track`.

Per-step scalars: `loss`, `val_loss`, `step_ms` (measured), `predicted_step_ms` (the plan in
effect: the schedule's prediction in freezing steps, its no-freeze baseline in full-update
steps, a re-plan's own prediction from the step it took over), `frozen_share` (the share of
stage × group × microbatch cells the plan in effect freezes; 0 in full-update steps),
`optimizer_ms`, `grad_norm/<stage>/<group>` and `events/<kind>` (how many events of each kind —
drift, rollback, replan, … — happened up to that step).
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from freezeopt import __version__
from freezeopt.errors import InputError
from freezeopt.fileio import read_text_file
from freezeopt.formats.schedule import Schedule, load_schedule, parse_microbatches, schedule_sha256

__all__ = [
    "Artifact",
    "Scalar",
    "TrackedRun",
    "frozen_share",
    "read_compare",
    "read_run",
    "schedule_file",
]

_MAX_LOG = 256 * 2**20
"""The largest metrics or events file read (bytes)."""

SUMMARY = (
    "step_ms",
    "full_step_ms",
    "predicted_step_ms",
    "predicted_baseline_ms",
    "measured_speedup",
    "predicted_speedup",
    "prediction_error",
    "loss",
    "val_loss",
    "fallbacks",
    "rollbacks",
    "replans",
    "wall_s",
)
"""The report's figures logged once, at the run's last step, under `run/<name>`."""


@dataclass(frozen=True)
class Scalar:
    key: str
    step: int
    value: float


@dataclass(frozen=True)
class Artifact:
    """A file to attach, under the store's `folder` ("" for the top)."""

    path: Path
    folder: str = ""


@dataclass(frozen=True)
class TrackedRun:
    """What one store entry holds. `status` is FINISHED or FAILED (the run raised: its files
    hold the steps it ran)."""

    name: str
    params: tuple[tuple[str, str], ...]
    scalars: tuple[Scalar, ...]
    texts: tuple[tuple[str, str], ...]
    """(title, markdown) pairs: the events, the schedule, the report."""
    artifacts: tuple[Artifact, ...]
    status: str = "FINISHED"
    tags: tuple[tuple[str, str], ...] = ()
    children: tuple[TrackedRun, ...] = ()


def read_run(
    run_dir: Path,
    *,
    name: str | None = None,
    status: str = "FINISHED",
    with_report: bool = True,
    gantt: Path | None = None,
) -> TrackedRun:
    """The tracked form of the run in `run_dir` (`name`: its job's, else the folder's), ended
    with `status` (FINISHED or FAILED);
    `with_report` False leaves out a `report.json` that is not this run's (a resumed run that
    crashed left its predecessor's); `gantt` a chart to attach."""
    run_dir = Path(run_dir)
    records = _jsonl(run_dir / "metrics.jsonl", "metrics")
    events = (
        _jsonl(run_dir / "events.jsonl", "events") if (run_dir / "events.jsonl").exists() else []
    )
    report = (
        _json(run_dir / "report.json")
        if with_report and (run_dir / "report.json").exists()
        else None
    )
    schedule_path = _schedule_path(run_dir, report)
    schedule = None if schedule_path is None else load_schedule(schedule_path)
    replans = {
        int(e["step"]): _replan_schedule(run_dir, e) for e in events if e.get("event") == "replan"
    }
    scalars = [*_step_scalars(records, events, schedule, replans)]
    if report is not None:
        last = int(report.get("end_step", max((r["step"] for r in records), default=0)))
        scalars += [
            Scalar(f"run/{k}", last, float(report[k]))
            for k in SUMMARY
            if isinstance(report.get(k), int | float) and not isinstance(report.get(k), bool)
        ]
    params = _params(run_dir, report, schedule, schedule_path)
    texts = [("events", _events_markdown(events))]
    artifacts = [Artifact(run_dir / "metrics.jsonl", "logs")]
    if events:
        artifacts.append(Artifact(run_dir / "events.jsonl", "logs"))
    if schedule_path is not None:
        text = schedule_path.read_text()
        texts.append(("schedule", f"```yaml\n{text}```"))
        artifacts.append(Artifact(schedule_path, ""))
    if report is not None:
        texts.append(("report", "```json\n" + json.dumps(_brief(report), indent=1) + "\n```"))
        artifacts.append(Artifact(run_dir / "report.json", ""))
    if (run_dir / "actions.json").exists():
        artifacts.append(Artifact(run_dir / "actions.json", "logs"))
    artifacts += [Artifact(p, "replans") for p in sorted((run_dir / "replans").glob("*.yaml"))]
    if gantt is not None:
        artifacts.append(Artifact(gantt, ""))
    return TrackedRun(
        name=name or (report or {}).get("job") or run_dir.name,
        params=tuple(sorted(params.items())),
        scalars=tuple(scalars),
        texts=tuple(texts),
        artifacts=tuple(artifacts),
        status=status,
        tags=(("freezeopt.run_dir", str(run_dir)),),
    )


def read_compare(out_dir: Path) -> TrackedRun:
    """A `freezeopt compare` folder: the comparison as the parent (its options and, per policy,
    its results as metrics `<policy>/<figure>`), each trained run as a child."""
    out_dir = Path(out_dir)
    results = _json(out_dir / "results.json")
    options = results.get("options", {})
    params = {f"compare.{k}": _param(v) for k, v in sorted(options.items())}
    params.update({"job": str(results.get("job", "")), "freezeopt": __version__})
    info = results.get("run_info", {})
    for key in ("command", "started"):
        if key in info:
            params[key] = _param(info[key])
    scalars = []
    for row in results.get("results", []):
        policy = _key(str(row.get("policy", "?")))
        for k, v in sorted(row.items()):
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                scalars.append(Scalar(f"{policy}/{_key(k)}", 0, float(v)))
    artifacts = [
        Artifact(out_dir / n, "")
        for n in ("report.md", "results.json", "profile.json")
        if (out_dir / n).exists()
    ]
    artifacts += [Artifact(p, "figures") for p in sorted(out_dir.glob("*.png"))]
    artifacts += [Artifact(p, "schedules") for p in sorted((out_dir / "schedules").glob("*.yaml"))]
    texts = []
    if (out_dir / "report.md").exists():
        texts.append(("report", (out_dir / "report.md").read_text()))
    children = (
        tuple(
            read_run(d, name=d.name)
            for d in sorted((out_dir / "runs").iterdir())
            if (d / "metrics.jsonl").exists()
        )
        if (out_dir / "runs").is_dir()
        else ()
    )
    return TrackedRun(
        name=f"compare {results.get('job', out_dir.name)}",
        params=tuple(sorted(params.items())),
        scalars=tuple(scalars),
        texts=tuple(texts),
        artifacts=tuple(artifacts),
        tags=(("freezeopt.run_dir", str(out_dir)),),
        children=children,
    )


def frozen_share(schedule: Schedule) -> float:
    """The share of (stage, group, microbatch) cells the schedule freezes."""
    p = schedule.pipeline
    cells = sum(len(g) for g in p.groups) * p.n_microbatches
    frozen = sum(
        len(parse_microbatches(mbs, p.n_microbatches))
        for groups in schedule.frozen.values()
        for mbs in groups.values()
    )
    return frozen / cells if cells else 0.0


def _step_scalars(
    records: list[dict[str, Any]],
    events: list[dict[str, Any]],
    schedule: Schedule | None,
    replans: dict[int, Schedule | None],
) -> list[Scalar]:
    out: list[Scalar] = []
    plan, share = _plan_figures(schedule)
    baseline = None if schedule is None else schedule.prediction.baseline_ms
    adopted = sorted(replans)
    for rec in sorted(records, key=lambda r: int(r["step"])):
        step = int(rec["step"])
        while adopted and adopted[0] <= step:
            new = replans[adopted.pop(0)]
            if new is not None:
                plan, share = _plan_figures(new)
        if "val_loss" in rec:
            out.append(Scalar("val_loss", step, _float(rec["val_loss"])))
        if "loss" not in rec:
            continue
        freezing = bool(rec.get("freezing"))
        for k in ("loss", "step_ms", "optimizer_ms"):
            if k in rec:
                out.append(Scalar(k, step, _float(rec[k])))
        if schedule is not None:
            predicted = plan if freezing else baseline
            if predicted is not None:
                out.append(Scalar("predicted_step_ms", step, float(predicted)))
            out.append(Scalar("frozen_share", step, share if freezing else 0.0))
        for g, v in sorted(rec.get("grad_norms", {}).items()):
            out.append(Scalar(f"grad_norm/{_key(g)}", step, _float(v)))
    counts: dict[str, int] = {}
    for ev in sorted(events, key=lambda e: int(e.get("step", 0))):
        kind = _key(str(ev.get("event", "event")))
        counts[kind] = counts.get(kind, 0) + 1
        out.append(Scalar(f"events/{kind}", int(ev.get("step", 0)), float(counts[kind])))
    return out


def _plan_figures(schedule: Schedule | None) -> tuple[float | None, float]:
    if schedule is None:
        return None, 0.0
    return schedule.prediction.predicted_ms, frozen_share(schedule)


def _replan_schedule(run_dir: Path, event: dict[str, Any]) -> Schedule | None:
    """The schedule a re-plan switched to (None when its file is gone)."""
    path = run_dir / "replans" / Path(str(event.get("file", ""))).name
    return load_schedule(path) if path.is_file() else None


def schedule_file(run_dir: Path) -> Path | None:
    """The schedule the run in `run_dir` replayed: the copy in the folder (as the run used it,
    phase overrides applied), else the file its report names (None: it trained without one)."""
    run_dir = Path(run_dir)
    report = _json(run_dir / "report.json") if (run_dir / "report.json").is_file() else None
    return _schedule_path(run_dir, report)


def _schedule_path(run_dir: Path, report: dict[str, Any] | None) -> Path | None:
    if (run_dir / "schedule.yaml").is_file():
        return run_dir / "schedule.yaml"
    named = (report or {}).get("schedule")
    return Path(named) if named and Path(named).is_file() else None


def _params(
    run_dir: Path,
    report: dict[str, Any] | None,
    schedule: Schedule | None,
    schedule_path: Path | None,
) -> dict[str, str]:
    out: dict[str, str] = {"freezeopt": __version__, "python": platform.python_version()}
    for dist in ("torch", "transformers"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    keys = (
        "job",
        "pipeline",
        "world_size",
        "n_stages",
        "n_microbatches",
        "device",
        "start_step",
        "end_step",
    )
    for k in keys:
        if report is not None and report.get(k) is not None:
            out[k] = _param(report[k])
    if schedule is None:
        out["schedule"] = "none (no freezing)"
        return out
    assert schedule_path is not None
    out["schedule"] = str((report or {}).get("schedule") or schedule_path)
    out["schedule_sha256"] = schedule_sha256(schedule_path.read_text())
    pv = schedule.provenance
    for k in ("mode", "solver", "sensitivity", "budget", "group_cap", "profile_source"):
        out[f"solve.{k}"] = _param(getattr(pv, k))
    out["solve.profile_sha256"] = pv.profile_sha256
    ph = schedule.phases
    out["phases.warmup_steps"] = str(ph.warmup_steps)
    out["phases.full_update_every"] = str(ph.full_update_every)
    out["phases.full_update_steps"] = str(ph.full_update_steps)
    out["pipeline"] = out.get("pipeline", schedule.pipeline.schedule)
    out["frozen_share"] = f"{frozen_share(schedule):.4f}"
    out["predicted_speedup"] = (
        f"{schedule.prediction.baseline_ms / schedule.prediction.predicted_ms:.4f}"
        if schedule.prediction.predicted_ms > 0
        else "inf"
    )
    return out


def _events_markdown(events: list[dict[str, Any]]) -> str:
    if not events:
        return "no events"
    lines = []
    for ev in events:
        rest = ", ".join(
            f"{k}={_param(v)}" for k, v in sorted(ev.items()) if k not in ("step", "event")
        )
        lines.append(f"- step {ev.get('step')}: **{ev.get('event')}** {rest}".rstrip())
    return "\n".join(lines)


def _brief(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its long per-step lists (they are the scalars)."""
    return {
        k: v for k, v in report.items() if k not in ("losses", "val_losses", "events", "actions")
    }


_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")


def _key(text: str) -> str:
    """A metric name MLflow accepts (letters, digits, `_-./` and spaces)."""
    return _KEY_CHARS.sub("_", text)


def _param(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 6000 else text[:5997] + "..."


def _float(v: Any) -> float:
    """A figure as the logs hold it: a number, or a non-finite one as a string ("nan")."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _json(path: Path) -> dict[str, Any]:
    text = read_text_file(
        path, what="run file", limit=_MAX_LOG, missing_hint="is this a run folder?"
    )
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InputError(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def _jsonl(path: Path, what: str) -> list[dict[str, Any]]:
    hint = (
        f"{path.parent} is not a freezeopt run folder (`freezeopt train --out-dir` writes one)"
        if what == "metrics"
        else "is this a run folder?"
    )
    text = read_text_file(
        path, what=f"{what} log", limit=_MAX_LOG, missing_hint=hint, empty_hint=hint
    )
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise InputError(f"{path}:{i}: not a JSON line; the run folder is damaged") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step", 0), int):
            raise InputError(f"{path}:{i}: expected an object with an integer step")
        out.append(rec)
    return out
