"""The pipeline schedule as a DAG (networkx), and the checks that make it trustworthy.

One node per compute action. Edges say what must finish before an action may start:

* program order: consecutive actions on the same rank (a rank runs one action at a time);
* activations: `F(s, m) → F(s+1, m)`;
* gradients: the input-gradient action of stage s+1 (its `B`, or its `I` in split schedules)
  precedes that of stage s, and the last stage's forward precedes its own backward;
* local dependencies: `F(s, m)` precedes the backward of `(s, m)`, and `I(s, m) → W(s, m)`.

Cross-rank edges carry the profile's point-to-point lag. An action inside a composite (a run
torch executes as one unit, DualPipeV's `(aFm;bBn)OVERLAP_F_B`) sends to other ranks only when
the whole run is done: its cross-rank edges leave from the run's last action (hand-offs to a
stage on the same rank stay where they are, as in torch). Only `B` and `W` actions hold
weight-gradient work, so only they are freezable; each carries its stage's per-group costs.
Backward truncation: where a stage's backward runs whole and every group before a point is frozen
in a microbatch (and every stage before it frozen whole), autograd stops there, so the
input-gradient work below is saved as well (`PipelineDag.truncation_saving`). The edges do not
change: torch still hands the (zero) gradient down and the stage below still receives it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx

from freezeopt.actions import Action, parse_action
from freezeopt.errors import InputError
from freezeopt.formats.profile import Profile
from freezeopt.formats.schedule import Schedule, parse_microbatches

__all__ = ["PipelineDag", "build_dag", "schedule_plan"]

# Files round to 6 significant digits, so a stage whose groups make up all of an action can sum to a
# hair more than the action; allow that much.
_COST_TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineDag:
    """A checked pipeline DAG with everything the simulator and solver need."""

    graph: nx.DiGraph
    """Nodes are `Action`s; edges carry `lag` (ms)."""
    order: tuple[Action, ...]
    """A topological order of all actions (deterministic)."""
    rank_of: Mapping[Action, int]
    """The rank that runs each action."""
    rank_actions: tuple[tuple[Action, ...], ...]
    """Per rank, its actions in program order."""
    cost: Mapping[Action, float]
    """Duration of each action with nothing frozen (ms)."""
    group_names: tuple[tuple[str, ...], ...]
    """Per stage, its parameter group names."""
    group_cost: tuple[tuple[float, ...], ...]
    """Per stage, per group: weight-gradient ms saved when the group is frozen in one backward."""
    n_microbatches: int
    truncation: tuple[tuple[float, ...], ...] = ()
    """Per stage, what backward truncation saves beyond the frozen groups' costs
    (`StageProfile.truncation_ms`: entry 0 when the stage's input gradient is not needed, entry j
    once groups 0…j−1 are frozen too); empty for a stage where it was not measured."""
    passes: tuple[bool, ...] = ()
    """Per stage: with all its groups frozen (and its input gradient not needed) in a microbatch,
    the stage needs no gradient from the next one (truncation measured, every parameter grouped)."""

    @property
    def n_stages(self) -> int:
        return len(self.group_names)

    def freezable(self) -> tuple[Action, ...]:
        """Actions that hold weight-gradient work of at least one group with positive cost, in order."""
        return tuple(
            a
            for a in self.order
            if a.has_weight_grad and any(c > 0 for c in self.group_cost[a.stage])
        )

    def durations(
        self, frozen: Mapping[tuple[Action, int], float] | None = None
    ) -> dict[Action, float]:
        """Action durations when group `g` of action `a` is frozen to the extent `frozen[(a, g)]` (0..1)."""
        d = dict(self.cost)
        for (a, g), x in (frozen or {}).items():
            if x:
                d[a] = d[a] - self.group_cost[a.stage][g] * x
        for a, saved in self.truncation_saving(frozen or {}).items():
            d[a] -= saved
        return {a: max(0.0, v) for a, v in d.items()}

    @property
    def has_truncation(self) -> bool:
        """Whether any stage gains from backward truncation."""
        return any(v > 0 for row in self.truncation for v in row)

    def truncated(self) -> dict[int, dict[int, Action]]:
        """Stage → microbatch → the action holding the stage's whole backward (`B`, or stage
        0's `W` in split schedules), for the stages where truncation was measured."""
        out: dict[int, dict[int, Action]] = {}
        for a in self.order:
            row = self.truncation[a.stage] if a.stage < len(self.truncation) else ()
            # the stage's whole backward: B, or stage 0's W (torch runs stage 0's in W there)
            if row and (a.kind == "B" or (a.kind == "W" and a.stage == 0)):
                out.setdefault(a.stage, {})[a.microbatch] = a
        return out

    def truncation_saving(self, frozen: Mapping[tuple[Action, int], float]) -> dict[Action, float]:
        """Per truncated action, the time backward truncation saves under `frozen`, as the runtime
        truncates: y_0 = 1 where the stage's input gradient is not needed (stage 0, or the stage
        before passes and is frozen whole in that microbatch), y_j = y_j−1 where group j−1 is
        frozen whole there (extent 1) and 0 otherwise; the saving is Σ_j truncation[s][j]·y_j.
        A fractional extent (an `lp` plan's ratio, realised by a random draw) counts as not
        frozen: the LP reads it as `min` (`freezeopt.solver.pulp_model`), a relaxation of this."""
        out: dict[Action, float] = {}
        if not self.has_truncation:
            return out
        acts = self.truncated()
        for m in range(self.n_microbatches):
            whole = True  # every stage before this one frozen whole in microbatch m
            for s in range(self.n_stages):
                a = acts.get(s, {}).get(m)
                if a is None or not whole:
                    break
                saved = self.truncation[s][0]
                for j in range(len(self.group_names[s])):
                    if frozen.get((a, j), 0.0) < 1.0 - 1e-9:
                        whole = False
                        break
                    saved += self.truncation[s][j + 1]
                if saved:
                    out[a] = saved
                whole = whole and self.passes[s]
        return out

    def all_frozen(self) -> dict[tuple[Action, int], float]:
        """Every freezable group frozen in every backward: the floor on step time."""
        return {
            (a, g): 1.0
            for a in self.freezable()
            for g, c in enumerate(self.group_cost[a.stage])
            if c > 0
        }


