"""From a job's records to its report (``job_report``, one way for every job): the training loader, the ranks,
the other loaders, the column's name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from stallbench.analysis.job_report import NoTrainingLoader, job_report
from stallbench.analysis.phases import RunPlan
from stallbench.analysis.results import LoaderReport, Workload
from stallbench.analysis.runs import Variant
from stallbench.analysis.training import train_epochs
from stallbench.analysis.user_analysis import UserJob
from stallbench.jobs.command import CommandRun
from stallbench.jobs.spec import AS_IS, LoaderEpoch
from stallbench.report import format_report, report_to_json, validate_report_json

JOB = UserJob(
    argv=("python", "train.py"),
    data=(Path("/data"),),
    dataset_bytes=1 << 30,
    record_bytes=1 << 30,
    cache_bytes=None,
    epochs=3,
)
STEP = {"ingestion": 1.0, "prep": 1.0, "cold": 1.0}
EPOCH = {"ingestion": 1.0, "prep": 3.0, "cold": 5.0}  # T1, T3, T2 of rank 0


def epoch(loader: str, n: int, phase: str, rank: int = 0, slower: float = 1.0, **extra) -> LoaderEpoch:
    seconds = EPOCH[phase] * slower
    return LoaderEpoch(
        loader=loader,
        rank=rank,
        pid=100 + rank,
        epoch=n,
        seconds=seconds,
        wait_seconds=seconds - STEP[phase],
        step_seconds=STEP[phase],
        first_batch_seconds=0.1,
        batches=10,
        samples=640,
        storage_bytes=(1 << 29) if phase == "cold" else 0,
        cpu_seconds=seconds,
        complete=True,
        loader_class="torch.utils.data.DataLoader",
        workers=2,
        batch_size=64,
        dataset_len=640,
        **extra,
    )


def run(phase: str, ranks: dict[int, float], **extra) -> CommandRun:
    records = []
    for rank, slower in ranks.items():
        for n in (1, 2, 3):
            evaluation = epoch("1:EvalSet", n, phase, rank, slower)  # fewer batches: not the training loader
            records.append(replace(evaluation, batches=2, seconds=0.5))
            records.append(epoch("0:TrainSet", n, phase, rank, slower, **extra))
    return CommandRun(tuple(records), 10.0, False, None)


def runs(ranks: dict[int, float], **extra) -> dict[str, CommandRun]:
    return {
        phase: run(phase, ranks, **(extra if phase == "cold" else {}))
        for phase in ("ingestion", "prep", "cold")
    }


def report_of(job: UserJob, runs: dict[str, CommandRun], kind: str = AS_IS) -> LoaderReport:
    return job_report(job, Variant(kind), runs, (1e8, 1e10))


def test_the_training_loader_is_the_one_with_most_batches_and_others_are_apart():
    report = report_of(JOB, runs({0: 1.0}))
    b = report.breakdown
    assert (b.compute_seconds, b.prep_stall_seconds, b.fetch_stall_seconds) == pytest.approx((1.0, 2.0, 2.0))
    assert [o.loader for o in report.other_loaders] == ["1:EvalSet"]
    assert report.other_loaders[0].seconds_per_epoch == pytest.approx(0.5)
    assert report.workload.command == "python train.py" and report.loader == "torch"
    validate_report_json(report_to_json([report]))


def test_an_other_loader_of_one_batch_reads_as_one_batch():
    def one_batch(e):
        return replace(e, batches=1) if e.loader == "1:EvalSet" else e

    one = {phase: replace(r, records=tuple(map(one_batch, r.records))) for phase, r in runs({0: 1.0}).items()}
    text = format_report([report_of(JOB, one)])
    assert "evaluation loader 1:EvalSet: 0.50 s a pass, 1 batch, 3 passes" in text


def test_the_header_counts_a_training_epoch_s_samples_alone():
    """Issue 48: a header said 1,500 samples, the mean of a 300-sample evaluation and a 2,700-sample epoch."""

    def sized(e):
        return replace(e, samples=300 if e.loader == "1:EvalSet" else 2_700, dataset_len=2_700)

    sized_runs = runs({0: 1.0})
    report = report_of(
        JOB, {phase: replace(r, records=tuple(map(sized, r.records))) for phase, r in sized_runs.items()}
    )
    assert report.workload.samples == 2_700
    assert "2,700 samples" in format_report([report])


def test_each_rank_gets_a_breakdown_and_the_slowest_is_reported():
    report = report_of(JOB, runs({0: 1.0, 1: 1.5}))
    assert [r.rank for r in report.ranks] == [0, 1]
    assert report.slowest_rank == 1 and report.breakdown.epoch_seconds == pytest.approx(7.5)
    text = format_report([report])
    assert "rank 1:" in text and "<- slowest" in text.split("rank 1:")[1].splitlines()[0]


def test_the_cuda_synchronisation_is_said_with_what_it_cost():
    report = report_of(JOB, runs({0: 1.0}, cuda_sync_seconds=0.25))
    assert "CUDA: synchronised at each step boundary, 0.25 s per epoch" in format_report([report])
    assert report_to_json([report])["loaders"][0]["runs"][2]["epochs"][1]["cuda_sync_seconds"] == 0.25


def test_a_run_without_any_loader_is_named():
    with pytest.raises(NoTrainingLoader, match="the prep run iterated no DataLoader"):
        train_epochs((), "prep")


def test_a_column_is_named_by_the_loader_asked_for_and_says_where_its_batches_came_from():
    asked = report_of(JOB, runs({0: 1.0}), "cached")
    assert asked.loader == "cached"  # compare's two columns never share a name
    assert asked.advice.startswith(
        "the batches came from torch.utils.data.DataLoader, not loader.DataLoader: this column measures"
    )
    as_is = report_of(JOB, runs({0: 1.0}))
    assert as_is.loader == "torch" and not as_is.advice.startswith("the batches came from")
    assert "torch" in format_report([as_is, asked]) and "cached vs torch" in format_report([as_is, asked])


def test_the_forms_our_loader_weighed_in_the_user_s_job_become_its_form_what_if():
    stats = {"cache_form": "prepared", "cache_form_epochs": {"raw": 2.0, "prepared": 1.0}}
    ours = replace(JOB, cache_bytes=1 << 30)
    report = report_of(ours, runs({0: 1.0}, stats=stats))
    got = {p.form: (p.epoch_seconds, p.as_run) for p in report.form_predictions}
    assert got == {"raw": (6.0, False), "prepared": (5.0, True)}  # the cold run's 5 s, plus raw's 1.0 s more
    assert "cache_form raw: 6.00 s, *prepared: 5.00 s" in format_report([report])


def test_a_generated_job_is_reported_the_same_way_as_a_command_of_one_rank():
    planned = Workload(
        data="/data",
        dataset_bytes=1 << 30,
        record_bytes=1 << 30,
        samples=640,
        batch_size=64,
        workers=2,
        compute="emulated:20",
        epochs=3,
        cache_bytes=None,
        storage_bandwidth=None,
        memory_limit=None,
    )
    generated = job_report(RunPlan(workload=planned), Variant("cached"), runs({0: 1.0}), (1e8, 1e10))
    command = report_of(JOB, runs({0: 1.0}), "cached")
    assert generated.breakdown == command.breakdown and generated.workload == planned
    assert generated.loader == "cached" and not generated.advice.startswith("the batches came from")
    assert [r.rank for r in generated.ranks] == [0] and generated.predictions
    validate_report_json(report_to_json([generated]))
