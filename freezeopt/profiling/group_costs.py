"""What freezing saves in time, measured per stage: each group's weight-gradient cost and what
backward truncation saves, on a real microbatch after training.

Why apart from the training loop: these are micro-benchmarks of one stage in isolation — the
microbatch the last measured step captured (its input, target and incoming gradient) — repeated
`cost_samples` rounds, in the form the stage's weight gradients take in the schedule.

* Stages with full backwards (B), and stage 0 of split schedules (whose W is torch's full
  backward): one forward, then per round `torch.autograd.grad` over the retained graph with
  inputs = the stage input plus (a) all parameters, (b) all parameters except group g, for each
  g, (c) no parameters; and, for truncation, with no stage input and the parameters of groups
  j, j+1, … only (plus any parameter in no group), for j = 0 … G: autograd then stops below the
  first of them.
* The other stages of split schedules (I then W): per round a fresh forward and torch's I step,
  then torch's W step (`stage_backward_weight`) restricted to (a) all parameters or (b) all but
  group g — how a runtime skips frozen groups in W. They are not truncated.

A group's cost is the median over rounds of (a) − (b), paired within a round: the time freezing g
alone saves. For stages after the first the group costs add up to (a) − (c), the stage's
weight-gradient time, within noise; on the first stage freezing a group can also skip
backpropagating to the layers below it, so leave-one-out costs are not additive there and sum to
less. Truncation's gains, per round: entry 0 = (a) − t_0 (the stage's input gradient not needed),
entry j = t_j−1 − t_j − (group j−1's cost) (what stopping above group j saves beyond that group's
own weight gradient). Negative differences (noise) are clipped to 0 when the profile is assembled,
and scaled down with the group costs where they add up to more than one of the stage's B/W actions
took in the pipeline (`freezeopt.profiling.assemble`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["WARMUP_ROUNDS", "Capture", "CostMeter", "cost_mode"]

WARMUP_ROUNDS = 2
"""Rounds run before the ones kept (allocator and caches settle)."""


def cost_mode(rank_actions: Sequence[Any], stage: int) -> str:
    """How `stage`'s weight gradients run in the schedule, from its rank's actions: `split` when
    they run in W actions after an I (never stage 0, whose W is torch's whole backward), else
    `full`."""
    acts = [a for a in rank_actions if a.stage == stage]
    n_w = sum(a.kind == "W" for a in acts)
    n_b = sum(a.kind == "B" for a in acts)
    return "split" if stage != 0 and n_w > n_b else "full"


class Capture:
    """What a measured step's microbatch 0 leaves for `CostMeter` (per stage: its input and the
    gradient that came back for its output; the last stage's target) and each stage's output
    shape (for the lag ping-pong), taken by forward hooks on the stage modules.

    `current()` names the action running (`(stage, kind, microbatch)` or None); the owner sets
    `recording` in measured steps and `on` in the step to capture."""

    def __init__(self, last: int, current: Callable[[], tuple[int, str, int] | None]) -> None:
        self.last, self.current = last, current
        self.on = False
        self.recording = False
        self.inputs: dict[int, tuple[Any, ...]] = {}
        self.grads: dict[int, list[Any]] = {}
        self.target: Any = None
        self.act_shapes: dict[int, tuple[tuple[int, ...], str]] = {}

    def hook(self, mod: Any, s: int) -> None:
        """Hook stage `s`'s module `mod`."""
        mod.register_forward_pre_hook(self._pre_hook(s))
        mod.register_forward_hook(self._post_hook(s))

    def take_target(self, target: Any) -> None:
        """Keep the last stage's target of microbatch 0 (call it from the loss)."""
        self.target = target.detach().clone() if hasattr(target, "detach") else target

    def _pre_hook(self, s: int) -> Callable[..., None]:
        def hook(mod: Any, args: tuple[Any, ...]) -> None:
            if self.on and self.current() == (s, "F", 0):
                self.inputs[s] = tuple(
                    a.detach().clone().requires_grad_(a.requires_grad)
                    if hasattr(a, "detach")
                    else a
                    for a in args
                )

        return hook

    def _post_hook(self, s: int) -> Callable[..., None]:
        def hook(mod: Any, args: tuple[Any, ...], out: Any) -> None:
            if self.current() != (s, "F", 0) or not self.recording:
                return
            outs = out if isinstance(out, tuple) else (out,)
            if s not in self.act_shapes and hasattr(outs[0], "shape"):
                self.act_shapes[s] = (tuple(outs[0].shape), str(outs[0].dtype))
            if self.on and s != self.last:
                slots: list[Any] = [None] * len(outs)
                self.grads[s] = slots
                for i, t in enumerate(outs):
                    if getattr(t, "requires_grad", False):
                        t.register_hook(
                            lambda g, i=i, slots=slots: slots.__setitem__(i, g.detach().clone())
                        )

        return hook


class CostMeter:
    """Times the backward variants of this rank's stages on the captured microbatch."""

    def __init__(
        self,
        *,
        mods: dict[int, Any],
        params: dict[int, list[Any]],
        group_idx: dict[int, list[tuple[str, list[int]]]],
        loss_fn: Callable[..., Any],
        last: int,
        clock: Any,
        beat: Any,
        captured: Capture,
    ) -> None:
        self.mods, self.params, self.group_idx = mods, params, group_idx
        self.loss_fn, self.last, self.clock, self.beat = loss_fn, last, clock, beat
        self.captured = captured

    @classmethod
    def of(cls, profiler: Any, *, beat: Any) -> CostMeter:
        """The meter of a profiling rank: its `mods`, `params`, `group_idx`, `loss_fn`, `last`,
        `clock` and the `cap` its last measured step filled (both profilers keep them so)."""
        return cls(
            mods=profiler.mods,
            params=profiler.params,
            group_idx=profiler.group_idx,
            loss_fn=profiler.loss_fn,
            last=profiler.last,
            clock=profiler.clock,
            beat=beat,
            captured=profiler.cap,
        )

    def _stage_graph(self, s: int) -> tuple[list[Any], list[Any] | None, list[Any]]:
        """A fresh forward of stage `s` on the captured microbatch: (outputs, output grads, inputs)."""
        import torch

        if s not in self.captured.inputs:
            raise RuntimeError(
                f"stage {s}: no microbatch input was captured for the cost measurement"
            )
        inp = tuple(
            a.detach().clone().requires_grad_(a.requires_grad) if hasattr(a, "detach") else a
            for a in self.captured.inputs[s]
        )
        with torch.enable_grad():
            raw = self.mods[s](*inp)
            if s == self.last:
                return [self.loss_fn(raw, self.captured.target)], None, list(inp)
        seq = list(raw) if isinstance(raw, tuple) else [raw]
        slots = self.captured.grads.get(s, [])
        pairs = [(t, g) for t, g in zip(seq, slots, strict=False) if g is not None]
        if not pairs:
            raise RuntimeError(
                f"stage {s}: no output gradient was captured for the cost measurement"
            )
        return [t for t, _ in pairs], [g for _, g in pairs], list(inp)

    def group_costs(
        self, modes: dict[int, str], samples_wanted: int
    ) -> dict[int, dict[str, tuple[float, ...]]]:
        """Per stage in `modes` (`full` or `split`, how its weight gradients run): the samples
        of `samples_wanted` rounds (after `WARMUP_ROUNDS`) — 'all', 'none', each group's
        leave-one-out cost and, for full backwards, 'truncation.j' (the module docstring)."""
        out: dict[int, dict[str, tuple[float, ...]]] = {}
        for s, mode in modes.items():
            groups = self.group_idx[s]
            every = list(range(len(self.params[s])))
            measure = self._split_w_ms if mode == "split" else self._full_backward_ms
            samples: dict[str, list[float]] = {"all": [], "none": []}
            for g, _ in groups:
                samples[g] = []
            graph = self._stage_graph(s) if mode == "full" else None
            grouped = {i for _, idx in groups for i in idx}
            ungrouped = [i for i in every if i not in grouped]
            for rnd in range(samples_wanted + WARMUP_ROUNDS):
                a = measure(s, graph, every)
                loo = {
                    g: a - measure(s, graph, [i for i in every if i not in set(idx)])
                    for g, idx in groups
                }
                n = measure(s, graph, [])
                # truncation: no input gradient, the first j groups frozen (full backwards only)
                trunc: list[float] = []
                if graph is not None:
                    ts = [
                        self._truncated_ms(
                            s, graph, ungrouped + [i for _, idx in groups[j:] for i in idx]
                        )
                        for j in range(len(groups) + 1)
                    ]
                    # entry 0 is the input gradient's work: none where no input needs one
                    needs = any(getattr(t, "requires_grad", False) for t in graph[2])
                    trunc = [a - ts[0] if needs else 0.0] + [
                        ts[j - 1] - ts[j] - loo[groups[j - 1][0]] for j in range(1, len(ts))
                    ]
                if rnd >= WARMUP_ROUNDS:
                    samples["all"].append(a)
                    samples["none"].append(n)
                    for g, v in loo.items():
                        samples[g].append(v)
                    for j, v in enumerate(trunc):
                        samples.setdefault(f"truncation.{j}", []).append(v)
                self.beat.tick()
            for p in self.params[s]:
                p.grad = None
            out[s] = {k: tuple(v) for k, v in samples.items()}
        return out

    def _full_backward_ms(self, s: int, graph: Any, active: Sequence[int]) -> float:
        """Cost of a full backward (input gradient plus params[active]) over the retained graph."""
        outs, grads, inputs = graph
        ins = [t for t in inputs if hasattr(t, "requires_grad") and t.requires_grad]
        return self._timed_grad(outs, grads, ins + [self.params[s][i] for i in active])

    def _truncated_ms(self, s: int, graph: Any, active: Sequence[int]) -> float:
        """Cost of a backward over the retained graph for params[active] only, no input gradient:
        autograd stops below the first of them."""
        outs, grads, _ = graph
        return self._timed_grad(outs, grads, [self.params[s][i] for i in active])

    def _split_w_ms(self, s: int, graph: Any, active: Sequence[int]) -> float:
        """Cost of torch's W step for params[active] after its I step, on a fresh forward (0 if none)."""
        from freezeopt.torchpp import adapter as torch_pp

        if not active:
            return 0.0
        outs, grads, inputs = self._stage_graph(s)
        weight = torch_pp.split_backward(outs, grads, inputs, self.params[s])
        tok = self.clock.start()
        weight(active)
        cost = self.clock.stop(tok)
        self.clock.sync()
        return self.clock.resolve(cost)

    def _timed_grad(self, outs: list[Any], grads: list[Any] | None, targets: list[Any]) -> float:
        """Cost (ms) of one `autograd.grad` from `outs` to `targets` over the retained graph; 0 if no targets."""
        import torch

        if not targets:
            return 0.0
        tok = self.clock.start()
        torch.autograd.grad(outs, targets, grad_outputs=grads, retain_graph=True, allow_unused=True)
        cost = self.clock.stop(tok)
        self.clock.sync()
        return self.clock.resolve(cost)
