#!/usr/bin/env python
"""Solver benchmarks: build + solve time and peak memory of freezeopt's modes, written as Markdown.

    .venv/bin/python benchmarks/bench_solver.py --out benchmarks/solver.md     (what `make bench` runs)
    .venv/bin/python benchmarks/bench_solver.py --quick --out /tmp/solver.md   (smoke run, ~1 min)

Sections (see issue 2, item 7):

1. `lp` at 8×64 … 64×256 (stages × microbatches), 1F1B and ZBVZeroBubble, 4 groups per stage,
   CBC and HiGHS;
2. `milp` at 4×8, 8×32, 16×64 (1F1B) with 4 and 8 groups per stage, CBC beside HiGHS, and the
   `heuristic` mode at the same sizes;
3. TimelyFreeze's dense LP (`freezeopt.timelyfreeze`) beside our sparse `lp` on the same
   one-group-per-stage profile, where the dense matrix fits;
4. the issue's targets, PASS or MISS with the measured number.

Method: profiles are synthesised once per (schedule, size, groups) into a temporary folder; every
case then runs in a fresh single-threaded child process (`--case JSON`) that loads the profile,
builds the DAG, solves, and prints one JSON line, so peak RSS is that case's alone. Each child has
a timeout; a case that runs out of time is killed with its solver process and reported, and the
larger sizes of the same series are then reported as not run instead of being tried.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARK = "BENCH-RESULT "
SOLVER_LABEL = {"cbc": "CBC", "highs": "HiGHS"}
SCHEDULE_LABEL = {"1F1B": "1F1B", "ZBVZeroBubble": "ZBV"}

LP_SIZES = [(8, 64), (32, 128), (32, 256), (64, 256)]
LP_SCHEDULES = ["1F1B", "ZBVZeroBubble"]
LP_GROUPS = 4
MILP_SIZES = [(4, 8), (8, 32), (16, 64)]
MILP_GROUPS = [4, 8]
DENSE_SIZES = [(8, 64), (16, 64), (32, 128), (32, 256)]
SOLVERS = ["cbc", "highs"]
HEURISTIC_SOLVER = "highs"
MILP_GAP = 0.01
# Our sparse LP set up to be TimelyFreeze's (one group per stage, flat sensitivity, no budget).
TF_OPTS = {
    "mode": "lp",
    "budget": 1.0,
    "group_cap": 1.0,
    "stage_cap": 0.9,
    "sensitivity": "flat",
    "solver": "highs",
}
TARGET_LP = {"schedule": "1F1B", "size": (32, 256), "seconds": 5.0, "rss_mb": 500.0}
TARGET_MILP = {"size": (8, 32), "groups": 8, "gap": 0.01, "seconds": 30.0}


# ----------------------------------------------------------------------------------------------
# Child: one case, measured in a fresh process.
# ----------------------------------------------------------------------------------------------


def _dense_shape(dag: Any) -> tuple[int, int]:
    """Rows and columns of the dense matrix `solve_timelyfreeze_lp` builds, without building it."""
    n = len(dag.order)
    stages = {a.stage for a in dag.freezable()}
    return dag.graph.number_of_edges() + n + len(stages), 2 * n + 1


def _single_threaded_highspy() -> None:
    """Make every `highspy.Highs()` created from here on run with one thread, as our solves do."""
    import highspy

    base = highspy.Highs

    class _OneThread(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.setOptionValue("threads", 1)

    highspy.Highs = _OneThread  # type: ignore[misc]


class _SolverPeak(threading.Thread):
    """Polls the high-water RSS of this process's children (CBC runs as one) while they live.

    A child's `ru_maxrss` cannot be used for this: Linux carries the pre-`exec` high-water mark of
    the forked Python process over into it, so every CBC would look as large as its parent."""

    def __init__(self, every: float = 0.02):
        super().__init__(daemon=True)
        self.every, self.peak_kb = every, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        own = _exe(me)
        while not self._stop_event.wait(self.every):
            for pid in _descendants(me):
                if _exe(pid) not in (own, None):  # a fork not yet exec'd still looks like us
                    self.peak_kb = max(self.peak_kb, _status_kb(pid))

    def stop(self) -> int:
        self._stop_event.set()
        if self.is_alive():
            self.join()
        return self.peak_kb


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Run one case in this process and return what it measured."""
    poller = _SolverPeak()
    if case.get("opts", {}).get("solver") == "cbc":  # only CBC runs in a subprocess
        poller.start()
    from freezeopt.dag import build_dag
    from freezeopt.profile_file import load_profile

    t0 = time.perf_counter()
    profile = load_profile(case["profile"])
    dag = build_dag(profile)
    out: dict[str, Any] = {
        "actions": len(dag.order),
        "load_s": time.perf_counter() - t0,
    }
    if case["kind"] == "solve":
        from freezeopt.sensitivity import estimate_signal
        from freezeopt.solve import SolveOptions, solve

        opts = SolveOptions(**case["opts"])
        sig = estimate_signal(profile, opts.sensitivity)
        t1 = time.perf_counter()
        r = solve(dag, sig, opts)
        out.update(
            wall_s=time.perf_counter() - t1,
            status=r.status,
            baseline_ms=r.baseline_ms,
            all_frozen_ms=r.all_frozen_ms,
            lp_bound_ms=r.lp_bound_ms,
            predicted_ms=r.predicted_ms,
            gap=r.gap,
            signal_dropped=r.signal_dropped,
            solve_seconds=r.solve_seconds,
            timings=dict(r.timings),
            notes=list(r.notes),
        )
    elif case["kind"] == "dense":
        from freezeopt.timelyfreeze import solve_timelyfreeze_lp

        rows, cols = _dense_shape(dag)
        est = rows * cols * 8
        out.update(est_rows=rows, est_cols=cols, est_bytes=est)
        if est > case["max_bytes"]:
            out["skipped"] = True
        else:
            _single_threaded_highspy()
            t1 = time.perf_counter()
            tf = solve_timelyfreeze_lp(dag, stage_cap=case["stage_cap"])
            out.update(
                wall_s=time.perf_counter() - t1,
                status="optimal",
                makespan_ms=tf.makespan,
                n_rows=tf.n_rows,
                n_cols=tf.n_cols,
                dense_bytes=tf.dense_bytes,
            )
    else:
        raise ValueError(f"unknown case kind {case['kind']!r}")
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # CBC runs as a child process
    out.update(
        # VmHWM, not ru_maxrss: ru_maxrss of an exec'd process starts at its parent's high-water
        # mark (the benchmark driver's, which has imported torch for synth).
        rss_self_kb=_status_kb(os.getpid()) or me.ru_maxrss,
        rss_children_kb=poller.stop(),
        ru_maxrss_kb=me.ru_maxrss,
        cpu_s=me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
    )
    return out


