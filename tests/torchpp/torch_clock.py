"""torch's own pipeline runtime, run on stand-in stages in virtual time: the oracle for the DAG.

Every rank runs its real torch schedule object (`_step_microbatches`, the code that executes in
training) in a thread, on stand-in stages whose compute methods advance that rank's clock by a
given duration instead of computing. Point-to-point traffic is virtual too: a send is posted at
the sender's clock and never blocks; waiting on a receive moves the receiver's clock to the
send's post time plus the lag between the two stages. That is the timing model freezeopt's DAG
claims (edges with lags, ranks running actions in program order), so for any durations the DAG's
start and end of every action must equal what this runner records.

Tests only: it reaches far into torch's private pipelining code (stage methods, `_batch_p2p`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from freezeopt.actions import Action

_SINGLE = frozenset({"GPipe", "1F1B"})
_WAIT_S = 30.0  # a wait this long means the schedule deadlocked (the runs take milliseconds)


@dataclass
class _Op:
    """A stand-in `P2POp`: what `_batch_p2p` gets from a stand-in stage."""

    send: bool
    key: tuple[str, int, int, int]  # (F or B, from stage, to stage, microbatch)
    peer: int


@dataclass
class _Net:
    """Sends posted so far, with the virtual time they were posted."""

    lag: Callable[[int, int, str], float]
    posted: dict[tuple[str, int, int, int], float] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    failed: list[BaseException] = field(default_factory=list)


class _Work:
    def __init__(self, net: _Net, op: _Op, clock: _Clock):
        self.net, self.op, self.clock = net, op, clock

    def wait(self) -> None:
        if self.op.send:
            return
        net, key = self.net, self.op.key
        with net.cond:
            if not net.cond.wait_for(lambda: key in net.posted or bool(net.failed), _WAIT_S):
                raise TimeoutError(f"no send for {key}: the schedule deadlocks")
            if net.failed:
                raise RuntimeError("another rank failed")
            kind, src, dst, _ = key
            self.clock.now = max(self.clock.now, net.posted[key] + net.lag(src, dst, kind))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


def _batch_p2p(net: _Net, clocks: Mapping[int, _Clock]) -> Callable[..., list[_Work]]:
    def batch(ops: list[_Op], desc: str | None = None) -> list[_Work]:
        clock = clocks[threading.get_ident()]
        works = []
        for op in ops:
            if op.send:
                with net.cond:
                    net.posted[op.key] = clock.now
                    net.cond.notify_all()
            works.append(_Work(net, op, clock))
        return works

    return batch


def run_torch(
    schedule: str,
    rank_actions: tuple[tuple[Action, ...], ...],
    cost: Mapping[Action, float],
    lag: Callable[[int, int, str], float],
    n_microbatches: int,
) -> dict[Action, tuple[float, float]]:
    """Run torch's runtime for `schedule` on every rank; each action's (start, end) in virtual time.

    `rank_actions` says which stages each rank holds (the adapter's per-rank order); `cost` gives
    every action's duration; `lag(src_stage, dst_stage, kind)` the transfer time between ranks.
    """
    from torch.distributed.pipelining import schedules as S
    from torch.distributed.pipelining.stage import PipelineStage

    world = len(rank_actions)
    stage_rank = {a.stage: r for r, acts in enumerate(rank_actions) for a in acts}
    n_stages = len(stage_rank)
    net = _Net(lag=lag)
    clocks: dict[int, _Clock] = {}
    times: dict[Action, tuple[float, float]] = {}

    class Stand(PipelineStage):
        """A stage that computes nothing: its compute methods advance the rank's clock."""

        def __init__(self, s: int, rank: int) -> None:  # no super(): nothing real is built
            self.stage_index, self.num_stages = s, n_stages
            self.group_rank, self.group_size = rank, world
            self.submod = None
            self.has_backward = True

        def _run(self, kind: str, mb: int) -> None:
            clock = clocks[threading.get_ident()]
            a = Action(self.stage_index, kind, mb)  # type: ignore[arg-type]
            t0 = clock.now
            clock.now += cost[a]
            times[a] = (t0, clock.now)

        def _ops(self, send: bool, kind: str, peer: int, mb: int) -> list[_Op]:
            s = self.stage_index
            if not 0 <= peer < n_stages or stage_rank[peer] == stage_rank[s]:
                return []
            key = (kind, s, peer, mb) if send else (kind, peer, s, mb)
            return [_Op(send=send, key=key, peer=stage_rank[peer])]

        def forward_one_chunk(self, mb: int, *a: Any, **k: Any) -> None:  # type: ignore[override]
            self._run("F", mb)

        def backward_one_chunk(  # type: ignore[override]
            self, mb: int, *a: Any, full_backward: bool = True, **k: Any
        ) -> None:
            self._run("B" if full_backward else "I", mb)

        def backward_weight_one_chunk(self, mb: int, *a: Any, **k: Any) -> None:  # type: ignore[override]
            self._run("W", mb)

        def get_fwd_recv_ops(self, mb: int) -> list[_Op]:  # type: ignore[override]
            return self._ops(False, "F", self.stage_index - 1, mb)

        def get_fwd_send_ops(self, mb: int) -> list[_Op]:  # type: ignore[override]
            return self._ops(True, "F", self.stage_index + 1, mb)

        def get_bwd_recv_ops(self, mb: int) -> list[_Op]:  # type: ignore[override]
            return self._ops(False, "B", self.stage_index + 1, mb)

        def get_bwd_send_ops(self, mb: int) -> list[_Op]:  # type: ignore[override]
            return self._ops(True, "B", self.stage_index - 1, mb)

        def set_local_fwd_input(self, *a: Any, **k: Any) -> None:
            pass

        def perform_reduce_grad(self, *a: Any, **k: Any) -> None:
            pass

        def set_local_bwd_input(self, *a: Any, **k: Any) -> None:
            pass

        def get_local_bwd_output(self, *a: Any, **k: Any) -> None:  # type: ignore[override]
            return None

    def build(rank: int) -> Any:
        mine = sorted({a.stage for a in rank_actions[rank]})
        stages = [Stand(s, rank) for s in mine]
        cls = S.get_schedule_class(schedule)
        if schedule in _SINGLE:
            return cls(stages[0], n_microbatches, loss_fn=lambda out, tgt: out)
        return cls(stages, n_microbatches, loss_fn=lambda out, tgt: out)

    scheds = [build(r) for r in range(world)]

    def rank_main(rank: int) -> None:
        clocks[threading.get_ident()] = _Clock()
        try:
            scheds[rank]._step_microbatches(
                [()] * n_microbatches, [{}] * n_microbatches, [None] * n_microbatches, []
            )
        except BaseException as e:
            with net.cond:
                net.failed.append(e)
                net.cond.notify_all()

    patches = [
        mock.patch.object(S, "_batch_p2p", _batch_p2p(net, clocks)),
        *(
            mock.patch.object(type(sc), name, lambda *a, **k: None)
            for sc in scheds[:1]
            for name in (
                "_initialize_stage" if schedule in _SINGLE else "_initialize_stages",
                "_maybe_compute_loss",
                "_maybe_get_loss",
                "_update_losses",
            )
            if hasattr(sc, name)
        ),
    ]
    for p in patches:
        p.start()
    try:
        # _check_inputs is patched away; _step_microbatches unpacks its result
        for sc in scheds:
            sc._check_inputs = lambda a, k, t, loss: (a, k)
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in reversed(patches):
            p.stop()
    if net.failed:
        raise net.failed[0]
    return times
