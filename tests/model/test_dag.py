"""DAG construction and its consistency checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import networkx as nx
import pytest

from freezeopt.actions import Action, parse_action
from freezeopt.errors import InputError
from freezeopt.formats.profile import RankProfile
from freezeopt.model.dag import build_dag
from freezeopt.profiling.synth import SynthOptions, synth_profile
from freezeopt.torchpp.adapter import SCHEDULE_NAMES
from tests.conftest import make_profile


@pytest.mark.parametrize("schedule", SCHEDULE_NAMES)
@pytest.mark.parametrize(("ranks", "mbs"), [(2, 4), (4, 8), (3, 6)])
def test_every_schedule_builds_an_acyclic_complete_dag(schedule: str, ranks: int, mbs: int) -> None:
    p = make_profile(schedule=schedule, ranks=ranks, microbatches=mbs)
    dag = build_dag(p)
    assert nx.is_directed_acyclic_graph(dag.graph)
    spr = 1 if schedule in ("GPipe", "1F1B") else 2
    assert dag.n_stages == ranks * spr
    # one F per (stage, mb), one backward (B or I+W)
    n_f = sum(1 for a in dag.order if a.kind == "F")
    assert n_f == dag.n_stages * mbs
    # activations flow forward (a composite's sends to another rank leave after all of it)
    end_of = {
        parse_action(t): parse_action(run[-1])
        for rp in p.ranks
        for run in rp.composites
        for t in run
    }
    for m in range(mbs):
        for s in range(dag.n_stages - 1):
            f, nxt = Action(s, "F", m), Action(s + 1, "F", m)
            src = end_of.get(f, f) if dag.rank_of[f] != dag.rank_of[nxt] else f
            assert dag.graph.has_edge(src, nxt)
    assert bool(end_of) == (schedule == "DualPipeV")
    # topological order respects every edge
    pos = {a: i for i, a in enumerate(dag.order)}
    assert all(pos[u] < pos[v] for u, v in dag.graph.edges)


def test_split_backward_edges(small_profile) -> None:
    p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4)
    dag = build_dag(p)
    assert dag.graph.has_edge(Action(1, "I", 0), Action(1, "W", 0))
    assert dag.graph.has_edge(Action(2, "I", 0), Action(1, "I", 0))
    assert dag.graph.has_edge(Action(3, "F", 0), Action(3, "I", 0))
    assert set(dag.freezable()) == {a for a in dag.order if a.kind in ("B", "W")}


def test_cross_rank_edges_carry_lag() -> None:
    p = make_profile(lag_ms=0.7)
    dag = build_dag(p)
    assert dag.graph.edges[Action(0, "F", 0), Action(1, "F", 0)]["lag"] == pytest.approx(
        0.7, rel=0.1
    )
    assert dag.graph.edges[Action(0, "F", 0), Action(0, "F", 1)]["lag"] == 0.0


def _with_ranks(p, rows):
    return dataclasses.replace(
        p, ranks=tuple(RankProfile(rank=i, actions=tuple(r)) for i, r in enumerate(rows))
    )


def test_missing_action_is_named(small_profile) -> None:
    rows = [list(r.actions) for r in small_profile.ranks]
    rows[1].remove("1B2")
    with pytest.raises(InputError, match="stage 1 microbatch 2 needs one backward"):
        build_dag(_with_ranks(small_profile, rows))


def test_duplicate_action_is_named(small_profile) -> None:
    rows = [list(r.actions) for r in small_profile.ranks]
    rows[1].append("1F0")
    with pytest.raises(InputError, match=r"1F0 appears twice \(on rank 1\)"):
        build_dag(_with_ranks(small_profile, rows))
    rows = [list(r.actions) for r in small_profile.ranks]
    rows[0].append("1F0")
    with pytest.raises(InputError, match=r"1F0 appears twice \(on ranks 0 and 1\)"):
        build_dag(_with_ranks(small_profile, rows))


def test_deadlock_is_reported_as_a_cycle(small_profile) -> None:
    rows = [list(r.actions) for r in small_profile.ranks]
    rows[1].remove("1B0")
    rows[1].insert(0, "1B0")  # backward before its forward
    with pytest.raises(InputError, match="deadlocks: cycle"):
        build_dag(_with_ranks(small_profile, rows))


def test_stage_on_two_ranks(small_profile) -> None:
    rows = [list(r.actions) for r in small_profile.ranks]
    rows[1].remove("1F3")
    rows[0].append("1F3")
    with pytest.raises(InputError, match="runs on ranks"):
        build_dag(_with_ranks(small_profile, rows))


def test_group_costs_cannot_exceed_the_action(small_profile) -> None:
    st = small_profile.stages[0]
    g = st.groups[0]
    big = dataclasses.replace(g, weight_grad_ms=dataclasses.replace(g.weight_grad_ms, median=1e6))
    stages = (dataclasses.replace(st, groups=(big, *st.groups[1:])), *small_profile.stages[1:])
    with pytest.raises(InputError, match="more than action"):
        build_dag(dataclasses.replace(small_profile, stages=stages))


def test_csv_schedule(tmp_path: Path) -> None:
    csv = tmp_path / "zb.csv"
    csv.write_text(
        "0F0,0F1,0I0,0W0,0F2,0I1,0W1,0F3,0I2,0W2,0I3,0W3\n"
        "1F0,1I0,1W0,1F1,1I1,1W1,1F2,1I2,1W2,1F3,1I3,1W3\n"
    )
    p = synth_profile(SynthOptions(schedule=str(csv), groups=2))  # ranks 4, microbatches 8
    assert p.pipeline.schedule == "csv:zb.csv"
    job = p.provenance.job  # what the file holds, not the options it overrides
    assert (job["ranks"], job["microbatches"], job["stages_per_rank"]) == (2, 4, None)
    dag = build_dag(p)
    assert dag.n_stages == 2 and dag.n_microbatches == 4


def test_csv_with_deadlock(tmp_path: Path) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text("0F0,0B0\n1B0,1F0\n")
    with pytest.raises(InputError, match="deadlocks"):
        build_dag(synth_profile(SynthOptions(schedule=str(csv))))


@pytest.mark.parametrize(
    ("schedule", "ranks", "mbs"),
    [("1F1B", 4, 8), ("Interleaved1F1B", 2, 4), ("ZBVZeroBubble", 4, 8), ("DualPipeV", 2, 4)],
)
def test_order_is_networkx_lexicographic_topological_sort(
    schedule: str, ranks: int, mbs: int
) -> None:
    """The DAG's own Kahn order is networkx's lexicographic one with the (microbatch, stage,
    kind) key, and every edge runs forward in it."""
    dag = build_dag(synth_profile(SynthOptions(schedule=schedule, ranks=ranks, microbatches=mbs)))
    want = nx.lexicographical_topological_sort(
        dag.graph, key=lambda a: (a.microbatch, a.stage, a.kind)
    )
    assert dag.order == tuple(want)
    pos = {a: i for i, a in enumerate(dag.order)}
    assert all(pos[u] < pos[v] for u, v in dag.graph.edges)
