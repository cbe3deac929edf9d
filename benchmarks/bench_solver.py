#!/usr/bin/env python
"""Solver benchmarks: build + solve time and peak memory of freezeopt's modes, written as Markdown.

    .venv/bin/python benchmarks/bench_solver.py --out benchmarks/solver-latest.md  (what `make bench` runs;
        benchmarks/solver.md keeps the runs so far, each copied in with what it measured)
    .venv/bin/python benchmarks/bench_solver.py --quick --out /tmp/solver.md   (smoke run, ~1 min)
    .venv/bin/python benchmarks/bench_solver.py --sections lp --sizes 32x128 --schedules 1F1B \
        --groups 4 --out /tmp/solver.md                                         (a subset)

Sections (issue 6, item 4):

1. the exact `lp` side by side, in one run: the array-built LP (`freezeopt.solver.lp_arrays`, what
   `--solver highs` runs) cold and warm (re-solved after a 5 % change in some stages' costs), the
   `heuristic` mode on it, and the plain PuLP LP with HiGHS and with CBC where it fits in its
   timeout; 8×64 … 64×256 (stages × microbatches), 1F1B, Interleaved1F1B and ZBVZeroBubble, 4 and
   8 groups per stage;
2. `milp` at 4×8, 8×32, 16×64 (1F1B) with 4 and 8 groups per stage, CBC beside HiGHS, and the
   `heuristic` mode at the same sizes;
3. TimelyFreeze's dense LP (`freezeopt.compare.timelyfreeze`) beside our `lp` on the same
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
import itertools
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
PARTIAL = "BENCH-PARTIAL "  # a child's results so far, used if it is killed later
SOLVER_LABEL = {"cbc": "CBC", "highs": "HiGHS"}
SCHEDULE_LABEL = {"1F1B": "1F1B", "Interleaved1F1B": "Interleaved1F1B", "ZBVZeroBubble": "ZBV"}
MULTI_STAGE = ("Interleaved1F1B", "ZBVZeroBubble")  # two stages per rank

LP_SIZES = [(8, 64), (32, 128), (32, 256), (64, 256)]
LP_SCHEDULES = ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"]
LP_GROUPS = [4, 8]
LP_SIZES_MORE_GROUPS = [(32, 128), (64, 256)]  # the default run's sizes with 8 groups
LP_METHODS = ["fast", "heuristic", "heuristic-2s", "pulp-highs", "pulp-cbc"]
LP_METHODS_MORE = ["heuristic-10s", "heuristic-10s-rank"]  # run only when --methods names them
HEUR_10S = 10.0
METHOD_LABEL = {
    "fast": "lp, arrays → HiGHS",
    "warm": "lp, warm re-solve",
    "heuristic": "heuristic",
    "heuristic-2s": "heuristic, 2 s limit",
    "heuristic-10s": "heuristic, 10 s limit",
    "heuristic-10s-rank": "heuristic, 10 s limit, no first-order relaxation",
    "pulp-highs": "lp, PuLP → HiGHS",
    "pulp-cbc": "lp, PuLP → CBC",
}
WARM_EVERY = 8  # the warm re-solve scales the costs of every 8th stage (0, 8, 16, …)
WARM_CHANGE = 0.05
MILP_SIZES = [(4, 8), (8, 32), (16, 64)]
MILP_GROUPS = [4, 8]
LP_SIZES_MORE_GROUPS = [(32, 128), (64, 256)]  # the default run's sizes with 8 groups
DENSE_SIZES = [(8, 64), (16, 64), (32, 128), (32, 256)]
SOLVERS = ["cbc", "highs"]
HEURISTIC_SOLVER = "highs"
MILP_GAP = 0.005
# Our sparse LP set up to be TimelyFreeze's (one group per stage, flat sensitivity, no budget).
TF_OPTS = {
    "mode": "lp",
    "budget": 1.0,
    "group_cap": 1.0,
    "stage_cap": 0.9,
    "sensitivity": "flat",
    "solver": "highs",
}
TARGET_LP_BIG: dict[str, Any] = {
    "schedule": "ZBVZeroBubble",
    "size": (64, 256),
    "seconds": 5.0,
    "rss_mb": 1000.0,
}
TARGET_LP_MID: dict[str, Any] = {"size": (32, 128), "seconds": 0.5}
TARGET_WARM: dict[str, Any] = {"size": (32, 128), "seconds": 0.2}
TARGET_HEUR: dict[str, Any] = {"size": (64, 256), "gap": 0.02, "seconds": 2.0}
TARGET_MILP: dict[str, Any] = {"size": (16, 64), "groups": 8, "gap": 0.005, "seconds": 30.0}


# ----------------------------------------------------------------------------------------------
# Child: one case, measured in a fresh process.
# ----------------------------------------------------------------------------------------------


def _relax_share() -> float:
    from freezeopt.solver.time_limits import RELAX_SHARE

    return RELAX_SHARE


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


def synthetic_profile(schedule: str, stages: int, mb: int, groups: int) -> Any:
    """The benchmarks' synthetic profile: seed 0, 2 gradient-trace steps, two stages per rank for
    multi-stage schedules, other `freezeopt synth` options default."""
    from freezeopt.profiling.synth import SynthOptions, synth_profile

    spr = 2 if schedule in MULTI_STAGE else 1
    return synth_profile(
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


def _perturbed(dag: Any) -> Any:
    """The same schedule with every `WARM_EVERY`-th stage's action and group costs × 1.05."""
    import dataclasses

    f = {s: 1 + WARM_CHANGE for s in range(0, dag.n_stages, WARM_EVERY)}
    cost = {a: c * f.get(a.stage, 1.0) for a, c in dag.cost.items()}
    group_cost = tuple(
        tuple(c * f.get(s, 1.0) for c in row) for s, row in enumerate(dag.group_cost)
    )
    return dataclasses.replace(dag, cost=cost, group_cost=group_cost)


