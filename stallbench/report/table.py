"""The terminal table of ``report.format_report``: one column per loader, ratio columns against the first.

Plain text, right-aligned values; columns that would pass ``WIDTH`` go on to a second block.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence

from stallbench.analysis.results import LoaderReport, Workload, steady
from stallbench.report.work import column_name, work_rows

__all__ = ["table_text"]

WIDTH = 100
_STAGES = ("fetch", "decode", "collate")

Cell = Callable[[LoaderReport], str]
Ratio = Callable[[LoaderReport, LoaderReport], str]
Row = tuple[str, list[str]]  # label, one cell per column; no cells: a section heading


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _bytes(count: float) -> str:
    """Decimal units: 1_234_000_000 -> '1.23 GB'."""
    if not _finite(count):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000:
            return f"{count:.0f} B" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    return f"{count:.2f} PB"


def _sec(x: float) -> str:
    return f"{x:.2f} s" if _finite(x) else "-"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if _finite(fraction) else "-"


def _part(r: LoaderReport, seconds: float) -> str:
    return f"{_sec(seconds)} ({r.breakdown.percent(seconds):.1f}%)" if _finite(seconds) else "-"


def _speedup(base: LoaderReport, r: LoaderReport) -> str:
    b, o = base.breakdown.epoch_seconds, r.breakdown.epoch_seconds
    if not (_finite(b) and _finite(o)) or b <= 0 or o <= 0:
        return "-"
    return f"{b / o:.2f}x faster" if b >= o else f"{o / b:.2f}x slower"


def _change(value: Callable[[LoaderReport], float]) -> Ratio:
    def ratio(base: LoaderReport, r: LoaderReport) -> str:
        b, o = value(base), value(r)
        return f"{100 * (o - b) / b:+.0f}%" if _finite(b) and _finite(o) and b > 0 else "-"

    return ratio


LEVEL = 0.02  # stalls that differ by less than this share of the baseline's epoch are level...


def _spread(r: LoaderReport, phase: str) -> float:
    """...or by less than the spread of the steady epochs of either loader's run of ``phase`` (its noise)."""
    run = next((run for run in r.runs if run.phase == phase), None)
    seconds = [e.seconds for e in steady(list(run.epochs))] if run is not None else []
    return max(seconds) - min(seconds) if seconds else 0.0


def _level(value: Callable[[LoaderReport], float], phase: str) -> Ratio:
    """'level' where two stalls differ by less than the noise (see LEVEL), else the difference in seconds."""

    def ratio(base: LoaderReport, r: LoaderReport) -> str:
        b, o, epoch = value(base), value(r), base.breakdown.epoch_seconds
        if not (_finite(b) and _finite(o) and _finite(epoch)) or epoch <= 0:
            return "-"
        noise = max(LEVEL * epoch, _spread(base, phase), _spread(r, phase))
        return "level" if abs(o - b) <= noise else f"{o - b:+.2f} s"

    return ratio


def _prep_stall(r: LoaderReport) -> float:
    return r.breakdown.prep_stall_seconds


def _fetch_stall(r: LoaderReport) -> float:
    return r.breakdown.fetch_stall_seconds


def _storage(r: LoaderReport) -> float:
    return r.storage_bytes


def _efficiency(r: LoaderReport) -> str:
    """At most 100%; a bound measured above the epoch (noise) says by how much, rather than hide it."""
    roof = r.roofline
    if not (_finite(roof.bound_ratio) and roof.bound_ratio > 1):
        return _pct(roof.efficiency)
    return f"{_pct(roof.efficiency)} (measured bound {100 * (roof.bound_ratio - 1):.1f}% above the epoch)"


# label, cell, ratio against the baseline (None: no ratio); a row without a cell is a section heading
Spec = tuple[tuple[str, Cell | None, Ratio | None], ...]
_EPOCH_ROWS: Spec = (
    ("steady epoch", None, None),
    ("epoch time", lambda r: _sec(r.breakdown.epoch_seconds), _speedup),
    ("compute", lambda r: _part(r, r.breakdown.compute_seconds), None),
    ("prep stall", lambda r: _part(r, _prep_stall(r)), _level(_prep_stall, "prep")),
    ("fetch stall", lambda r: _part(r, _fetch_stall(r)), _change(_fetch_stall)),
    ("warm-up (apart)", lambda r: _sec(r.breakdown.warmup_seconds), None),
    ("storage read", lambda r: _bytes(r.storage_bytes), _change(_storage)),
    ("  of the dataset", lambda r: _pct(r.storage_bytes / r.dataset_bytes) if r.dataset_bytes else "-", None),
    ("cache hit rate", lambda r: _pct(r.hit_rate), None),
    ("CPU utilisation", lambda r: _pct(r.cpu_utilisation), None),
    ("samples/s", lambda r: f"{r.samples_per_s:,.0f}" if _finite(r.samples_per_s) else "-", None),
)
_MACHINE_ROWS: Spec = (
    ("machine (measured)", None, None),
    ("cores", lambda r: str(r.machine.cores), None),
    ("storage bandwidth", lambda r: f"{_bytes(r.machine.storage_bytes_per_s)}/s", None),
    ("memory bandwidth", lambda r: f"{_bytes(r.machine.memory_bytes_per_s)}/s", None),
    ("prep per core", lambda r: f"{r.machine.prep_samples_per_s_per_core:,.0f} samples/s", None),
    ("roofline (epoch no faster than)", None, None),
    ("compute", lambda r: _sec(r.roofline.compute_seconds), None),
    ("prep", lambda r: _sec(r.roofline.prep_seconds), None),
    ("fetch", lambda r: _sec(r.roofline.fetch_seconds), None),
    ("bound by", lambda r: r.roofline.bound, None),
    ("efficiency", _efficiency, None),
)


