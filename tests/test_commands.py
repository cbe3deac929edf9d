"""`freezeopt.commands`: the file-to-file steps the command line runs."""

from __future__ import annotations

from pathlib import Path

import pytest

import freezeopt.commands as workflow
from freezeopt.formats.profile import save_profile
from freezeopt.formats.schedule import Phases
from freezeopt.solver import SolveOptions
from tests.conftest import make_profile


@pytest.mark.parametrize(
    ("opts", "loads"),
    [
        (SolveOptions(mode="heuristic", solver="highs"), True),
        (SolveOptions(mode="milp", solver="highs", fallback="heuristic"), True),
        (SolveOptions(mode="milp", solver="highs"), False),
        (SolveOptions(mode="lp", solver="highs"), False),
    ],
)
def test_solving_a_file_loads_the_compiled_kernels_before_the_solve_where_it_may_run_without_the_lp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opts: SolveOptions, loads: bool
) -> None:
    """Where the answer may come without the LP (the relaxation, the search), numba's kernels are
    loaded before `solve` starts its clock, so a short time limit is not spent loading them."""
    calls: list[str] = []
    real_solve = workflow.solve
    monkeypatch.setattr(workflow, "load_kernels", lambda: calls.append("load_kernels"))

    def solve(*a: object, **kw: object) -> object:
        calls.append("solve")
        return real_solve(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(workflow, "solve", solve)
    path = tmp_path / "p.json"
    save_profile(make_profile(), path)
    workflow.solve_file(path, opts, phases=Phases(), out=None)
    want = ["load_kernels", "solve"] if loads else ["solve"]
    assert calls == want
