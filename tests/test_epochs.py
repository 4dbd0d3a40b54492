"""The generated job (``stallbench.jobs.workload``) is a command like the user's: run under a JobSpec and
measured by the bootstrap, its epochs cut to ``steps`` as a script's ``break`` cuts them, its ingestion run
the first batches replayed, and everything it measures in the one record (``LoaderEpoch``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import make_jpeg_folder

from stallbench.analysis.training import run_record, train_epochs
from stallbench.jobs.command import run_command
from stallbench.jobs.data import make_loader
from stallbench.jobs.spec import JobSpec, WorkloadJob

pytestmark = pytest.mark.multiproc

_WORKLOAD = [sys.executable, "-m", "stallbench.jobs.workload"]


def _epochs(job: WorkloadJob, **spec: object) -> list:
    run = run_command(_WORKLOAD, JobSpec(out_dir="", data=(job.data,), **spec), job=job)
    return train_epochs(run.records)[0]


def test_a_generated_job_cut_to_steps_takes_the_head_of_the_order_with_workers_that_end_with_it(
    tmp_path: Path,
) -> None:
    """As a script's ``break`` after N steps: the workers are busy to the last step (an order of exactly N
    batches would leave them idle through the last ones) and shut down at the epoch's end."""
    data = str(make_jpeg_folder(tmp_path / "jpegs", per_class=8, classes=2))  # 16 images
    whole = make_loader(WorkloadJob("torch", data, workers=2, batch_size=4), None)
    cut = make_loader(WorkloadJob("torch", data, workers=2, batch_size=4, persistent_workers=False), None)
    assert (len(whole), whole.persistent_workers) == (4, True)
    assert (len(cut), cut.persistent_workers) == (4, False)
    job = WorkloadJob("torch", data, epochs=2, workers=2, batch_size=4, persistent_workers=False)
    epochs = _epochs(job, steps=2, epochs=2)
    assert [(e.batches, e.samples, e.complete) for e in epochs] == [(2, 8, True), (2, 8, True)]


def test_a_generated_jobs_record_holds_what_it_measured(tmp_path: Path, shm_dir: Path) -> None:
    """Times on the machine's one clock, the last epoch's timeline per batch, our cache's counts and the
    forms it weighed, its stage times: the record a user's command gets, from the same bootstrap."""
    data = str(make_jpeg_folder(tmp_path / "imgs", per_class=8, classes=2))
    job = WorkloadJob(
        "cached", data, epochs=2, workers=0, batch_size=8, cache_bytes=1 << 26, cache_dir=str(shm_dir)
    )
    epochs = _epochs(job, epochs=2)
    assert [e.batches for e in epochs] == [2, 2]
    assert epochs[0].start_time < epochs[0].end_time <= epochs[1].start_time < epochs[1].end_time
    assert (epochs[0].misses, epochs[1].hits) == (16, 16)
    run = run_record("cold", "", epochs)
    assert len(run.timeline) == 2 and all(wait >= 0 and step >= 0 for wait, step in run.timeline)
    assert run.cache_form == epochs[-1].stats["cache_form"] in ("raw", "prepared", "mixed")
    assert {"raw", "prepared"} <= set(run.cache_form_epochs) and run.cache_form in run.cache_form_epochs
    assert run.stage_seconds["decode"] > 0


def test_the_torch_kind_of_a_generated_job_times_its_stages_as_ours_does(tmp_path: Path) -> None:
    data = str(make_jpeg_folder(tmp_path / "imgs", per_class=8, classes=2))
    epochs = _epochs(WorkloadJob("torch", data, epochs=2, workers=2, batch_size=8), epochs=2)
    assert epochs[-1].loader_class == "torch.utils.data.DataLoader"
    assert epochs[-1].stats["fetch_seconds"] > 0 and epochs[-1].stats["decode_seconds"] > 0


def test_the_ingestion_run_of_a_generated_job_replays_as_many_batches_as_the_prep_run_made(
    tmp_path: Path,
) -> None:
    data = str(make_jpeg_folder(tmp_path / "imgs", per_class=10, classes=2))  # 20 images: 3 batches of 8
    job = WorkloadJob("torch", data, epochs=2, workers=2, batch_size=8)
    prep = _epochs(job, epochs=2)
    replayed = _epochs(job, epochs=2, mode="ingestion", replay_batches=1)
    assert [e.batches for e in prep] == [e.batches for e in replayed] == [3, 3]
    assert [e.stats["samples"] for e in prep] == [20, 20]
    # the pipeline made no sample in a replayed epoch (the kernel's read count would also see a library's
    # page read back after another process's memory pressure took it)
    assert all(e.mode == "ingestion" and e.stats["samples"] == 0 for e in replayed)
    assert [e.samples for e in replayed] == [24, 24]  # the first batch of 8, three times an epoch


@pytest.mark.slow
def test_the_ingestion_runs_step_frees_a_batch_as_the_real_runs_step_does(tmp_path: Path) -> None:
    """No compute: a step is only the loop, and freeing the previous 19 MB batch (a worker's shared memory
    in the real run, a fresh copy in the ingestion run)."""
    data = str(make_jpeg_folder(tmp_path / "imgs", per_class=160, classes=2, size=(256, 256)))
    job = WorkloadJob("torch", data, epochs=3, workers=2, batch_size=32, transform="eval")
    steps = {}
    for mode in ("pipeline", "ingestion"):
        epochs = _epochs(job, epochs=3, mode=mode)[1:]
        steps[mode] = sum(e.step_seconds for e in epochs) / sum(e.batches for e in epochs)
    assert steps["ingestion"] > 0.4 * steps["pipeline"] > 0, steps