def _run_fast(case: dict[str, Any], profile: Any, dag: Any) -> dict[str, Any]:
    """The array-built LP cold, then warm after a cost change, then (optionally) cold on the new
    costs to check that the warm answer is the cold one."""
    from freezeopt.model.sensitivity import estimate_signal
    from freezeopt.solver import FreezeProblem, SolveOptions
    from freezeopt.solver.lp_arrays import FastLP

    opts = SolveOptions(**case["opts"])
    sig = estimate_signal(profile, opts.sensitivity)
    t0 = time.perf_counter()
    c0 = time.process_time()
    lp = FastLP.for_problem(FreezeProblem(dag, sig, opts))
    a = lp.solve(time_limit=opts.time_limit)
    out: dict[str, Any] = {
        "wall_s": time.perf_counter() - t0,
        "cpu_solve_s": time.process_time() - c0,
        "status": "optimal",
        "lp_bound_ms": a.t1,
        "signal_dropped": a.signal,
        "timings": {"build": a.build_seconds, "solver": a.solver_seconds},
        "pivots": list(a.iterations),
        "method": a.method,
        "size": dict(lp.info),
    }
    partial = {**out, "actions": len(dag.order), "rss_self_kb": _status_kb(os.getpid())}
    print(PARTIAL + json.dumps(partial), flush=True)
    dag2 = _perturbed(dag)
    t1 = time.perf_counter()
    c1 = time.process_time()
    b = lp.resolve(dag2, time_limit=opts.time_limit)
    out["warm"] = {
        "wall_s": time.perf_counter() - t1,
        "cpu_s": time.process_time() - c1,
        "update_s": b.build_seconds,
        "solver_s": b.solver_seconds,
        "pivots": list(b.iterations),
        "lp_bound_ms": b.t1,
        "signal_dropped": b.signal,
        "stages_changed": len(range(0, dag.n_stages, WARM_EVERY)),
    }
    if case.get("check_warm"):
        c = FastLP.for_problem(FreezeProblem(dag2, sig, opts)).solve(time_limit=opts.time_limit)
        out["warm"]["cold_lp_bound_ms"] = c.t1
        out["warm"]["cold_signal_dropped"] = c.signal
    return out


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Run one case in this process and return what it measured."""
    poller = _SolverPeak()
    if case.get("opts", {}).get("solver") == "cbc":  # only CBC runs in a subprocess
        poller.start()
    from freezeopt.formats.profile import load_profile
    from freezeopt.model.dag import build_dag

    t0 = time.perf_counter()
    profile = load_profile(case["profile"])
    dag = build_dag(profile)
    out: dict[str, Any] = {
        "actions": len(dag.order),
        "load_s": time.perf_counter() - t0,
    }
    if case["kind"] == "solve":
        from freezeopt.model.sensitivity import estimate_signal
        from freezeopt.solver import SolveOptions, solve

        opts = SolveOptions(**case["opts"])
        sig = estimate_signal(profile, opts.sensitivity)
        if case.get("load_passes"):  # once per process, as a training run's re-plans pay it
            from freezeopt.solver import load_kernels

            load_kernels()
        if case.get(
            "no_relax"
        ):  # the LP-free path as before freezeopt.solver.relax: rank-load only
            import freezeopt.solver.modes

            freezeopt.solver.modes.RELAX_ITERATIONS = 10**12
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
    elif case["kind"] == "fast":
        out.update(_run_fast(case, profile, dag))
    elif case["kind"] == "plain":
        from freezeopt.model.sensitivity import estimate_signal
        from freezeopt.solver import FreezeProblem, SolveOptions
        from freezeopt.solver.problem import Spent
        from freezeopt.solver.pulp_model import PulpModel

        opts = SolveOptions(**case["opts"])
        sig = estimate_signal(profile, opts.sensitivity)
        t1 = time.perf_counter()
        problem, spent = FreezeProblem(dag, sig, opts), Spent()
        lp1, plan = PulpModel(problem, spent).solve_lp(t1 + opts.time_limit, write=None)
        out.update(
            wall_s=time.perf_counter() - t1,
            status="optimal",
            lp_bound_ms=lp1,
            signal_dropped=problem.signal_of(plan),
            timings={"build": spent.build, "solver": spent.solver},
        )
    elif case["kind"] == "dense":
        from freezeopt.compare.timelyfreeze import solve_timelyfreeze_lp

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
            from freezeopt.formats.profile import save_profile

            path = self.workdir / f"{schedule}-{stages}x{mb}-g{groups}.json"
            t0 = time.perf_counter()
            save_profile(synthetic_profile(schedule, stages, mb, groups), path)
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
            stdout, _ = proc.communicate()
            early = [ln for ln in (stdout or "").splitlines() if ln.startswith(PARTIAL)]
            if early:  # the cold solve finished before the warm re-solve ran out of time
                part: dict[str, Any] = json.loads(early[-1][len(PARTIAL) :])
                part["warm"] = {"timeout_s": timeout}
                part.update(
                    outcome="ok",
                    rss_self_kb=max(py_kb, part.get("rss_self_kb", 0)),
                    parent_wall_s=time.perf_counter() - t0,
                )
                return part
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


def bench_lp(runner: Runner, cfg: dict[str, Any]) -> dict:
    """Section 1: the exact `lp` side by side; key (schedule, size, groups, method)."""
    out: dict[tuple[str, tuple[int, int], int, str], dict[str, Any]] = {}
    sizes: list[tuple[int, int]] = cfg["lp_sizes"]
    for groups in cfg["lp_groups"]:
        trimmed = cfg["trim_groups"] and groups != LP_GROUPS[0]
        for sched in cfg["lp_schedules"]:
            for i, size in enumerate(sizes):
                if trimmed and size not in LP_SIZES_MORE_GROUPS:
                    continue
                for method in cfg["lp_methods"]:
                    key = (sched, size, groups, method)
                    if trimmed and method != "fast":
                        out[key] = _not_run(
                            f"by default only the array-built LP runs with {groups} groups "
                            "(time budget); pass --groups to run them"
                        )
                        continue
                    prev = out.get((sched, sizes[i - 1], groups, method)) if i else None
                    why = _blocked(prev, sizes[i - 1]) if i else None
                    highs = out.get((sched, size, groups, "pulp-highs"))
                    if (
                        why is None
                        and method == "pulp-cbc"
                        and highs is not None
                        and highs["outcome"] == "timeout"
                    ):
                        why = (
                            f"PuLP → HiGHS exceeded the {highs['timeout_s']:.0f} s timeout here "
                            "(CBC was slower than HiGHS at every size measured)"
                        )
                    want = cfg["lp_timeout"] if method.startswith("pulp") else cfg["fast_timeout"]
                    t = _clip_timeout(runner, want)
                    if why is None and t is None:
                        why = "the benchmark's time budget was spent"
                    if why is not None:
                        out[key] = _not_run(why)
                        log(f"lp {sched} {_size(size)} g{groups} {method}: not run ({why})")
                        continue
                    assert t is not None
                    spec = [sched, size[0], size[1], groups]
                    # the solve's own time limit sits just above the harness timeout
                    base = {"solver": "highs", "threads": 1, "time_limit": t + 5}
                    if method == "fast":
                        small = size[0] * size[1] <= 32 * 128
                        case = {
                            "kind": "fast",
                            "spec": spec,
                            "opts": {**base, "mode": "lp"},
                            "check_warm": small,
                        }
                    elif method == "heuristic":
                        case = {
                            "kind": "solve",
                            "spec": spec,
                            "opts": {**base, "mode": "heuristic"},
                        }
                    elif method.startswith("heuristic-"):
                        limit = HEUR_10S if "10s" in method else TARGET_HEUR["seconds"]
                        case = {
                            "kind": "solve",
                            "spec": spec,
                            "opts": {**base, "mode": "heuristic", "time_limit": limit},
                            "load_passes": True,
                            "no_relax": method.endswith("-rank"),
                        }
                    else:
                        solver = method.split("-")[1]
                        case = {
                            "kind": "plain",
                            "spec": spec,
                            "opts": {**base, "mode": "lp", "solver": solver},
                        }
                    log(f"lp {sched} {_size(size)} g{groups} {method} (timeout {t:.0f} s) …")
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


def _load(t: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.2f}" for x in t)


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
    from freezeopt.solver.lp_arrays import IPM_FROM

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
        f"| load average (1, 5, 15 min) | before {_load(cfg['load'][0])}; after "
        f"{_load(cfg['load'][1])} — the machine is shared, other work ran beside this |",
        f"| sections | {', '.join(cfg['sections'])} |",
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
    if "lp" in cfg["sections"]:
        L += [
            "## 1. Exact `lp`, side by side",
            "",
            "All rows of one size come from the same profile (budget 0.1, group cap 0.75, sensitivity "
            "`gns`, no stage cap, single thread). Methods:",
            "",
            "- **lp, arrays → HiGHS** — `freezeopt.solver.lp_arrays.FastLP` (what `solve --mode lp --solver "
            "highs` runs): the LP as numpy arrays passed to highspy, implied edges left out, dual "
            "simplex from the crash basis for phase 1 (interior point with crossover from "
            f"{IPM_FROM} actions), primal simplex for phase 2. build s = arrays and model, solve s = both "
            "phases, total s = both. pivots = simplex pivots of phase 1 + phase 2.",
            f"- **lp, warm re-solve** — the same model re-solved in place after the action and group "
            f"costs of every {WARM_EVERY}th stage (0, {WARM_EVERY}, …) rose by "
            f"{WARM_CHANGE * 100:g} %: build s = updating right-hand sides and coefficients, solve s = "
            "both phases from the last basis. Up to 32×128 the same child also solved the new costs "
            "cold; check = relative difference of T and of signal to that cold answer.",
            '- **heuristic** — `solve(mode="heuristic", solver="highs")`: the LP above, rounded '
            "down, filled greedily and improved by swaps; total s = `solve_seconds` (LP, rounding, "
            "the fill and swap search, and three simulations), plan ms = its simulated step time, "
            "gap = (plan − LP bound) / plan.",
            f"- **heuristic, {TARGET_HEUR['seconds']:g} s limit** — the same with "
            f"`time_limit={TARGET_HEUR['seconds']:g}`, numba's compiled passes loaded before the "
            "call (about 0.5 s, once per process). The heuristic gives the LP 80 % of its time; "
            "where the LP's build alone would not fit, or the LP by a floor on its solve time "
            "(`LP_SECONDS_PER_PAIR2`), it skips the LP and searches from the "
            "rank-balanced start (`freezeopt.solver.balance`), status `heuristic_fallback`. LP bound = "
            "the bound the solve reports (the rank-load bound, then); gap = (plan − the arrays "
            "row's LP bound) / plan, and in brackets against the solve's own bound. Without the "
            "LP and with time for it, the first-order relaxation (`freezeopt.solver.relax`) runs for "
            f"{_relax_share():.0%} of the time left, rounding its plan included: its bound "
            "replaces the rank-load bound where higher, and its rounded plan the rank-balanced "
            "start where faster.",
            *(
                [
                    f"- **heuristic, {HEUR_10S:g} s limit** — the same with "
                    f"`time_limit={HEUR_10S:g}`; **…, no first-order relaxation** — the same with "
                    "the relaxation turned off (`RELAX_ITERATIONS = 10**12`): the LP-free path as "
                    "before it, side by side."
                ]
                if any(m in cfg["lp_methods"] for m in LP_METHODS_MORE)
                else []
            ),
            "- **lp, PuLP → HiGHS / CBC** — the plain PuLP model of both phases "
            "(`PulpModel.solve_lp`, as `--solver cbc` runs and as `--solver highs` ran before): "
            "build s = PuLP objects, solve s = the solver including PuLP's transfer; check = "
            "relative difference of T and of signal to the array-built LP.",
            "",
            f"Peak RSS is the child's high-water mark (for the arrays row it covers the warm "
            f"re-solve and the cold check too). Timeouts: {cfg['fast_timeout']:.0f} s per case for "
            f"the array-built LP and the heuristic, {cfg['lp_timeout']:.0f} s for the PuLP ones. "
            + (
                f"With {', '.join(str(g) for g in cfg['lp_groups'][1:])} groups per stage this "
                "run measured the array-built LP only, at "
                f"{', '.join(_size(z) for z in LP_SIZES_MORE_GROUPS)}."
                if cfg["trim_groups"] and len(cfg["lp_groups"]) > 1
                else ""
            ),
            "",
        ]
        rows = []
        for groups in cfg["lp_groups"]:
            for sched in cfg["lp_schedules"]:
                for size in cfg["lp_sizes"]:
                    fast = lp.get((sched, size, groups, "fast"))
                    if fast is None:
                        continue
                    for method in cfg["lp_methods"]:
                        r = lp[(sched, size, groups, method)]
                        if r["outcome"] == "not_run" and r["reason"].startswith("by default"):
                            continue  # said once above the table
                        rows.append(_lp_row(sched, size, groups, method, r, fast))
                        if method == "fast" and r["outcome"] == "ok" and "warm" in r:
                            rows.append(_lp_row(sched, size, groups, "warm", r, fast))
        L += _table(
            [
                "schedule",
                "stages×mb",
                "groups",
                "actions",
                "method",
                "build s",
                "solve s",
                "total s",
                "pivots",
                "peak RSS MB",
                "LP bound ms",
                "plan ms (gap)",
                "signal dropped",
                "check",
                "status",
            ],
            rows,
        )
        L.append("")

    # -- 2 -----------------------------------------------------------------------------------
    if "milp" in cfg["sections"]:
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
    if "dense" in cfg["sections"]:
        L += [
            "## 3. TimelyFreeze's dense LP beside our sparse `lp` (1F1B, one group per stage)",
            "",
            "Dense: `freezeopt.compare.timelyfreeze.solve_timelyfreeze_lp(dag, stage_cap=0.9)` — numpy dense "
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
    L += ["## 4. Targets (issue 6)", ""]
    rows = []
    g0 = 4
    big = TARGET_LP_BIG
    rows.append(
        [
            f"exact `lp` at {_size(big['size'])} ZBV in under {big['seconds']:g} s and "
            f"{big['rss_mb']:g} MB",
            METHOD_LABEL["fast"],
            *_time_verdict(
                lp.get((big["schedule"], big["size"], g0, "fast")),
                "wall_s",
                big["seconds"],
                rss_mb=big["rss_mb"],
            ),
        ]
    )
    for sched in LP_SCHEDULES:
        rows.append(
            [
                f"exact `lp` at {_size(TARGET_LP_MID['size'])} {SCHEDULE_LABEL[sched]} in under "
                f"{TARGET_LP_MID['seconds']:g} s",
                METHOD_LABEL["fast"],
                *_time_verdict(
                    lp.get((sched, TARGET_LP_MID["size"], g0, "fast")),
                    "wall_s",
                    TARGET_LP_MID["seconds"],
                ),
            ]
        )
    for sched in LP_SCHEDULES:
        r = lp.get((sched, TARGET_WARM["size"], g0, "fast"))
        rows.append(
            [
                f"warm re-solve after a {WARM_CHANGE * 100:g} % change in some stages' costs at "
                f"{_size(TARGET_WARM['size'])} {SCHEDULE_LABEL[sched]} in under "
                f"{TARGET_WARM['seconds']:g} s",
                METHOD_LABEL["warm"],
                *_time_verdict(
                    r["warm"] if r and r.get("outcome") == "ok" else r,
                    "wall_s",
                    TARGET_WARM["seconds"],
                ),
            ]
        )
    for sched, method in itertools.product(LP_SCHEDULES, ("heuristic", "heuristic-2s")):
        r = lp.get((sched, TARGET_HEUR["size"], g0, method))
        verdict = _time_verdict(r, "solve_seconds", TARGET_HEUR["seconds"])
        if r and r.get("outcome") == "ok":
            fast = lp.get((sched, TARGET_HEUR["size"], g0, "fast"))
            gap = _lp_gap_value(r, fast)
            gap_ok = gap is not None and gap <= TARGET_HEUR["gap"]
            verdict = [
                f"gap {_lp_gap(r, fast)}, {verdict[0]}",
                "PASS" if gap_ok and verdict[1] == "PASS" else "MISS",
            ]
        rows.append(
            [
                f"`heuristic` within {TARGET_HEUR['gap'] * 100:g} % of the LP bound at "
                f"{_size(TARGET_HEUR['size'])} {SCHEDULE_LABEL[sched]} in under "
                f"{TARGET_HEUR['seconds']:g} s",
                METHOD_LABEL[method],
                *verdict,
            ]
        )
    milp_target = (
        f"`milp` at {_size(TARGET_MILP['size'])} with {TARGET_MILP['groups']} groups per stage "
        f"within {TARGET_MILP['gap'] * 100:g} % gap in {TARGET_MILP['seconds']:g} s"
    )
    for solver in SOLVERS:
        r = milp.get(("milp", TARGET_MILP["size"], TARGET_MILP["groups"], solver))
        rows.append([milp_target, f"milp, {SOLVER_LABEL[solver]}", *_milp_verdict(r, cfg)])
    L += _table(["target", "method", "measured", "verdict"], rows)
    L += [
        "",
        "The `lp` targets are measured on the array-built LP alone (build and both phases, "
        "profile loading and DAG building left out), the heuristic and milp on the whole `solve` "
        "call. Gap is measured against the LP bound (the solver's own bound is tighter, so this "
        "gap is an upper bound on the true one). 4 groups per stage.",
        "",
    ]

    # -- notes -----------------------------------------------------------------------------------
    labelled = (
        [(f"lp {k[0]} {_size(k[1])} g{k[2]} {k[3]}", r) for k, r in lp.items()]
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


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(b), 1e-12)


def _lp_gap_value(r: dict[str, Any], fast: dict[str, Any] | None) -> float | None:
    """(plan − LP bound) / plan, the LP bound from the arrays row (or the solve's own, if it is
    the LP's: status `heuristic`); None when neither is known."""
    if fast is not None and fast.get("outcome") == "ok":
        return (r["predicted_ms"] - fast["lp_bound_ms"]) / r["predicted_ms"]
    return r["gap"] if r.get("status") == "heuristic" else None


def _lp_gap(r: dict[str, Any], fast: dict[str, Any] | None) -> str:
    gap = _lp_gap_value(r, fast)
    return "LP bound unknown" if gap is None else f"{gap * 100:.2f} %"


def _lp_row(
    sched: str,
    size: tuple[int, int],
    groups: int,
    method: str,
    r: dict[str, Any],
    fast: dict[str, Any] | None,
) -> list[str]:
    """One row of section 1."""
    ok = r["outcome"] == "ok"
    head = [
        SCHEDULE_LABEL[sched],
        _size(size),
        str(groups),
        str(r.get("actions", _n_actions(sched, size))),
        METHOD_LABEL[method],
    ]
    if not ok:
        rss = _rss_cell(r) if r["outcome"] == "timeout" else "—"
        return [*head, "—", "—", "—", "—", rss, "—", "—", "—", "—", _status_cell(r)]
    tm = r.get("timings", {})
    check = "—"
    if method == "warm":
        w = r["warm"]
        if "timeout_s" in w:
            return [
                *head,
                *["—"] * 9,
                f"timeout: the child (cold + warm) was killed after {w['timeout_s']:.0f} s",
            ]
        if "cold_lp_bound_ms" in w:
            dt = _rel(w["lp_bound_ms"], w["cold_lp_bound_ms"])
            ds = _rel(w["signal_dropped"], w["cold_signal_dropped"])
            check = f"= cold: ΔT {dt:.0e}, Δsignal {ds:.0e}"
        return [
            *head,
            f"{w['update_s']:.2f}",
            f"{w['solver_s']:.2f}",
            f"{w['wall_s']:.2f}",
            "+".join(str(p) for p in w["pivots"]),
            "(same child)",
            f"{w['lp_bound_ms']:.1f}",
            "—",
            f"{w['signal_dropped']:.6f}",
            check,
            f"optimal ({w['stages_changed']} stage{'s' if w['stages_changed'] != 1 else ''} "
            "changed)",
        ]
    if method.startswith("pulp") and fast is not None and fast["outcome"] == "ok":
        dt = _rel(r.get("lp_bound_ms"), fast["lp_bound_ms"])
        ds = _rel(r.get("signal_dropped"), fast["signal_dropped"])
        check = f"ΔT {dt:.0e}, Δsignal {ds:.0e}"
    if method == "heuristic":
        total = r.get("solve_seconds")
        plan = f"{r['predicted_ms']:.1f} ({r['gap'] * 100:.2f} %)"
    elif method.startswith("heuristic-"):
        total = r.get("solve_seconds")
        plan = f"{r['predicted_ms']:.1f} ({_lp_gap(r, fast)}; own {r['gap'] * 100:.2f} %)"
    else:
        total = r.get("wall_s")
        plan = "—"
    pivots = "+".join(str(p) for p in r["pivots"]) if "pivots" in r else "—"
    if method == "fast":
        pivots += f" ({r.get('method', '?')})"
    return [
        *head,
        _f(tm.get("build"), ".2f"),
        _f(tm.get("solver"), ".2f"),
        _f(total, ".2f"),
        pivots,
        _rss_cell(r),
        _f(r.get("lp_bound_ms"), ".1f"),
        plan,
        _f(r.get("signal_dropped"), ".6f"),
        check,
        str(r.get("status")),
    ]


def _time_verdict(
    r: dict[str, Any] | None, field: str, seconds: float, *, rss_mb: float | None = None
) -> list[str]:
    """Measured text and PASS/MISS for a time (and memory) target."""
    if r is None:
        return ["not measured (not in this run's sizes)", "—"]
    if "outcome" not in r and "timeout_s" in r:  # a warm re-solve killed with its child
        return [f"did not finish in {r['timeout_s']:.0f} s", "MISS"]
    if "outcome" in r and r["outcome"] != "ok":
        if r["outcome"] == "timeout":
            return [f"did not finish in {r['timeout_s']:.0f} s", "MISS"]
        if r["outcome"] == "not_run":
            return [f"not measured: {r['reason']}", "MISS (inferred)"]
        return [f"error: {r.get('error')}", "MISS"]
    secs = float(r[field])
    ok = secs < seconds
    text = f"{secs:.2f} s"
    if rss_mb is not None:
        rss = _rss_mb(r)
        ok = ok and rss < rss_mb
        text += f", {rss:.0f} MB"
    return [text, "PASS" if ok else "MISS"]


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


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        a, _, b = part.strip().lower().replace("×", "x").partition("x")
        out.append((int(a), int(b)))
    return out


def _names(text: str, allowed: list[str], what: str) -> list[str]:
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in allowed]
    if bad:
        raise SystemExit(
            f"error: unknown {what} {', '.join(bad)}; use some of {', '.join(allowed)}"
        )
    return out


