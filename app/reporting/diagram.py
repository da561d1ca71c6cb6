"""The reliability diagram, drawn with matplotlib's Agg backend (no display needed).

Top panel: observed frequency against mean prediction per bin, with Wilson
intervals, for each curve (the raw scores and the cross-fitted calibrated
probabilities), and the diagonal of perfect calibration. Bottom panel: how
many predictions fall in each bin, with the counts written on the bars.
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

COLORS = {"before": "#c0504d", "after": "#1f77b4"}
LABELS = {"before": "raw scores", "after": "calibrated (cross-fitted)"}


def _points(bins: list[dict[str, Any]]) -> tuple[list, list, list, list]:
    filled = [b for b in bins if b["count"]]
    x = [b["mean_prediction"] for b in filled]
    y = [b["observed_frequency"] for b in filled]
    low = [max(b["observed_frequency"] - b["wilson"][0], 0.0) for b in filled]
    high = [max(b["wilson"][1] - b["observed_frequency"], 0.0) for b in filled]
    return x, y, low, high


def diagram_figure(curves: dict[str, dict[str, Any]], title: str, ece: dict[str, float] | None = None) -> Figure:
    """A figure of reliability curves, each a ``reliability`` dict as POST /evaluate returns it."""
    figure = Figure(figsize=(6.4, 7.2), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    top.plot([0, 1], [0, 1], linestyle="--", color="0.5", linewidth=1, label="perfect calibration")
    first = next(iter(curves.values()))
    top_label = first.get("target") == "top_label"
    n = len(curves)
    for index, (name, curve) in enumerate(curves.items()):
        color = COLORS.get(name, f"C{index}")
        label = LABELS.get(name, name)
        if ece and name in ece:
            label += f" (ECE {ece[name]:.4f})"
        x, y, low, high = _points(curve["bins"])
        top.errorbar(x, y, yerr=[low, high], marker="o", markersize=4, capsize=2, color=color, label=label)
        width = (curve["bins"][0]["upper"] - curve["bins"][0]["lower"]) / n
        centers = [(b["lower"] + b["upper"]) / 2 - width * (n - 1) / 2 + width * index for b in curve["bins"]]
        counts = [b["count"] for b in curve["bins"]]
        bars = bottom.bar(centers, counts, width=width * 0.95, color=color, alpha=0.8, label=LABELS.get(name, name))
        bottom.bar_label(bars, labels=[str(c) if c else "" for c in counts], fontsize=6, rotation=90, padding=1)
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("observed frequency" + (" of the top label" if top_label else " of class 1"))
    top.set_title(title)
    top.grid(True, alpha=0.3)
    top.legend(loc="upper left", fontsize=8)
    bottom.set_xlabel(("top-label confidence" if top_label else "predicted probability") + " (mean in bin)")
    bottom.set_ylabel("count")
    bottom.margins(y=0.35)
    bottom.grid(True, axis="y", alpha=0.3)
    return figure


def print_svg(figure: Figure, buffer) -> None:
    """SVG with text kept as text (searchable, selectable, readable by screen readers)."""
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        FigureCanvasSVG(figure).print_svg(buffer)


def render_diagram(curves: dict[str, dict[str, Any]], title: str, format: str, ece: dict[str, float] | None = None) -> bytes:
    """The diagram as PNG or SVG bytes."""
    figure = diagram_figure(curves, title, ece)
    buffer = io.BytesIO()
    if format == "svg":
        print_svg(figure, buffer)
    else:
        FigureCanvasAgg(figure)
        figure.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()
