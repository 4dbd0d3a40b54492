"""``analyze`` and ``compare``: the one method for every job (``analyze``: its runs, the machine, a report per
loader), and a generated workload made ready for it (``prepare``: its data, cache and storage condition).

One unit throughout: device bytes (the kernel's count of what it read, whole pages). The dataset's size, the
storage bytes of each epoch and the storage bandwidth are all in it, so the share of the dataset read, the
hit rate of the page cache and the roofline's fetch time are ratios of like to like.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from stallbench.analysis.job_report import job_report
from stallbench.analysis.memory import PREFETCH, sized_memory
from stallbench.analysis.object_data import check_room_for_copies
from stallbench.analysis.phases import RunPlan
from stallbench.analysis.request import AnalysisRequest, NamedWorkload, ObjectData, cache_bytes
from stallbench.analysis.results import LoaderReport, Workload
from stallbench.analysis.runs import Bandwidths, Job, collected
from stallbench.conditions.limits import AUTO
from stallbench.conditions.storage import DataSize, dataset_size
from stallbench.jobs.kinds import KINDS

__all__ = ["analyze", "prepare"]

Progress = Callable[[int, int], None]


def prepare(
    req: AnalysisRequest, kinds: Sequence[str], progress: Progress | None = None, cold: bool = True
) -> RunPlan:
    """Generate a named workload if needed, convert it for a loader that reads its own format (untimed, as
    its users do; data in object storage once its runs open it: ``RunPlan.opened``), size the cache, check
    and size the storage condition.

    ``progress(done, total)`` is told how the generation of a named workload goes. ``cold=False``: no run
    will evict the page cache (``compare --jobs`` runs warm), so data on a memory filesystem will do."""
    data = _materialise(req, progress)
    size, samples, lengths = _opened(data)
    converted = tuple(kind for kind in kinds if KINDS[kind].converts)
    if isinstance(data, ObjectData):
        check_room_for_copies(str(data), size.device_bytes, len(converted))
    for kind in converted:  # in object storage: converted from the analysis's copy in memory (``opened``)
        from stallbench.jobs.others import check_installed, convert  # here: it loads torch, --help does not

        if isinstance(data, ObjectData):
            check_installed(kind)
        else:
            convert(str(data), kind)
    cache = cache_bytes(req.cache, size.device_bytes)
    req.limits.check(data, cold, over_network=isinstance(data, ObjectData))
    workload = Workload(
        data=str(data),
        dataset_bytes=size.device_bytes,
        record_bytes=size.record_bytes,
        samples=samples,
        batch_size=req.batch_size,
        workers=req.workers,
        compute=req.compute,
        epochs=req.epochs,
        cache_bytes=cache,
        **req.limits.known(),
        prefetch_factor=PREFETCH if req.workers > 0 else None,
    )
    auto = req.limits.memory_limit == AUTO  # sized by ``analyze``, from the job's own memory
    packing = _packing(req, data, lengths)
    return RunPlan(
        workload=workload,
        transform=req.transform,
        seed=req.seed,
        auto_memory=auto,
        converted=converted,
        **packing,
    )


def analyze(
    job: Job, kinds: Sequence[str], on_step: Callable[[str], None] | None = None, log: IO[str] | None = None
) -> Iterator[LoaderReport]:
    """The one method, for a generated workload (a ``RunPlan``) and the user's command (a ``UserJob``): the
    memory limit sized where it is ``auto`` (``memory.sized_memory``), then one report per column
    (``job.variants``: with packing, each kind padded, then packed), yielded as each is done, so an
    interrupted compare keeps the finished ones. The machine is measured once, after the first column's
    runs, when the job's workers are known: storage is read by as many readers as they are."""
    step = on_step or (lambda label: None)
    if job.limits.memory_limit == AUTO:
        job = sized_memory(job, kinds, log)
        step("memory measured")
    bandwidths: Bandwidths | None = None
    with job.opened() as (opened, measure):
        for variant in opened.variants(kinds):
            runs = collected(opened.three_runs(variant, log), step, variant.label)
            if bandwidths is None:
                bandwidths = measure(max(1, max((r.workers for r in runs["cold"].records), default=1)))
                step("machine measured")
            yield job_report(opened, variant, runs, bandwidths)


def _packing(req: AnalysisRequest, data: Path, lengths: np.ndarray | None) -> dict[str, Any]:
    """The plan's packing and pack length: ValueError where the data holds no token sequences to pack, or
    one longer than ``max_len``; the longest sequence when no ``max_len`` is given."""
    if req.packing is None:
        return {}
    if lengths is None:
        raise ValueError(
            f"--packing needs token sequences (tokens[:N] or an Arrow file of them); {data} has none"
        )
    longest = int(lengths.max(initial=0))
    max_len = longest if req.max_len is None else req.max_len
    if max_len < longest:
        raise ValueError(f"--max-len {max_len} is shorter than the longest sequence ({longest} tokens)")
    return {"packing": req.packing, "max_len": max_len}


def _materialise(req: AnalysisRequest, progress: Progress | None) -> Path | ObjectData:
    from stallbench import workloads

    if not isinstance(req.data, NamedWorkload):
        return req.data
    kind, count = req.data.kind, req.data.count
    if kind == "images":
        count = workloads.DEFAULT_IMAGE_COUNT if count is None else count
        return workloads.default_image_workload(req.data_dir, num_images=count, progress=progress)
    count = 20_000 if count is None else count
    path = req.data_dir / f"tokens-{count}.arrow"
    return workloads.make_token_arrow(path, num_sequences=count, min_len=16, max_len=2048)


def _opened(data: Path | ObjectData) -> tuple[DataSize, int, np.ndarray | None]:
    """The data opened once: the size of its files (device and record bytes; in object storage, the objects'
    bytes, which is what the network carries), its number of samples and, for token sequences, each one's
    length.

    Hidden files are left out (``dataset_size``): no source reads them."""
    from stallbench.jobs.data import open_source

    source = open_source(str(data))
    if isinstance(data, ObjectData):
        return DataSize(device_bytes=source.nbytes, record_bytes=source.nbytes), len(source), None
    lengths = source.token_lengths() if getattr(source, "kind", None) == "tokens" else None
    return dataset_size(data), len(source), lengths
