"""A what-if or an advice checked by running it: the user's command run cold once more with one setting
changed (workers, prefetch depth, our loader's cache or the form of its records), its steady epoch against
the prediction.

``--apply`` runs the setting the advice names, and only that one; an advice no run can make as it stands
(a page cache of another size: the kernel gives the page cache what memory is free) is said, not run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import fmean
from typing import IO

from stallbench.analysis.arguments import cache_arguments
from stallbench.analysis.results import Advised, LoaderReport, steady
from stallbench.analysis.training import train_epochs
from stallbench.analysis.user_analysis import UserJob, run_once
from stallbench.conditions.sizes import format_bytes
from stallbench.conditions.storage import evict_page_cache
from stallbench.jobs.kinds import CACHED, KINDS

__all__ = ["HOLDS", "Applied", "NotRunnable", "apply_advice", "run_setting"]


def run_setting(
    job: UserJob,
    kind: str,
    *,
    workers: int | None = None,
    cache_bytes: int | None = None,
    prefetch_factor: int | None = None,
    cache_form: str | None = None,
    log: IO[str] | None = None,
) -> float:
    """The steady epoch of the training loader in one cold run of ``job`` with loaders ``kind`` ("as-is",
    "torch" or "cached"), every DataLoader built with ``workers`` and ``prefetch_factor`` (None: as the
    script wrote them) and our cache at ``cache_bytes`` holding ``cache_form`` (None: as written)."""
    evict_page_cache(job.data)
    options = dict(workers=workers, prefetch_factor=prefetch_factor, cache_form=cache_form)
    run = run_once(job, kind, cache_bytes, job.cgroup(), log, **options)
    epochs = max(train_epochs(run.records, "the run").values(), key=lambda rows: rows[-1].seconds)
    return fmean(r.seconds for r in steady(epochs))


HOLDS = 0.15  # a measured epoch within this share of its prediction: the prediction holds


@dataclass(frozen=True)
class Applied:
    """``--apply``: the advised setting run cold, against what was predicted for it and the steady epoch as
    the analysis ran it (``as_run_spread``: half the range of its steady epochs)."""

    setting: str
    predicted_seconds: float
    measured_seconds: float
    as_run_seconds: float
    as_run_spread: float = 0.0

    @property
    def error(self) -> float:
        return self.measured_seconds / self.predicted_seconds - 1.0

    @property
    def gained(self) -> bool:
        """Whether the run was faster than as run, beyond the spread of the analysed epochs."""
        return self.measured_seconds < self.as_run_seconds - self.as_run_spread

    def said(self) -> str:
        """Predicted against measured, and what the run says of the prediction: it holds, it holds but its
        gain is noise, it is off but the setting gained, or the run contradicts it (off, and no faster than
        as run: no gain)."""
        figures = f"predicted {self.predicted_seconds:.2f} s, measured {self.measured_seconds:.2f} s"
        head = f"{self.setting}: steady epoch {figures} ({self.error:+.0%}), "
        head += f"as run {self.as_run_seconds:.2f} s"
        holds = abs(self.error) <= HOLDS
        if not self.gained and holds:
            return f"{head}: within {HOLDS:.0%} of the prediction, but the gain is within the epochs' noise"
        if not self.gained:
            return f"{head}: the run contradicts the prediction (no faster than as run): keep it as run"
        if holds:
            return f"{head}: the prediction holds (within {HOLDS:.0%})"
        gain = 1.0 - self.measured_seconds / self.as_run_seconds
        return f"{head}: off the prediction by more than {HOLDS:.0%}, yet {gain:.0%} faster than as run"


class NotRunnable(ValueError):
    """The advice names a setting no run can make as it stands (a page cache of a given size)."""


def apply_advice(job: UserJob, report: LoaderReport, kind: str, log: IO[str] | None = None) -> Applied | None:
    """Rerun the cold run of loaders ``kind`` (as analyzed, under the limits its runs had: ``--memory-limit
    auto`` as sized) with the setting the report's advice names (``report.advised``), and only that setting
    changed; None where it names none."""
    chosen = report.advised
    if chosen is None:
        return None
    job = replace(job, limits=report.workload.limits)
    cached = KINDS[chosen.loader].cached
    if not cached and chosen.workers == report.workload.workers:  # torch's advice: a cache, not workers
        raise NotRunnable(
            f"the advice is a page cache of {format_bytes(chosen.cache_bytes)}, which a run cannot set"
        )
    cache = chosen.cache_bytes if cached else job.cache_bytes
    kind = CACHED if cached else kind  # our loader, with the advised cache, whatever the script builds
    measured = run_setting(
        job, kind, workers=chosen.workers, cache_bytes=cache, cache_form=chosen.cache_form, log=log
    )
    b = report.breakdown
    return Applied(
        _said(chosen, report, cache), chosen.epoch_seconds, measured, b.epoch_seconds, b.epoch_spread_seconds
    )


def _said(chosen: Advised, report: LoaderReport, cache: int | None) -> str:
    """The setting run, in words: its workers, and our cache's arguments or form where it is ours."""
    where = f"{chosen.workers} workers"
    if chosen.cache_form is not None:
        return f"{where}, {KINDS[CACHED].label} with cache_form={chosen.cache_form!r}"
    if KINDS[chosen.loader].cached:
        where += f", {KINDS[CACHED].label} with {cache_arguments(cache, report.workload)}"
    return where
