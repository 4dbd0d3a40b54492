"""The terminal table of ``report.format_report``: one column per loader, ratio columns against the first.

Plain text, right-aligned values; columns that would pass ``WIDTH`` go on to a second block.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence

from stallbench._grid import Row, grid
from stallbench._words import counted
from stallbench.analysis.knobs import KNOBS
from stallbench.analysis.request import local_files
from stallbench.analysis.results import LoaderReport, Workload
from stallbench.conditions.load import is_busy
from stallbench.conditions.sizes import format_bytes
from stallbench.report._cells import Spec, finite, pct, sec
from stallbench.report.epoch_rows import epoch_rows
from stallbench.report.work import column_name, work_rows

__all__ = ["table_text"]

WIDTH = 100
_STAGES = ("fetch", "decode", "collate")


def _efficiency(r: LoaderReport) -> str:
    """At most 100%; a bound measured above the epoch (noise) says by how much, rather than hide it."""
    roof = r.roofline
    if not (finite(roof.bound_ratio) and roof.bound_ratio > 1):
        return pct(roof.efficiency)
    return f"{pct(roof.efficiency)} (measured bound {100 * (roof.bound_ratio - 1):.1f}% above the epoch)"


_MACHINE_ROWS: Spec = (
    ("machine (measured)", None, None),
    ("cores", lambda r: str(r.machine.cores), None),
    ("storage bandwidth", lambda r: f"{format_bytes(r.machine.storage_bytes_per_s)}/s", None),
    ("memory bandwidth", lambda r: f"{format_bytes(r.machine.memory_bytes_per_s)}/s", None),
    ("prep per core", lambda r: f"{r.machine.prep_samples_per_s_per_core:,.0f} samples/s", None),
    ("roofline (epoch no faster than)", None, None),
    ("compute", lambda r: sec(r.roofline.compute_seconds), None),
    ("prep", lambda r: sec(r.roofline.prep_seconds), None),
    ("fetch", lambda r: sec(r.roofline.fetch_seconds), None),
    ("bound by", lambda r: r.roofline.bound, None),
    ("efficiency", _efficiency, None),
    ("other work on the machine", lambda r: f"{_other_load(r):.2f} cores (busiest run)", None),
)


def _other_load(r: LoaderReport) -> float:
    return max((run.other_load_cores for run in r.runs), default=0.0)


def _busy_lines(r: LoaderReport, label: str) -> list[str]:
    """One line where other work took enough of the machine to be in the figures, which cannot tell it
    apart from the job's own."""
    load, cores = _other_load(r), r.machine.cores
    if not is_busy(load, cores):
        return []
    said = (
        f"busy machine{label}: other work kept {load:.2f} of its {cores} cores busy during the runs; the "
        "figures above include its effect and stallbench cannot separate it from the job's own: measure on "
        "a quieter machine to trust the split"
    )
    return [*textwrap.wrap(said, WIDTH, subsequent_indent="  ", break_on_hyphens=False), ""]


def _cold_stages(r: LoaderReport) -> dict[str, float]:
    return next((run.stage_seconds for run in r.runs if run.phase == "cold"), {})


def _stage_spec(reports: Sequence[LoaderReport]) -> Spec:
    """fetch / decode / collate (then any other stage) of each cold run, where one recorded them."""
    found = {name for r in reports for name in _cold_stages(r)}
    names = [s for s in _STAGES if s in found] + sorted(found - set(_STAGES))
    rows = tuple((n, lambda r, n=n: sec(_cold_stages(r).get(n, math.nan)), None) for n in names)
    return (("stage time, cold run (summed)", None, None), *rows) if rows else ()


def _main_rows(reports: Sequence[LoaderReport]) -> tuple[list[str], list[Row]]:
    base, others = reports[0], reports[1:]
    header = [column_name(r) for r in reports] + [f"{column_name(r)} vs {column_name(base)}" for r in others]
    rows: list[Row] = []
    for label, cell, ratio in epoch_rows(reports) + work_rows(reports) + _stage_spec(reports) + _MACHINE_ROWS:
        if cell is None:
            rows.append((label, []))
        else:
            ratios = [ratio(base, r) if ratio else "" for r in others]
            rows.append((f"  {label}", [cell(r) for r in reports] + ratios))
    return header, rows


