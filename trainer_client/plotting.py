"""Shared pieces of the figures drawn over optimizer steps (`coding-train plot`, benchmarks/learning_curve.py):
whole-number step ticks, the value at each point while the points are few, and an empty panel that says so."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_LABELLED_POINTS = 12
"""Up to this many steps, every step gets a tick and every point its value; beyond, labels would overlap."""


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend: figures are written to files, on machines without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def step_axis(axis: Any, steps: Sequence[int]) -> None:
    """An x axis of optimizer steps with whole-number ticks only (a step 1.5 does not exist)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_xlabel("optimizer step")
    shown = sorted(set(steps))
    if shown and len(shown) <= MAX_LABELLED_POINTS:
        axis.set_xticks(shown)
        axis.set_xlim(shown[0] - 0.5, shown[-1] + 0.5)
    else:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def count_axis(axis: Any, label: str) -> None:
    """A y axis of counts, with whole-number ticks only."""
    from matplotlib.ticker import MaxNLocator

    axis.set_ylabel(label)
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))


def label_points(axis: Any, xs: Sequence[float], ys: Sequence[float], *, fmt: str = "{:.2f}", color: Any = None) -> None:
    """Each point's value above it while the points are few: a flat line at 0 is otherwise read as no line."""
    if len(xs) > MAX_LABELLED_POINTS:
        return
    for x, y in zip(xs, ys):
        axis.annotate(fmt.format(y), (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7, color=color)


def no_data(axis: Any, reason: str = "no data") -> None:
    """An empty panel that says why, instead of axes at zero that read as a measured zero."""
    axis.text(0.5, 0.5, reason, transform=axis.transAxes, ha="center", va="center", fontsize=11, color="gray")
    axis.set_xticks([])
    axis.set_yticks([])