def build_dag(profile: Profile) -> PipelineDag:
    """Build and check the DAG of a profile; raise InputError naming what is inconsistent."""
    pipe = profile.pipeline
    n_st, n_mb = pipe.n_stages, pipe.n_microbatches
    if len(profile.stages) != n_st or [s.stage for s in profile.stages] != list(range(n_st)):
        raise InputError(
            f"profile lists stages {[s.stage for s in profile.stages]}; expected 0..{n_st - 1} in order"
        )
    if len(profile.ranks) != pipe.world_size or [r.rank for r in profile.ranks] != list(
        range(pipe.world_size)
    ):
        raise InputError(
            f"profile lists ranks {[r.rank for r in profile.ranks]}; expected 0..{pipe.world_size - 1} in order"
        )

    rank_of: dict[Action, int] = {}
    rank_actions: list[tuple[Action, ...]] = []
    stage_rank: dict[int, int] = {}
    parsed: dict[str, Action] = {}  # the ranks' action texts, parsed once
    for rp in profile.ranks:
        acts = tuple(parse_action(s) for s in rp.actions)
        parsed.update(zip(rp.actions, acts, strict=True))
        for a in acts:
            if a in rank_of:
                raise InputError(
                    f"action {a} appears twice ("
                    + (
                        f"on rank {rp.rank}"
                        if rank_of[a] == rp.rank
                        else f"on ranks {rank_of[a]} and {rp.rank}"
                    )
                    + "); each action runs once"
                )
            if not (0 <= a.stage < n_st and 0 <= a.microbatch < n_mb):
                raise InputError(
                    f"action {a} on rank {rp.rank} is outside {n_st} stages × {n_mb} microbatches"
                )
            if stage_rank.setdefault(a.stage, rp.rank) != rp.rank:
                raise InputError(
                    f"stage {a.stage} runs on ranks {stage_rank[a.stage]} and {rp.rank}; a stage lives on one rank"
                )
            rank_of[a] = rp.rank
        rank_actions.append(acts)
    for st in profile.stages:
        if stage_rank.get(st.stage, st.rank) != st.rank:
            raise InputError(
                f"stage {st.stage} is declared on rank {st.rank} but its actions run on rank {stage_rank[st.stage]}"
            )

    # Actions are numbered in the order of the ranks' lists and found by their fields: tuples and
    # ints hash in C, `Action`s in Python. The edges and the step order are worked out on numbers;
    # networkx gets the ranks' own `Action` objects (it hashes each edge's ends several times, and
    # an equal but distinct object costs an `__eq__` as well).
    nodes = list(rank_of)
    act: dict[tuple[int, str, int], int] = {
        (a.stage, a.kind, a.microbatch): i for i, a in enumerate(nodes)
    }
    _check_complete(act, n_st, n_mb)

    cost: dict[Action, float] = {}
    for ac in profile.actions:
        a = parsed.get(ac.action) or parse_action(ac.action)
        if a not in rank_of:
            raise InputError(f"profile has a cost for {a}, which no rank runs")
        cost[a] = ac.cost_ms.median
    missing = [str(a) for a in rank_of if a not in cost]
    if missing:
        raise InputError(
            f"profile has no cost for {len(missing)} action(s), e.g. {', '.join(sorted(missing)[:3])}"
        )

    group_names = tuple(tuple(g.name for g in st.groups) for st in profile.stages)
    group_cost = tuple(tuple(g.weight_grad_ms.median for g in st.groups) for st in profile.stages)
    cheapest: dict[int, Action] = {}  # per stage, its cheapest weight-gradient action
    for a in rank_of:
        if a.has_weight_grad:
            was = cheapest.get(a.stage)
            if was is None or cost[a] < cost[was]:
                cheapest[a.stage] = a
    truncation = tuple(tuple(t.median for t in st.truncation_ms) for st in profile.stages)
    for s, names in enumerate(group_names):
        if len(set(names)) != len(names):
            raise InputError(
                f"stage {s} has duplicate group names; group names must be unique per stage"
            )
        total = sum(group_cost[s])
        low = cheapest.get(s)
        if low is not None and total > cost[low] * (1 + _COST_TOLERANCE) + 1e-9:
            raise InputError(
                f"stage {s}: group weight-gradient costs sum to {total:.4g} ms, more than action {low} takes "
                f"({cost[low]:.4g} ms); re-measure the profile"
            )
        # truncation saves in the stage's whole backwards (B, or stage 0's W): they must hold it
        whole = [
            a for a in rank_of if a.stage == s and (a.kind == "B" or (a.kind == "W" and s == 0))
        ]
        cut = total + sum(truncation[s])
        if truncation[s] and whole:
            least = min(whole, key=lambda a: cost[a])
            if cut > cost[least] * (1 + _COST_TOLERANCE) + 1e-9:
                raise InputError(
                    f"stage {s}: group costs and truncation gains sum to {cut:.4g} ms, more than "
                    f"action {least} takes ({cost[least]:.4g} ms); re-measure the profile"
                )

    lag: dict[tuple[int, int, str], float] = {
        (lg.src_stage, lg.dst_stage, lg.kind): lg.ms.median for lg in profile.lags
    }
    stage = [a.stage for a in nodes]
    sends_after = _composite_ends(profile, rank_actions, act)
    edges: list[tuple[int, int, float]] = []

    def edge(u: int, v: int, kind: str) -> None:
        su, sv = stage[u], stage[v]
        if stage_rank[su] == stage_rank[sv]:
            edges.append((u, v, 0.0))
        else:
            edges.append((sends_after.get(u, u), v, lag.get((su, sv, kind), 0.0)))

    first = 0
    for acts in rank_actions:
        edges.extend((u, u + 1, 0.0) for u in range(first, first + len(acts) - 1))
        first += len(acts)
    for m in range(n_mb):
        for s in range(n_st):
            f = act[(s, "F", m)]
            bin_ = act.get((s, "B", m))
            if bin_ is None:
                bin_ = act[(s, "I", m)]
            if s + 1 < n_st:
                edge(f, act[(s + 1, "F", m)], "F")
                up = act.get((s + 1, "B", m))
                edge(act[(s + 1, "I", m)] if up is None else up, bin_, "B")
            edge(f, bin_, "F")
            if nodes[bin_].kind == "I":
                edge(bin_, act[(s, "W", m)], "B")
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    # in this order: each action's predecessors keep it
    g.add_edges_from((nodes[u], nodes[v], {"lag": w}) for u, v, w in edges)

    order = _step_order(nodes, edges)
    if len(order) < len(nodes):
        cycle = nx.find_cycle(g)
        path = " → ".join(str(u) for u, _ in cycle) + f" → {cycle[-1][1]}"
        raise InputError(
            f"the schedule deadlocks: cycle {path}; fix the action order of the ranks involved"
        )
    return PipelineDag(
        graph=g,
        order=tuple(nodes[i] for i in order),
        rank_of=rank_of,
        rank_actions=tuple(rank_actions),
        cost=cost,
        group_names=group_names,
        group_cost=group_cost,
        n_microbatches=n_mb,
        truncation=truncation,
        passes=tuple(
            bool(t) and st.all_grouped is True
            for t, st in zip(truncation, profile.stages, strict=True)
        ),
    )