def _whatif_lines(r: LoaderReport, label: str) -> list[str]:
    """The what-if of cache sizes and worker counts: a table, the measured point starred."""
    if not r.predictions:
        return []
    head = f"what-if{label}: predicted steady epoch and what binds it (* = as run)"
    return [head, *grid("  cache", *_whatif_rows(r), WIDTH)]


def _whatif_rows(r: LoaderReport) -> tuple[list[str], list[Row]]:
    caches = sorted({p.cache_bytes for p in r.predictions})
    workers = sorted({p.workers for p in r.predictions})
    ran = (r.workload.cache_bytes, r.workload.workers)  # no mark without a cache budget
    cells = {
        (p.cache_bytes, p.workers): ("*" if (p.cache_bytes, p.workers) == ran else "")
        + f"{sec(p.epoch_seconds)} {p.bound}"
        for p in r.predictions
    }
    header = [counted(w, "worker") for w in workers]
    return header, [(f"  {format_bytes(c)}", [cells.get((c, w), "-") for w in workers]) for c in caches]


def _prefetch_lines(r: LoaderReport, label: str) -> list[str]:
    """The what-if of ``prefetch_factor``: one line, the measured factor starred."""
    if not r.prefetch_predictions:
        return []
    ran = r.workload.prefetch_factor
    cells = [
        f"{'*' if p.prefetch_factor == ran else ''}{p.prefetch_factor}: {sec(p.epoch_seconds)}"
        for p in r.prefetch_predictions
    ]
    bound = r.prefetch_predictions[0].bound
    return textwrap.wrap(
        f"  prefetch_factor {', '.join(cells)} ({bound}: a deeper prefetch does not move the bound, it only "
        "absorbs jitter)",
        WIDTH,
        subsequent_indent="    ",
    )


def _form_lines(r: LoaderReport, label: str) -> list[str]:
    """The what-if of the form our cache holds its records in: one line, the form as run starred."""
    if not r.form_predictions:
        return []
    cells = [f"{'*' if p.as_run else ''}{p.form}: {sec(p.epoch_seconds)}" for p in r.form_predictions]
    return textwrap.wrap(
        f"  cache_form {', '.join(cells)} (the loader's own weighing of the records it probed, scaled to "
        "this run)",
        WIDTH,
        subsequent_indent="    ",
    )


def _nodes_lines(r: LoaderReport, label: str) -> list[str]:
    """The nodes what-if: a steady epoch of N nodes, each with the cache as run, the cache partitioned
    across them or independent: a node's epoch, storage read by all nodes together and per node."""
    if not r.nodes_predictions:
        return []
    cache = format_bytes(r.workload.cache_bytes)
    head = (
        f"nodes what-if{label}: predicted steady epoch, N nodes with {cache} of cache each sharing the "
        "storage; partitioned (partition_cache=True; split: remote records read from storage) or independent"
    )
    header = ["partitioned", "storage", "per node", "split", "independent", "storage", "per node"]
    rows: list[Row] = []
    for p in r.nodes_predictions:
        partitioned = (p.partitioned_storage_bytes, p.partitioned_storage_bytes_per_node)
        independent = (p.independent_storage_bytes, p.independent_storage_bytes_per_node)
        cells = [sec(p.partitioned_epoch_seconds), *map(format_bytes, partitioned), pct(p.storage_share)]
        rows.append(
            (f"  {p.nodes}", [*cells, sec(p.independent_epoch_seconds), *map(format_bytes, independent)])
        )
    return ["", *textwrap.wrap(head, WIDTH, subsequent_indent="  "), *grid("  nodes", header, rows, WIDTH)]