SECTIONS = ["lp", "milp", "dense"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "solver-latest.md")
    ap.add_argument("--quick", action="store_true", help="smallest sizes only (smoke run)")
    ap.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"which to run, of {','.join(SECTIONS)}"
    )
    ap.add_argument("--sizes", help="section 1 sizes, e.g. 8x64,32x128 (default 8×64 … 64×256)")
    ap.add_argument("--schedules", help=f"section 1 schedules, of {','.join(LP_SCHEDULES)}")
    ap.add_argument("--groups", help="section 1 groups per stage, e.g. 4,8")
    ap.add_argument(
        "--methods",
        help=f"section 1 methods, of {','.join(LP_METHODS + LP_METHODS_MORE)} (default: "
        f"{','.join(LP_METHODS)})",
    )
    ap.add_argument(
        "--lp-timeout", type=float, default=120.0, help="seconds per PuLP lp case (section 1)"
    )
    ap.add_argument(
        "--fast-timeout",
        type=float,
        default=600.0,
        help="seconds per array-built lp and heuristic case (section 1)",
    )
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
        "--max-minutes", type=float, default=90.0, help="cases after this are reported as not run"
    )
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case is not None:
        return child_main(args.case)

    sections = _names(args.sections, SECTIONS, "section")
    cfg: dict[str, Any] = {
        "lp_sizes": _sizes(args.sizes) if args.sizes else LP_SIZES[:1] if args.quick else LP_SIZES,
        "lp_schedules": _names(args.schedules, LP_SCHEDULES, "schedule")
        if args.schedules
        else LP_SCHEDULES,
        "lp_groups": [int(g) for g in args.groups.split(",")]
        if args.groups
        else LP_GROUPS[:1]
        if args.quick
        else LP_GROUPS,
        "lp_methods": _names(args.methods, LP_METHODS + LP_METHODS_MORE, "method")
        if args.methods
        else LP_METHODS,
        "trim_groups": not args.groups,
        "milp_sizes": MILP_SIZES[:1] if args.quick else MILP_SIZES,
        "dense_sizes": DENSE_SIZES[:1] if args.quick else DENSE_SIZES,
        "time_limit": args.milp_time_limit or (2.0 if args.quick else 30.0),
        "lp_timeout": args.lp_timeout,
        "fast_timeout": args.fast_timeout,
        "extra_timeout": args.extra_timeout,
        "dense_timeout": args.dense_timeout,
        "dense_max_gib": args.dense_max_gib,
        "sections": sections,
    }
    if "fast" not in cfg["lp_methods"]:
        cfg["lp_methods"] = ["fast", *cfg["lp_methods"]]  # the others are checked against it
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="freezeopt-bench-") as tmp:
        runner = Runner(Path(tmp), deadline=t0 + args.max_minutes * 60)
        lp = bench_lp(runner, cfg) if "lp" in sections else {}
        milp = (
            bench_milp(runner, cfg["milp_sizes"], cfg["time_limit"], cfg["extra_timeout"])
            if "milp" in sections
            else {}
        )
        dense = (
            bench_dense(
                runner, cfg["dense_sizes"], cfg["dense_timeout"], cfg["dense_max_gib"] * 2**30
            )
            if "dense" in sections
            else {}
        )
        cfg["load"] = (load_before, os.getloadavg())
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