def _composite_ends(
    profile: Profile,
    rank_actions: list[tuple[Action, ...]],
    act: Mapping[tuple[int, str, int], int],
) -> dict[int, int]:
    """Each action inside a composite → the composite's last action (as positions in the nodes),
    after checking that every composite is a run of at least two consecutive actions of its rank."""
    ends: dict[int, int] = {}
    seen: set[Action] = set()
    for rp, acts in zip(profile.ranks, rank_actions, strict=True):
        pos = {a: i for i, a in enumerate(acts)}
        for texts in rp.composites:
            run = [parse_action(t) for t in texts]
            first = pos.get(run[0], -1)
            if len(run) < 2 or [pos.get(a) for a in run] != list(range(first, first + len(run))):
                raise InputError(
                    f"rank {rp.rank}: composite {';'.join(texts)} is not a run of two or more "
                    "consecutive actions of that rank; re-profile or remove it from `composites`"
                )
            twice = seen.intersection(run)
            if twice:
                raise InputError(
                    f"rank {rp.rank}: action {min(twice)} is in two composites; an action runs in one"
                )
            seen.update(run)
            last = act[(run[-1].stage, run[-1].kind, run[-1].microbatch)]
            for a in run[:-1]:
                ends[act[(a.stage, a.kind, a.microbatch)]] = last
    return ends


