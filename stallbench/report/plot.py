"""The PNG of ``report.write_plot``: where a steady epoch goes, and the wait per iteration of each cold run.

matplotlib is imported inside :func:`png_bytes` (the CLI starts without it) and drawn on a bare ``Figure``
with the Agg canvas, so no pyplot state and no backend switch leak into the caller's process.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from stallbench._words import counted
from stallbench.analysis.results import LoaderReport
from stallbench.report.work import column_name

__all__ = ["png_bytes", "simulation_png_bytes"]

_PARTS = (  # stacked bottom to top: label, colour, seconds of a breakdown
    ("compute", "#4c78a8", lambda b: b.compute_seconds),
    ("prep stall", "#f58518", lambda b: b.prep_stall_seconds),
    ("fetch stall", "#e45756", lambda b: b.fetch_stall_seconds),
)


def _nonneg(x: float) -> float:
    return x if math.isfinite(x) and x > 0 else 0.0


def _breakdown_panel(ax: Any, reports: Sequence[LoaderReport]) -> None:
    names = [column_name(r) for r in reports]
    bottoms = [0.0] * len(reports)
    for label, colour, seconds in _PARTS:
        heights = [_nonneg(seconds(r.breakdown)) for r in reports]
        ax.bar(names, heights, bottom=bottoms, color=colour, label=label, width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for x, r in enumerate(reports):
        ax.annotate(
            f"{r.breakdown.epoch_seconds:.2f} s" if math.isfinite(r.breakdown.epoch_seconds) else "-",
            (x, bottoms[x]),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
        )
    ax.set_xlim(-0.9, len(reports) - 0.1)
    ax.set_ylim(0, max(max(bottoms), 1e-9) * 1.3)
    ax.set_ylabel("seconds per steady epoch")
    ax.set_title("Where a steady epoch goes")
    ax.legend(loc="upper center", ncols=3, frameon=False, fontsize="small", handlelength=1.0)


def _cold_waits(r: LoaderReport) -> list[float]:
    run = next((run for run in r.runs if run.phase == "cold"), None)
    return [wait for wait, _step in run.timeline] if run is not None else []


def _timeline_panel(ax: Any, reports: Sequence[LoaderReport]) -> None:
    """Scaled to the steady iterations; a first batch (worker start-up) off that scale is in the legend."""
    waits = {column_name(r): _cold_waits(r) for r in reports}
    top = 1.3 * max((x for s in waits.values() for x in s[1:] if math.isfinite(x)), default=0.0)
    for name, series in waits.items():
        if series:
            off = top > 0 and series[0] > top
            label = f"{name} (first batch {series[0]:.2f} s, off scale)" if off else name
            ax.plot(range(1, len(series) + 1), series, label=label, linewidth=1.0, alpha=0.85)
    ax.set_ylim(0, top if top > 0 else None)
    if any(waits.values()):
        ax.legend(loc="upper right", frameon=False)
    else:
        ax.text(0.5, 0.5, "no cold-run timeline recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_xlabel("iteration (last epoch of the cold run)")
    ax.set_ylabel("wait for the batch (s)")
    ax.set_title("Waiting for data, cold run")


def png_bytes(reports: Sequence[LoaderReport]) -> bytes:
    """Both panels side by side, titled with the workload, as PNG bytes."""
    from matplotlib.figure import Figure

    w = reports[0].workload
    fig = Figure(figsize=(12, 4.8), dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(1, 2))
    _breakdown_panel(left, reports)
    _timeline_panel(right, reports)
    workers = counted(w.workers, "worker")
    fig.suptitle(f"{w.data}: {w.samples:,} samples, batch {w.batch_size}, {workers}, {w.compute}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def simulation_png_bytes(results: Sequence[Any]) -> bytes:
    """Hit rate per epoch of each simulated policy, grouped bars, as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(results)
    for k, result in enumerate(results):
        xs = [e.epoch + k * width for e in result.epochs]
        ax.bar(xs, [e.hit_rate for e in result.epochs], width, label=result.policy)
    ax.set_xlabel("epoch")
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1)
    ax.legend()
    first = results[0]
    ax.set_title(f"{first.records:,} records, {first.cache_records:,} cached per node, {first.nodes} node(s)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