def _cold_stages(r: LoaderReport) -> dict[str, float]:
    return next((run.stage_seconds for run in r.runs if run.phase == "cold"), {})


def _stage_spec(reports: Sequence[LoaderReport]) -> Spec:
    """fetch / decode / collate (then any other stage) of each cold run, where one recorded them."""
    found = {name for r in reports for name in _cold_stages(r)}
    names = [s for s in _STAGES if s in found] + sorted(found - set(_STAGES))
    rows = tuple((n, lambda r, n=n: _sec(_cold_stages(r).get(n, math.nan)), None) for n in names)
    return (("stage time, cold run (summed)", None, None), *rows) if rows else ()


def _main_rows(reports: Sequence[LoaderReport]) -> tuple[list[str], list[Row]]:
    base, others = reports[0], reports[1:]
    header = [column_name(r) for r in reports] + [f"{column_name(r)} vs {column_name(base)}" for r in others]
    rows: list[Row] = []
    for label, cell, ratio in _EPOCH_ROWS + work_rows(reports) + _stage_spec(reports) + _MACHINE_ROWS:
        if cell is None:
            rows.append((label, []))
        else:
            ratios = [ratio(base, r) if ratio else "" for r in others]
            rows.append((f"  {label}", [cell(r) for r in reports] + ratios))
    return header, rows


def _whatif_rows(r: LoaderReport) -> tuple[list[str], list[Row]]:
    caches = sorted({p.cache_bytes for p in r.predictions})
    workers = sorted({p.workers for p in r.predictions})
    ran = (r.workload.cache_bytes, r.workload.workers)  # no mark without a cache budget
    cells = {
        (p.cache_bytes, p.workers): ("*" if (p.cache_bytes, p.workers) == ran else "")
        + f"{_sec(p.epoch_seconds)} {p.bound}"
        for p in r.predictions
    }
    header = [f"{w} worker" + ("s" if w != 1 else "") for w in workers]
    return header, [(f"  {_bytes(c)}", [cells.get((c, w), "-") for w in workers]) for c in caches]


def _prefetch_lines(r: LoaderReport) -> list[str]:
    """The what-if of ``prefetch_factor``: one line, the measured factor starred."""
    if not r.prefetch_predictions:
        return []
    ran = r.workload.prefetch_factor
    cells = [
        f"{'*' if p.prefetch_factor == ran else ''}{p.prefetch_factor}: {_sec(p.epoch_seconds)}"
        for p in r.prefetch_predictions
    ]
    bound = r.prefetch_predictions[0].bound
    return textwrap.wrap(
        f"  prefetch_factor {', '.join(cells)} ({bound}: a deeper prefetch does not move the bound, it only "
        "absorbs jitter)",
        WIDTH,
        subsequent_indent="    ",
    )


def _nodes_lines(r: LoaderReport, label: str) -> list[str]:
    """The nodes what-if: storage per steady epoch of N nodes, each with the cache as run, the cache
    partitioned across them or independent; all nodes together and per node."""
    if not r.nodes_predictions:
        return []
    cache = _bytes(r.workload.cache_bytes)
    head = (
        f"nodes what-if{label}: predicted storage read per steady epoch, N nodes with {cache} of cache each"
    )
    header = ["partitioned, all nodes", "per node", "independent, all nodes", "per node"]
    rows: list[Row] = [
        (f"  {p.nodes}", [_bytes(p.partitioned_storage_bytes), _bytes(p.partitioned_storage_bytes_per_node),
                          _bytes(p.independent_storage_bytes), _bytes(p.independent_storage_bytes_per_node)])
        for p in r.nodes_predictions
    ]  # fmt: skip
    return [*textwrap.wrap(head, WIDTH, subsequent_indent="  "), *_render("  nodes", header, rows), ""]