def _workload_lines(w: Workload) -> list[str]:
    where = "on the device" if local_files(w.data) else "in object storage (storage = the network below)"
    parts = [
        f"{format_bytes(w.dataset_bytes)} {where} ({format_bytes(w.record_bytes)} of records)",
        f"{w.samples:,} samples",
        f"batch {w.batch_size}",
        counted(w.workers, "worker"),
        f"compute {w.compute}",
        counted(w.epochs, "epoch"),
        "cache budget: the memory available"
        if w.cache_bytes is None
        else f"cache {format_bytes(w.cache_bytes)}",
        *w.limits.said(),
    ]
    head = textwrap.wrap(f"workload: {w.data}", WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    if w.command is not None:
        head += textwrap.wrap(f"command: {w.command}", WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return head + textwrap.wrap(", ".join(parts), WIDTH, initial_indent="  ", subsequent_indent="  ")


def _holding_line(r: LoaderReport) -> list[str]:
    """The rank whose data holds the others at the collectives, and for how long (its last epoch)."""
    holding = next((rb for rb in r.ranks if rb.rank == r.holding_rank), None)
    if holding is None:
        return []
    return textwrap.wrap(
        f"rank {holding.rank}'s data holds the others: they wait {sec(holding.holds_others_seconds)} an "
        "epoch at the steps' collectives for its batches (counted in their compute)",
        WIDTH,
        initial_indent="  ",
        subsequent_indent="  ",
    )


def _slow_sample_lines(r: LoaderReport, label: str) -> list[str]:
    """The slowest samples by index, prep time and file (where the Dataset lists its files)."""
    if not r.slow_samples:
        return []
    named = ", ".join(
        f"#{s.index} {1000 * s.seconds:.1f} ms" + (f" ({s.path})" if s.path else "") for s in r.slow_samples
    )
    said = f"slowest samples{label}: {named}; {r.slow_sample_count} took 4x their process's mean or more"
    return textwrap.wrap(said, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def _rank_lines(r: LoaderReport, label: str) -> list[str]:
    """Each rank's split (torchrun) with the slowest named, the slowest samples, and the loaders other than
    the training one."""
    lines = _slow_sample_lines(r, label)
    if len(r.ranks) > 1:
        lines.append(f"ranks{label}: epoch s / compute / prep stall / fetch stall / waited for other ranks")
        for rb in r.ranks:
            b, mark = rb.breakdown, "  <- slowest" if rb.rank == r.slowest_rank else ""
            lines.append(
                f"  rank {rb.rank}: {sec(b.epoch_seconds)}  {sec(b.compute_seconds)}  "
                f"{sec(b.prep_stall_seconds)}  {sec(b.fetch_stall_seconds)}  "
                f"{sec(rb.waits_for_others_seconds)}{mark}"
            )
        lines += _holding_line(r)
    cold = [run for run in r.runs if run.phase == "cold"]
    sync = [e.cuda_sync_seconds for run in cold for e in run.epochs[1:]]
    if sync and max(sync) > 0:
        lines.append(
            f"CUDA{label}: synchronised at each step boundary, {sec(sum(sync) / len(sync))} per epoch "
            "(counted in the steps: it waits for the step's own kernels)"
        )
    for o in r.other_loaders:
        lines.append(
            f"evaluation loader{label} {o.loader}: {sec(o.seconds_per_epoch)} a pass, "
            f"{counted(o.batches_per_epoch, 'batch', 'batches')}, {counted(o.epochs, 'pass', 'passes')} "
            "(in the evaluation rows above, not again)"
        )
    return ["", *lines] if lines else []


# How each knob of the what-if table (``stallbench.analysis.knobs``) is drawn: its lines, given the report and
# the loader's label ("" alone, " (name)" in a comparison); none where it predicted nothing.
DRAWN: dict[str, Callable[[LoaderReport, str], list[str]]] = {
    "predictions": _whatif_lines,
    "prefetch_predictions": _prefetch_lines,
    "form_predictions": _form_lines,
    "nodes_predictions": _nodes_lines,
}


def _loader_lines(r: LoaderReport, label: str) -> list[str]:
    lines = [*_rank_lines(r, label), ""]
    what_if = [line for knob in KNOBS for line in DRAWN[knob.name](r, label)]
    lines += [*what_if, ""] if what_if else []
    lines += _busy_lines(r, label)
    lines += textwrap.wrap(
        f"advice{label}: {r.advice}", WIDTH, subsequent_indent="  ", break_on_hyphens=False
    )
    return lines


def table_text(reports: Sequence[LoaderReport]) -> str:
    """The whole report: workload, the side-by-side table, then each loader's what-if and advice."""
    lines = [*_workload_lines(reports[0].workload), ""]
    lines += grid("", *_main_rows(reports), WIDTH)
    for r in reports:
        lines += _loader_lines(r, f" ({column_name(r)})" if len(reports) > 1 else "")
    return "\n".join(lines) + "\n"