def child_main(case_json: str) -> int:
    case = json.loads(case_json)
    try:
        out = run_case(case)
    except Exception as e:  # report, don't crash: the parent puts it in the table
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    sys.stdout.flush()
    print(MARK + json.dumps(out), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------
# Parent: profiles, child processes, timeouts.
# ----------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _status_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int] | None:
    """Direct children of `pid` from /proc/PID/task/*/children, or None where the kernel lacks it."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    for t in tasks:
        try:
            out += [int(c) for c in (t / "children").read_text().split()]
        except FileNotFoundError:
            if t.exists():
                return None
        except (OSError, ValueError):
            continue
    return out


def _descendants(pid: int) -> list[int]:
    first = _children(pid)
    if first is not None:
        out, stack = [], list(first)
        while stack:
            c = stack.pop()
            out.append(c)
            stack += _children(c) or []
        return out
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(d.name))
    out, stack = [], [pid]
    while stack:
        for c in parents.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


class Runner:
    """Synthesises profiles on demand and runs cases in child processes."""

    def __init__(self, workdir: Path, *, deadline: float):
        self.workdir = workdir
        self.deadline = deadline
        self.profiles: dict[tuple[str, int, int, int], Path] = {}
        self.synth_seconds: dict[str, float] = {}
        self.solver_tmp = workdir / "solver-tmp"
        self.solver_tmp.mkdir(exist_ok=True)

    def profile(self, schedule: str, stages: int, mb: int, groups: int) -> Path:
        key = (schedule, stages, mb, groups)
        if key not in self.profiles:
            from freezeopt.profile_file import save_profile
            from freezeopt.synth import SynthOptions, synth_profile

            spr = 2 if schedule == "ZBVZeroBubble" else 1
            path = self.workdir / f"{schedule}-{stages}x{mb}-g{groups}.json"
            t0 = time.perf_counter()
            p = synth_profile(
                SynthOptions(
                    schedule=schedule,
                    ranks=stages // spr,
                    stages_per_rank=spr,
                    microbatches=mb,
                    groups=groups,
                    seed=0,
                    trace_steps=2,
                )
            )
            save_profile(p, path)
            took = time.perf_counter() - t0
            self.synth_seconds[path.stem] = took
            log(f"synthesised {path.name} in {took:.1f} s")
            self.profiles[key] = path
        return self.profiles[key]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, case: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run `case` in a child; returns its measurements plus `outcome` (ok/timeout/error)."""
        case = dict(case)
        try:
            case["profile"] = str(self.profile(*case.pop("spec")))
        except Exception as e:  # a schedule torch refuses at this size, say
            return {"outcome": "error", "error": f"synth failed: {type(e).__name__}: {e}"}
        env = dict(os.environ)
        env.update(
            OMP_NUM_THREADS="1",
            OPENBLAS_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            TMPDIR=str(self.solver_tmp),
        )
        cmd = [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(case)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,  # its own process group: a timeout kills the solver too
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            py_kb, own = _status_kb(proc.pid), _exe(proc.pid)
            kids_kb = max(
                (_status_kb(p) for p in _descendants(proc.pid) if _exe(p) not in (own, None)),
                default=0,
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {
                "outcome": "timeout",
                "timeout_s": timeout,
                "rss_self_kb": py_kb,
                "rss_children_kb": kids_kb,
                "parent_wall_s": time.perf_counter() - t0,
            }
        res: dict[str, Any] = {"parent_wall_s": time.perf_counter() - t0}
        lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
        if proc.returncode != 0 or not lines:
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            res.update(outcome="error", error=f"exit {proc.returncode}: {tail}")
            return res
        res.update(json.loads(lines[-1][len(MARK) :]))
        res["outcome"] = "error" if "error" in res else "ok"
        return res


# ----------------------------------------------------------------------------------------------
# The cases.
# ----------------------------------------------------------------------------------------------


def _n_actions(schedule: str, size: tuple[int, int]) -> int:
    """Compute actions of a schedule: F and B per (stage, microbatch), or F, I and W (ZBV)."""
    return size[0] * size[1] * (3 if schedule == "ZBVZeroBubble" else 2)


def _size(s: tuple[int, int]) -> str:
    return f"{s[0]}×{s[1]}"


def _not_run(reason: str) -> dict[str, Any]:
    return {"outcome": "not_run", "reason": reason}


def _took(res: dict[str, Any] | None) -> float | None:
    if res and res.get("outcome") == "ok":
        return float(res.get("wall_s", res.get("parent_wall_s", 0.0)))
    return None


def _blocked(res: dict[str, Any] | None, size: tuple[int, int]) -> str | None:
    """Why a larger size of a series is not tried after `res` (at `size`), or None."""
    if res is None:
        return None
    if res["outcome"] == "timeout":
        return f"{_size(size)} already exceeded the {res['timeout_s']:.0f} s timeout"
    if res["outcome"] == "not_run":
        return res["reason"]
    if res["outcome"] == "error":
        return f"{_size(size)} failed"
    return None


def _clip_timeout(runner: Runner, want: float) -> float | None:
    left = runner.left()
    if left < 10:
        return None
    return min(want, left)


def bench_lp(runner: Runner, sizes: list[tuple[int, int]], timeout: float) -> dict:
    """Section 1: `lp` mode; key (schedule, size, solver)."""
    out: dict[tuple[str, tuple[int, int], str], dict[str, Any]] = {}
    for i, size in enumerate(sizes):
        for sched in LP_SCHEDULES:
            # HiGHS first: where it runs out of time, the slower solver is not tried at that size.
            for solver in ("highs", "cbc"):
                key = (sched, size, solver)
                prev = out.get((sched, sizes[i - 1], solver)) if i else None
                why = _blocked(prev, sizes[i - 1]) if i else None
                other = out.get((sched, size, "highs")) if solver == "cbc" else None
                if why is None and other is not None and other["outcome"] == "timeout" and i:
                    t_me = _took(prev)
                    t_other = _took(out.get((sched, sizes[i - 1], "highs")))
                    if t_me is not None and t_other is not None and t_me >= t_other:
                        why = (
                            f"HiGHS exceeded the {other['timeout_s']:.0f} s timeout here and CBC "
                            f"was {t_me / max(t_other, 1e-9):.1f}× slower at {_size(sizes[i - 1])}"
                        )
                t = _clip_timeout(runner, timeout)
                if why is None and t is None:
                    why = "the benchmark's time budget was spent"
                if why is not None:
                    out[key] = _not_run(why)
                    log(f"lp {sched} {_size(size)} {solver}: not run ({why})")
                    continue
                assert t is not None
                case = {
                    "kind": "solve",
                    "spec": [sched, size[0], size[1], LP_GROUPS],
                    # the solve's own time limit sits just above the harness timeout
                    "opts": {"mode": "lp", "solver": solver, "threads": 1, "time_limit": t + 5},
                }
                log(f"lp {sched} {_size(size)} {solver} (timeout {t:.0f} s) …")
                out[key] = runner.run(case, t)
                log(f"  → {_brief(out[key])}")
    return out


def bench_milp(
    runner: Runner, sizes: list[tuple[int, int]], time_limit: float, extra_timeout: float
) -> dict:
    """Section 2: `milp` (CBC, HiGHS) and `heuristic`; key (mode, size, groups, solver)."""
    out: dict[tuple[str, tuple[int, int], int, str], dict[str, Any]] = {}
    plan = [("milp", s) for s in SOLVERS] + [("heuristic", HEURISTIC_SOLVER)]
    for size in sizes:
        for groups in MILP_GROUPS:
            for mode, solver in plan:
                key = (mode, size, groups, solver)
                want = extra_timeout + (time_limit if mode == "milp" else 0.0)
                t = _clip_timeout(runner, want)
                if t is None:
                    out[key] = _not_run("the benchmark's time budget was spent")
                    continue
                opts: dict[str, Any] = {"mode": mode, "solver": solver, "threads": 1}
                if mode == "milp":
                    opts.update(time_limit=time_limit, gap=MILP_GAP)
                case = {"kind": "solve", "spec": ["1F1B", *size, groups], "opts": opts}
                log(f"{mode} {_size(size)} g{groups} {solver} (timeout {t:.0f} s) …")
                out[key] = runner.run(case, t)
                log(f"  → {_brief(out[key])}")
    return out


def bench_dense(
    runner: Runner, sizes: list[tuple[int, int]], timeout: float, max_bytes: float
) -> dict:
    """Section 3: TimelyFreeze's dense LP beside our sparse one; key (size, "dense"|"sparse")."""
    out: dict[tuple[tuple[int, int], str], dict[str, Any]] = {}
    for i, size in enumerate(sizes):
        spec = ["1F1B", *size, 1]
        for kind in ("dense", "sparse"):
            key = (size, kind)
            why = _blocked(out.get((sizes[i - 1], kind)), sizes[i - 1]) if i else None
            t = _clip_timeout(runner, timeout)
            if why is None and t is None:
                why = "the benchmark's time budget was spent"
            if why is not None:
                out[key] = _not_run(why)
                log(f"{kind} {_size(size)}: not run ({why})")
                if kind == "dense" and t is not None:
                    # Still say how large the dense matrix would be (shape only, nothing built).
                    est = runner.run(
                        {"kind": "dense", "spec": spec, "stage_cap": 0.9, "max_bytes": -1}, t
                    )
                    if est.get("est_bytes") is not None:
                        out[key]["est_bytes"] = est["est_bytes"]
                        out[key]["actions"] = est["actions"]
                continue
            assert t is not None
            if kind == "dense":
                case = {
                    "kind": "dense",
                    "spec": spec,
                    "stage_cap": TF_OPTS["stage_cap"],
                    "max_bytes": max_bytes,
                }
            else:
                case = {
                    "kind": "solve",
                    "spec": spec,
                    "opts": {**TF_OPTS, "threads": 1, "time_limit": t + 5},
                }
            log(f"{kind} LP {_size(size)} (timeout {t:.0f} s) …")
            out[key] = runner.run(case, t)
            log(f"  → {_brief(out[key])}")
    return out


def _brief(r: dict[str, Any]) -> str:
    if r["outcome"] == "ok":
        if r.get("skipped"):
            return f"skipped: dense matrix would need {_gib(r['est_bytes'])} GiB"
        return f"{r.get('status')} in {r.get('wall_s', 0):.2f} s, peak RSS {_rss_mb(r):.0f} MB"
    if r["outcome"] == "timeout":
        return f"timed out after {r['timeout_s']:.0f} s"
    return r.get("error") or r.get("reason", r["outcome"])


# ----------------------------------------------------------------------------------------------
# Markdown.
# ----------------------------------------------------------------------------------------------


def _gib(n_bytes: float) -> str:
    x = n_bytes / 2**30
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _rss_mb(r: dict[str, Any]) -> float:
    """Peak RSS in MB (10⁶ bytes): the Python process plus its largest solver child (CBC)."""
    return (r.get("rss_self_kb", 0) + r.get("rss_children_kb", 0)) * 1024 / 1e6


def _rss_cell(r: dict[str, Any]) -> str:
    total = _rss_mb(r)
    kids = r.get("rss_children_kb", 0) * 1024 / 1e6
    prefix = "≥ " if r["outcome"] == "timeout" else ""
    if kids >= 1:
        return f"{prefix}{total:.0f} (CBC {kids:.0f})"
    return f"{prefix}{total:.0f}"


def _f(x: Any, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _status_cell(r: dict[str, Any]) -> str:
    if r["outcome"] == "ok":
        return str(r.get("status"))
    if r["outcome"] == "timeout":
        return f"timeout: killed after {r['timeout_s']:.0f} s"
    if r["outcome"] == "not_run":
        return f"not run: {r['reason']}"
    return f"error: {r.get('error', '?')}".replace("|", "/")


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _cpu_note(results: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Flag any child whose CPU time exceeds its wall time (it was not single-threaded)."""
    notes = []
    for label, r in results:
        if r.get("outcome") == "ok" and r.get("cpu_s") and r.get("parent_wall_s"):
            ratio = r["cpu_s"] / r["parent_wall_s"]
            if ratio > 1.25:
                notes.append(f"- {label}: CPU time {ratio:.2f}× wall time (more than one thread).")
    return notes


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("freezeopt", "pulp", "highspy", "networkx", "numpy", "torch"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    return {"nproc": str(os.cpu_count() or "?"), "cpu": model, "ram": ram}


def _git() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "freezeopt"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return sha + (" (freezeopt/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _command() -> str:
    exe = sys.executable
    with contextlib.suppress(ValueError):
        rel = os.path.relpath(exe)
        if not rel.startswith(".."):
            exe = rel
    return shlex.join([exe, *sys.argv])


def render(
    *,
    args: argparse.Namespace,
    cfg: dict[str, Any],
    lp: dict,
    milp: dict,
    dense: dict,
    runner: Runner,
    started: str,
    wall: float,
) -> str:
    m, v = _machine(), _versions()
    L: list[str] = ["# Solver benchmarks", ""]
    if args.quick:
        L += ["**Quick smoke run (`--quick`): smallest sizes only, short MILP limit.**", ""]
    L += [
        "| | |",
        "|---|---|",
        f"| command | `{_command()}` |",
        f"| date | {started} |",
        f"| machine | nproc {m['nproc']}, {m['cpu']}, {m['ram']} RAM |",
        f"| versions | python {v['python']}, pulp {v['pulp']}, highspy {v['highspy']}, "
        f"networkx {v['networkx']}, numpy {v['numpy']}, torch {v['torch']} (synth only) |",
        f"| freezeopt | {v['freezeopt']}, commit {_git()} |",
        f"| wall time of this run | {wall / 60:.1f} min |",
        "",
        "Method: every case runs in a fresh child process that loads a synthetic profile "
        "(`freezeopt synth`, seed 0, 2 gradient-trace steps, other synth options default), builds "
        "the DAG and solves once; peak RSS is that child's high-water mark (`VmHWM` from "
        "/proc/self/status at its end — not `ru_maxrss`, which Linux starts at the parent's "
        "high-water mark across `exec`) plus the largest solver subprocess, polled every 20 ms "
        "(CBC runs as a separate process, shown in brackets; HiGHS runs in-process). MB = 10⁶ bytes. Children are single-threaded "
        "(`threads=1`, BLAS/OpenMP threads 1, HiGHS `threads=1` also for the dense LP). A child "
        "that exceeds its timeout is killed with its solver; its peak RSS is the high-water mark "
        "read from /proc just before (≥). After a timeout the larger sizes of the same series are "
        "not tried. Timings are single measurements, not medians.",
        "",
    ]

    # -- 1 -----------------------------------------------------------------------------------
    L += [
        "## 1. `lp` mode (continuous relaxation, both phases)",
        "",
        f'`SolveOptions(mode="lp", solver=…, threads=1)` with the defaults otherwise (budget 0.1, '
        f"group cap 0.75, sensitivity `gns`), {LP_GROUPS} groups per stage; 1F1B runs one stage "
        f'per rank, ZBV two (so 64 stages = 32 ranks). build s = `timings["build"]` (both '
        f'phases), solver s = `timings["solver"]`, total s = `solve_seconds` (also the three '
        f"simulations). Timeout per case: {cfg['lp_timeout']:.0f} s.",
        "",
    ]
    rows = []
    for sched in LP_SCHEDULES:
        for size in cfg["lp_sizes"]:
            for solver in SOLVERS:
                r = lp[(sched, size, solver)]
                ok = r["outcome"] == "ok"
                tm = r.get("timings", {})
                rows.append(
                    [
                        SCHEDULE_LABEL[sched],
                        _size(size),
                        str(r.get("actions", _n_actions(sched, size))),
                        SOLVER_LABEL[solver],
                        _f(tm.get("build"), ".2f") if ok else "—",
                        _f(tm.get("solver"), ".2f") if ok else "—",
                        _f(r.get("solve_seconds"), ".2f") if ok else "—",
                        _rss_cell(r) if r["outcome"] in ("ok", "timeout") else "—",
                        _f(r.get("baseline_ms"), ".1f"),
                        _f(r.get("lp_bound_ms"), ".1f"),
                        _f(r.get("predicted_ms"), ".1f"),
                        _status_cell(r),
                    ]
                )
    L += _table(
        [
            "schedule",
            "stages×mb",
            "actions",
            "solver",
            "build s",
            "solver s",
            "total s",
            "peak RSS MB",
            "baseline ms",
            "LP bound ms",
            "predicted ms",
            "status",
        ],
        rows,
    )
    L.append("")

    # -- 2 -----------------------------------------------------------------------------------
    L += [
        "## 2. `milp` and `heuristic` (1F1B)",
        "",
        f'`SolveOptions(mode="milp", time_limit={cfg["time_limit"]:g}, gap={MILP_GAP}, '
        f"solver=…, threads=1)`, budget 0.1, group cap 0.75, sensitivity `gns`. The time limit "
        f"covers the two MILP phases; seconds = `solve_seconds`, which also includes the LP "
        f"relaxation and the heuristic warm start. Gap to LP bound = (predicted − LP bound) / "
        f"predicted. Signal dropped is the share of one step's expected progress (budget 0.1). "
        f"Timeout per case: time limit + {cfg['extra_timeout']:.0f} s.",
        "",
    ]

    def milp_rows(mode: str, solvers: list[str]) -> list[list[str]]:
        rows = []
        for size in cfg["milp_sizes"]:
            for groups in MILP_GROUPS:
                for solver in solvers:
                    r = milp[(mode, size, groups, solver)]
                    ok = r["outcome"] == "ok"
                    rows.append(
                        [
                            _size(size),
                            str(groups),
                            SOLVER_LABEL[solver],
                            _status_cell(r),
                            _f(r.get("solve_seconds"), ".2f") if ok else "—",
                            _f(r.get("predicted_ms"), ".2f"),
                            _f(r.get("lp_bound_ms"), ".2f"),
                            _f(r["gap"] * 100, ".2f") if ok else "—",
                            _f(r.get("signal_dropped"), ".4f"),
                        ]
                    )
        return rows

    hdr = [
        "size",
        "groups",
        "solver",
        "status",
        "seconds",
        "predicted ms",
        "LP bound ms",
        "gap to LP bound %",
        "signal dropped",
    ]
    L += ["### `milp`", "", *_table(hdr, milp_rows("milp", SOLVERS)), ""]
    L += [
        "### `heuristic`",
        "",
        f"Same profiles; the LP it rounds is solved with {SOLVER_LABEL[HEURISTIC_SOLVER]}. "
        f"Timeout per case: {cfg['extra_timeout']:.0f} s.",
        "",
    ]
    L += [*_table(hdr, milp_rows("heuristic", [HEURISTIC_SOLVER])), ""]

    # -- 3 -----------------------------------------------------------------------------------
    L += [
        "## 3. TimelyFreeze's dense LP beside our sparse `lp` (1F1B, one group per stage)",
        "",
        "Dense: `freezeopt.timelyfreeze.solve_timelyfreeze_lp(dag, stage_cap=0.9)` — numpy dense "
        "constraint rows, then HiGHS through highspy; seconds = that call (build + solve). "
        'Sparse: `solve(dag, …, SolveOptions(mode="lp", budget=1.0, group_cap=1.0, '
        'stage_cap=0.9, sensitivity="flat", solver="highs"))`; seconds = `solve_seconds` '
        "(two LP phases and three simulations). Dense matrix = rows × cols × 8 bytes, estimated "
        f"before building; above {cfg['dense_max_gib']:g} GiB the dense LP is skipped. Makespans: "
        "the dense optimum and our phase-1 LP bound; they agree when the relative difference is "
        f"below 10⁻⁶. Timeout per case: {cfg['dense_timeout']:.0f} s.",
        "",
    ]
    rows = []
    for size in cfg["dense_sizes"]:
        d, s = dense[(size, "dense")], dense[(size, "sparse")]
        d_ok = d["outcome"] == "ok" and not d.get("skipped")
        s_ok = s["outcome"] == "ok"
        if d.get("est_bytes") is not None:
            gib_cell = _gib(d.get("dense_bytes", d["est_bytes"]))
        else:
            gib_cell = "—"
        if d_ok:
            d_time = f"{d['wall_s']:.2f}"
        elif d.get("skipped") or (d.get("est_bytes", 0) > cfg["dense_max_gib"] * 2**30):
            d_time = f"skipped: would need {_gib(d['est_bytes'])} GiB"
        else:
            d_time = _status_cell(d)
        agree = "—"
        if d_ok and s_ok:
            a, b = d["makespan_ms"], s["lp_bound_ms"]
            rel = abs(a - b) / max(abs(a), 1e-12)
            agree = f"yes ({rel:.0e})" if rel < 1e-6 else f"**NO** ({rel:.1e})"
        rows.append(
            [
                _size(size),
                str(s.get("actions", d.get("actions", _n_actions("1F1B", size)))),
                gib_cell,
                d_time,
                _rss_cell(d) if d_ok or d["outcome"] == "timeout" else "—",
                f"{s['solve_seconds']:.2f}" if s_ok else _status_cell(s),
                _rss_cell(s) if s["outcome"] in ("ok", "timeout") else "—",
                _f(d.get("makespan_ms"), ".3f"),
                _f(s.get("lp_bound_ms"), ".3f"),
                agree,
            ]
        )
    L += _table(
        [
            "size",
            "actions",
            "dense matrix GiB",
            "dense build+solve s",
            "dense peak RSS MB",
            "sparse s",
            "sparse peak RSS MB",
            "dense makespan ms",
            "sparse makespan ms",
            "agree",
        ],
        rows,
    )
    L.append("")

    # -- 4 -----------------------------------------------------------------------------------
    L += ["## 4. Targets (issue 2)", ""]
    rows = []
    t_size = TARGET_LP["size"]
    lp_target = (
        f"`lp` at {_size(t_size)} 1F1B in under {TARGET_LP['seconds']:g} s and "
        f"{TARGET_LP['rss_mb']:g} MB peak"
    )
    for solver in SOLVERS:
        r = lp.get((TARGET_LP["schedule"], t_size, solver))
        rows.append([lp_target, SOLVER_LABEL[solver], *_lp_verdict(r)])
    milp_target = (
        f"`milp` at {_size(TARGET_MILP['size'])} with {TARGET_MILP['groups']} groups per stage "
        f"within {TARGET_MILP['gap'] * 100:g} % gap in {TARGET_MILP['seconds']:g} s"
    )
    for solver in SOLVERS:
        r = milp.get(("milp", TARGET_MILP["size"], TARGET_MILP["groups"], solver))
        rows.append([milp_target, SOLVER_LABEL[solver], *_milp_verdict(r, cfg)])
    L += _table(["target", "solver", "measured", "verdict"], rows)
    L += [
        "",
        "Gap is measured against the LP bound (the solver's own bound is tighter, so this gap is "
        "an upper bound on the true one); seconds are the whole `solve` call.",
        "",
    ]

    # -- notes -----------------------------------------------------------------------------------
    labelled = (
        [(f"lp {k[0]} {_size(k[1])} {k[2]}", r) for k, r in lp.items()]
        + [(f"{k[0]} {_size(k[1])} g{k[2]} {k[3]}", r) for k, r in milp.items()]
        + [(f"{k[1]} {_size(k[0])}", r) for k, r in dense.items()]
    )
    notes = _cpu_note(labelled)
    said: dict[str, list[str]] = {}
    for label, r in labelled:
        for n in r.get("notes", []) if r.get("outcome") == "ok" else []:
            said.setdefault(n, []).append(label)
    for n, labels in said.items():
        notes.append(f"- Solver note “{n}” — {', '.join(labels)}.")
        if r.get("dense_bytes") is not None and r.get("est_bytes") != r["dense_bytes"]:
            notes.append(
                f"- {label}: estimated {r['est_bytes']} bytes but the dense LP built "
                f"{r['dense_bytes']}."
            )
    synth = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(runner.synth_seconds.items()))
    L += ["## Notes", ""]
    L += notes or ["- No solver notes; every finished child used at most one CPU on average."]
    L += [f"- Profile synthesis (not part of any case): {synth or 'none'}.", ""]
    return "\n".join(L)


def _lp_verdict(r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return ["not measured (not in this run's sizes)", "—"]
    if r["outcome"] == "ok":
        secs, rss = r["solve_seconds"], _rss_mb(r)
        ok = secs < TARGET_LP["seconds"] and rss < TARGET_LP["rss_mb"]
        return [f"{secs:.2f} s, {rss:.0f} MB", "PASS" if ok else "MISS"]
    if r["outcome"] == "timeout":
        return [
            f"did not finish in {r['timeout_s']:.0f} s (peak RSS ≥ {_rss_mb(r):.0f} MB when killed)",
            "MISS",
        ]
    if r["outcome"] == "not_run":
        return [f"not measured: {r['reason']}", "MISS (inferred from the smaller size)"]
    return [f"error: {r.get('error')}", "MISS"]


def _milp_verdict(r: dict[str, Any] | None, cfg: dict[str, Any]) -> list[str]:
    if r is None:
        return ["not measured (not in this run's sizes)", "—"]
    if r["outcome"] != "ok":
        return [_status_cell(r), "MISS"]
    gap, secs = r["gap"], r["solve_seconds"]
    desc = f"gap {gap * 100:.2f} %, {secs:.1f} s, status {r['status']}"
    if cfg["time_limit"] != TARGET_MILP["seconds"]:
        return [desc + f" (time limit {cfg['time_limit']:g} s, not the target's)", "—"]
    gap_ok, time_ok = gap <= TARGET_MILP["gap"], secs <= TARGET_MILP["seconds"]
    if gap_ok and time_ok:
        return [desc, "PASS"]
    why = []
    if not gap_ok:
        why.append("gap")
    if not time_ok:
        why.append("time")
    return [desc, f"MISS ({' and '.join(why)})"]


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "solver.md")
    ap.add_argument("--quick", action="store_true", help="smallest sizes only (smoke run)")
    ap.add_argument("--lp-timeout", type=float, default=60.0, help="seconds per lp case")
    ap.add_argument(
        "--milp-time-limit",
        type=float,
        default=None,
        help="MILP time limit (default 30 s; 2 s with --quick)",
    )
    ap.add_argument(
        "--extra-timeout",
        type=float,
        default=150.0,
        help="seconds per milp case beyond its time limit, and per heuristic case",
    )
    ap.add_argument(
        "--dense-timeout", type=float, default=60.0, help="seconds per dense/sparse case"
    )
    ap.add_argument("--dense-max-gib", type=float, default=6.0, help="skip dense LPs above this")
    ap.add_argument(
        "--max-minutes", type=float, default=20.0, help="cases after this are reported as not run"
    )
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case is not None:
        return child_main(args.case)

    cfg: dict[str, Any] = {
        "lp_sizes": LP_SIZES[:1] if args.quick else LP_SIZES,
        "milp_sizes": MILP_SIZES[:1] if args.quick else MILP_SIZES,
        "dense_sizes": DENSE_SIZES[:1] if args.quick else DENSE_SIZES,
        "time_limit": args.milp_time_limit or (2.0 if args.quick else 30.0),
        "lp_timeout": args.lp_timeout,
        "extra_timeout": args.extra_timeout,
        "dense_timeout": args.dense_timeout,
        "dense_max_gib": args.dense_max_gib,
    }
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="freezeopt-bench-") as tmp:
        runner = Runner(Path(tmp), deadline=t0 + args.max_minutes * 60)
        lp = bench_lp(runner, cfg["lp_sizes"], cfg["lp_timeout"])
        milp = bench_milp(runner, cfg["milp_sizes"], cfg["time_limit"], cfg["extra_timeout"])
        dense = bench_dense(
            runner, cfg["dense_sizes"], cfg["dense_timeout"], cfg["dense_max_gib"] * 2**30
        )
        text = render(
            args=args,
            cfg=cfg,
            lp=lp,
            milp=milp,
            dense=dense,
            runner=runner,
            started=started,
            wall=time.monotonic() - t0,
        )
    from freezeopt.fileio import atomic_write_text

    atomic_write_text(args.out, text)
    log(f"wrote {args.out} ({(time.monotonic() - t0) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