def _step_order(nodes: list[Action], edges: list[tuple[int, int, float]]) -> list[int]:
    """The topological order that always takes the ready action of the lowest (microbatch,
    stage, kind) next (what `nx.lexicographical_topological_sort` gives with that key; each
    action has its own key, so the order is unique), as positions in `nodes`. Shorter than
    `nodes` when the edges have a cycle."""
    indeg = [0] * len(nodes)
    succ: list[list[int]] = [[] for _ in nodes]
    for u, v, _ in edges:
        succ[u].append(v)
        indeg[v] += 1
    key = [(a.microbatch, a.stage, a.kind, i) for i, a in enumerate(nodes)]
    ready = [key[i] for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        u = heapq.heappop(ready)[3]
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if not indeg[v]:
                heapq.heappush(ready, key[v])
    return order


def _check_complete(act: Mapping[tuple[int, str, int], int], n_st: int, n_mb: int) -> None:
    """Every (stage, microbatch) has a forward and one backward (`act`: actions by their fields)."""
    kinds: dict[tuple[int, int], set[str]] = {}
    for st, k, m in act:
        kinds.setdefault((st, m), set()).add(k)
    for s in range(n_st):
        for m in range(n_mb):
            has = kinds.get((s, m), set())
            if "F" not in has:
                raise InputError(
                    f"no rank runs {s}F{m}; every stage needs a forward for every microbatch"
                )
            if has - {"F"} not in ({"B"}, {"I", "W"}):
                found = ", ".join(f"{s}{k}{m}" for k in sorted(has - {"F"})) or "none"
                raise InputError(
                    f"stage {s} microbatch {m} needs one backward: either {s}B{m}, or {s}I{m} and {s}W{m} (found: {found})"
                )


def schedule_plan(schedule: Schedule, dag: PipelineDag) -> dict[tuple[Action, int], float]:
    """(weight-gradient action, group index) → frozen extent, for the simulator and runtime."""
    plan: dict[tuple[Action, int], float] = {}
    n_mb = schedule.pipeline.n_microbatches

    def weight_action(s: int, m: int) -> Action:
        b = Action(s, "B", m)
        return b if b in dag.rank_of else Action(s, "W", m)

    for s, groups in schedule.frozen.items():
        for name, mbs in groups.items():
            g = dag.group_names[s].index(name)
            for m in parse_microbatches(mbs, n_mb):
                plan[(weight_action(s, m), g)] = 1.0
    for s, groups2 in schedule.ratios.items():
        for name, per_mb in groups2.items():
            g = dag.group_names[s].index(name)
            for m, r in per_mb.items():
                key = (weight_action(s, m), g)
                plan[key] = max(plan.get(key, 0.0), r)
    return plan
