"""Gantt charts of simulated (and, later, measured) pipeline timelines, with matplotlib.

One row per rank, one bar per action coloured by kind (F, B, I, W); a hatched bar marks an
action in which some groups are frozen, its label the share of weight-gradient work skipped.
Timelines are drawn one above the other on a shared time axis so the saving is visible. The
function returns a Figure and never writes files: the caller saves it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from freezeopt.actions import Action
from freezeopt.model.dag import PipelineDag
from freezeopt.model.simulate import Timeline

__all__ = ["GanttPanel", "gantt_figure"]

COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#64B5CD", "W": "#DD8452"}


@dataclass(frozen=True, slots=True)
class GanttPanel:
    """One timeline to draw: a title, the timeline and the frozen share per action (0..1)."""

    title: str
    timeline: Timeline
    frozen_share: Mapping[Action, float]


def gantt_figure(dag: PipelineDag, panels: Sequence[GanttPanel]) -> Figure:
    """A figure with one Gantt panel per timeline, shared time axis."""
    n_ranks = len(dag.rank_actions)
    fig = Figure(figsize=(12, 0.9 + len(panels) * (0.5 * n_ranks + 0.8)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    span = max((p.timeline.makespan for p in panels), default=1.0) or 1.0
    for ax, panel in zip(axes, panels, strict=True):
        tl = panel.timeline
        for r, acts in enumerate(dag.rank_actions):
            y = n_ranks - 1 - r
            for a in acts:
                start, width = tl.start[a], tl.end[a] - tl.start[a]
                share = panel.frozen_share.get(a, 0.0)
                ax.broken_barh(
                    [(start, max(width, span * 1e-4))],
                    (y - 0.4, 0.8),
                    facecolors=COLORS[a.kind],
                    edgecolor="white" if share == 0 else "black",
                    linewidth=0.5,
                    hatch="///" if share > 0 else None,
                )
                if width > span * 0.025:
                    ax.text(
                        start + width / 2,
                        y,
                        str(a),
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white",
                    )
        ax.set_yticks(range(n_ranks), [f"rank {n_ranks - 1 - i}" for i in range(n_ranks)])
        ax.set_title(f"{panel.title}: step {tl.makespan:.1f} ms", fontsize=9, loc="left")
        ax.set_xlim(0, span * 1.01)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("time in step (ms)")
    handles = [Patch(facecolor=c, label=k) for k, c in COLORS.items()]
    handles.append(
        Patch(facecolor="white", edgecolor="black", hatch="///", label="some groups frozen")
    )
    fig.legend(
        handles=handles, loc="outside upper right", ncols=len(handles), fontsize=8, frameon=False
    )
    return fig