def _chunks(first: int, widths: list[int]) -> list[range]:
    """Consecutive value columns that fit ``WIDTH`` after a label column ``first`` wide."""
    chunks, start, used = [], 0, first
    for i, w in enumerate(widths):
        if i > start and used + 2 + w > WIDTH:
            chunks.append(range(start, i))
            start, used = i, first
        used += 2 + w
    return [*chunks, range(start, len(widths))]


def _render(corner: str, header: list[str], rows: list[Row]) -> list[str]:
    """Aligned lines; columns past ``WIDTH`` go to further blocks, which leave out rows empty there."""
    label_w = max(len(label) for label, cells in [(corner, header), *rows] if cells)
    widths = [max(len(h), *(len(cells[i]) for _, cells in rows if cells)) for i, h in enumerate(header)]
    lines: list[str] = []
    for n, cols in enumerate(_chunks(label_w, widths)):
        lines += [""] if n else []
        lines.append(corner.ljust(label_w) + "".join("  " + header[i].rjust(widths[i]) for i in cols))
        for label, cells in rows:
            text = "".join("  " + cells[i].rjust(widths[i]) for i in cols) if cells else ""
            if n == 0 or text.strip():
                lines.append((label.ljust(label_w) + text).rstrip())
    return lines


def _workload_lines(w: Workload) -> list[str]:
    parts = [
        f"{_bytes(w.dataset_bytes)} on the device ({_bytes(w.record_bytes)} of records)",
        f"{w.samples:,} samples",
        f"batch {w.batch_size}",
        f"{w.workers} workers",
        f"compute {w.compute}",
        f"{w.epochs} epochs",
        "cache budget: the memory available" if w.cache_bytes is None else f"cache {_bytes(w.cache_bytes)}",
        "storage not throttled"
        if w.storage_bytes_per_s is None
        else f"storage throttled to {_bytes(w.storage_bytes_per_s)}/s",
        "memory not limited" if w.memory_bytes is None else f"memory limit {_bytes(w.memory_bytes)}",
    ]
    head = textwrap.wrap(f"workload: {w.data}", WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    if w.command is not None:
        head += textwrap.wrap(f"command: {w.command}", WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return head + textwrap.wrap(", ".join(parts), WIDTH, initial_indent="  ", subsequent_indent="  ")


def _rank_lines(r: LoaderReport, label: str) -> list[str]:
    """Each rank's split (torchrun) with the slowest named, and the loaders other than the training one."""
    lines = []
    if len(r.ranks) > 1:
        lines.append(f"ranks{label}: epoch s / compute / prep stall / fetch stall (the slowest is reported)")
        for rb in r.ranks:
            b, mark = rb.breakdown, "  <- slowest" if rb.rank == r.slowest_rank else ""
            lines.append(
                f"  rank {rb.rank}: {_sec(b.epoch_seconds)}  {_sec(b.compute_seconds)}  "
                f"{_sec(b.prep_stall_seconds)}  {_sec(b.fetch_stall_seconds)}{mark}"
            )
    cold = [run for run in r.runs if run.phase == "cold"]
    sync = [e.cuda_sync_seconds for run in cold for e in run.epochs[1:]]
    if sync and max(sync) > 0:
        lines.append(
            f"CUDA{label}: synchronised at each step boundary, {_sec(sum(sync) / len(sync))} per epoch "
            "(counted in the steps: it waits for the step's own kernels)"
        )
    for o in r.other_loaders:
        lines.append(
            f"other loader{label} {o.loader} (apart from training): {_sec(o.seconds_per_epoch)} per epoch, "
            f"{o.batches_per_epoch:.0f} batches, {o.epochs} epochs"
        )
    return ["", *lines] if lines else []


def _loader_lines(r: LoaderReport, label: str) -> list[str]:
    lines = [*_rank_lines(r, label), ""]
    if r.predictions:
        lines.append(f"what-if{label}: predicted steady epoch and what binds it (* = as run)")
        lines += _render("  cache", *_whatif_rows(r))
        lines += _prefetch_lines(r)
        lines.append("")
    lines += _nodes_lines(r, label)
    lines += textwrap.wrap(
        f"advice{label}: {r.advice}", WIDTH, subsequent_indent="  ", break_on_hyphens=False
    )
    return lines


def table_text(reports: Sequence[LoaderReport]) -> str:
    """The whole report: workload, the side-by-side table, then each loader's what-if and advice."""
    lines = [*_workload_lines(reports[0].workload), ""]
    lines += _render("", *_main_rows(reports))
    for r in reports:
        lines += _loader_lines(r, f" ({column_name(r)})" if len(reports) > 1 else "")
    return "\n".join(lines) + "\n"
