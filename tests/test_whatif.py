"""stallbench.analysis.whatif, .hits and .advice on constructed measurements: the model, its calibration,
roofline, advice."""

from __future__ import annotations

import dataclasses

import pytest

from stallbench.analysis import whatif
from stallbench.analysis.advice import advise, advised
from stallbench.analysis.hits import hit_rate
from stallbench.analysis.results import Advised, Breakdown, FormPrediction, Machine, RunRecord, Workload
from stallbench.analysis.whatif import Measured, epoch_terms, predict, roofline, what_if

GB = 10**9
D = 10 * GB  # 100,000 records of 100 KB
# in batches of 1, a worker makes ceil(100,000 / w) - 1 of them after its first: its share's 1 - w / 100,000
SHARE_AFTER_FIRST = 1e-4


def measured(
    *,
    loader: str = "torch",
    cache: int | None = D // 2,
    workers: int = 2,
    cores: int = 2,
    t1: float = 60.0,
    t2: float = 100.0,
    prep_stall: float = 0.0,
    storage: float = 200e6,
    rate: float = 600.0,
    record_bytes: int = D,
) -> Measured:
    workload = Workload(
        data="/data",
        dataset_bytes=D,
        record_bytes=record_bytes,
        samples=100_000,
        batch_size=1,
        workers=workers,
        compute="emulated:20",
        epochs=3,
        cache_bytes=cache,
        storage_bandwidth=None,
        memory_limit=None,
    )
    breakdown = Breakdown(
        epoch_seconds=t2,
        compute_seconds=t1,
        prep_stall_seconds=prep_stall,
        fetch_stall_seconds=t2 - t1 - prep_stall,
        warmup_seconds=0.0,
        step_alone_seconds=t1,
        warm_epoch_seconds=t1 + prep_stall,
    )
    machine = Machine(
        cores=cores, storage_bytes_per_s=storage, memory_bytes_per_s=10e9, prep_samples_per_s_per_core=rate
    )
    return Measured(workload=workload, breakdown=breakdown, machine=machine, loader=loader)


def test_prep_that_waits_off_the_cpu_scales_with_workers_not_cores():
    # 100,000 samples at 10,000/s per core: 10 s of CPU; the prep run took 90 s on 2 workers, so each
    # worker waited (a sleep, a lock, a remote read) for the rest: L = 90 * 2 - 10 = 170 s
    m = measured(workers=2, cores=4, t1=60.0, t2=100.0, prep_stall=30.0, rate=10_000.0)
    prep = {w: epoch_terms(m, cache_bytes=D // 2, workers=w)["prep"] for w in (0, 1, 2, 4, 8)}
    assert prep == pytest.approx(
        {0: 60.0 + 180.0, 1: 180.0, 2: 90.0, 4: 45.0, 8: 22.5}, rel=SHARE_AFTER_FIRST
    )


def test_the_wait_for_the_first_batch_is_paid_once_whatever_the_workers():
    # as above, but 10 s of the 90 s prep run went to starting the workers and a first batch: the other
    # 80 s on 2 workers are 160 s of worker time, 150 s of it off the CPU
    m = measured(workers=2, cores=4, t1=60.0, t2=100.0, prep_stall=30.0, rate=10_000.0)
    m = dataclasses.replace(m, breakdown=dataclasses.replace(m.breakdown, warm_first_batch_seconds=10.0))
    prep = {w: epoch_terms(m, cache_bytes=D // 2, workers=w)["prep"] for w in (1, 2, 4, 8)}
    # 8 workers on 4 cores: only the CPU share of the first batch (10 of 160 s) stretches, twofold
    assert prep == pytest.approx(
        {1: 10.0 + 160.0, 2: 90.0, 4: 10.0 + 40.0, 8: 10.0 * (1 + 10 / 160) + 20.0}, rel=SHARE_AFTER_FIRST
    )


def test_more_workers_than_cores_wait_longer_for_a_first_batch_and_all_the_cpu_counts_it_once():
    # 2 cores, measured with 2 workers: a first batch after 4 s; prep 20 s of CPU, the step 30 s
    m = measured(workers=2, cores=2, t1=60.0, t2=60.0, rate=5000.0)
    m = dataclasses.replace(
        m, breakdown=dataclasses.replace(m.breakdown, warm_first_batch_seconds=4.0, step_cpu_seconds=30.0)
    )
    prep = {w: epoch_terms(m, cache_bytes=D // 2, workers=w)["prep"] for w in (1, 2, 8)}
    # all the CPU on 2 cores, 25 s, binds 1 and 2 workers (the first batch is in it); 8 workers start at
    # once on 2 cores: their first batch comes after 4 x 4 s, then each makes its share on a core
    assert prep == pytest.approx({1: 25.0, 2: 25.0, 8: 16.0 + 10.0}, rel=SHARE_AFTER_FIRST)


def test_a_worker_makes_its_first_batch_once_so_many_workers_on_few_batches_are_not_overstated():
    # 600 samples in 10 batches, measured with 1 worker on 2 cores: a first batch after 0.3 s, then 9 more
    # at 0.2 s each (0.1 s of CPU in all, the rest a sleep): C + L = 1.8 s / (9 of 10 batches) = 2.0 s
    m = measured(loader="cached", cache=D, workers=1, cores=2, t1=0.2, t2=2.1, prep_stall=1.9, rate=6000.0)
    m = dataclasses.replace(
        m,
        workload=dataclasses.replace(m.workload, samples=600, batch_size=60),
        breakdown=dataclasses.replace(m.breakdown, warm_first_batch_seconds=0.3),
    )
    # 8 workers: two make a second batch (0.8 of a 0.25 s share); with 10, each makes one batch and the
    # epoch's prep is that first batch, its CPU (5% of it) stretched w / 2 times on 2 cores
    first = {w: 0.3 * (0.95 + 0.05 * max(1, w / 2)) for w in (1, 2, 8, 10, 80)}
    prep = {w: epoch_terms(m, cache_bytes=D, workers=w)["prep"] for w in first}
    expected = {1: 0.3 + 1.8, 2: first[2] + 0.8, 8: first[8] + 0.8 * 0.25, 10: first[10], 80: first[80]}
    assert prep == pytest.approx(expected)
    assert predict(m, cache_bytes=D, workers=8).epoch_seconds == pytest.approx(expected[8])  # T2 = prep(1)


def test_a_step_that_holds_a_core_is_not_mistaken_for_prep_more_workers_would_speed_up():
    # 2 cores; the step alone takes 50 s of one core, prep 55 s of CPU; with 2 workers the three share the
    # 2 cores: (50 + 55) / 2 = 52.5 s, near the 55 s prep run. One worker is not twice as slow: 55 s.
    m = measured(workers=2, cores=2, t1=50.0, t2=60.0, prep_stall=5.0, rate=100_000 / 55.0)
    m = dataclasses.replace(m, breakdown=dataclasses.replace(m.breakdown, step_cpu_seconds=50.0))
    prep = {w: epoch_terms(m, cache_bytes=D // 2, workers=w)["prep"] for w in (0, 1, 2, 4)}
    assert prep == pytest.approx({0: 105.0, 1: 55.0, 2: 52.5, 4: 52.5}, rel=SHARE_AFTER_FIRST)
    one = predict(m, cache_bytes=D // 2, workers=1)
    assert (
        one.epoch_seconds == pytest.approx(60.0 * 55.0 / 52.5, rel=SHARE_AFTER_FIRST) and one.bound == "prep"
    )


def test_prep_that_compute_hid_is_taken_at_its_cpu():
    m = measured(workers=2, cores=4, t1=60.0, t2=100.0, prep_stall=1.0, rate=1000.0)  # T3 = 61 s
    assert epoch_terms(m, cache_bytes=D // 2, workers=1)["prep"] == pytest.approx(
        100.0, rel=SHARE_AFTER_FIRST
    )


def test_terms_follow_the_formulas():
    terms = epoch_terms(measured(loader="cached"), cache_bytes=D // 4, workers=8)
    assert terms == pytest.approx({"compute": 60.0, "prep": 100_000 / 1200, "fetch": 0.75 * D / 200e6})


def test_minio_hit_rate_is_c_over_d_and_lru_is_far_below():
    cached = hit_rate("cached", dataset_bytes=D, samples=100_000, cache_bytes=D // 2)
    lru = hit_rate("torch", dataset_bytes=D, samples=100_000, cache_bytes=D // 2)
    assert cached == 0.5
    assert 0.12 < lru < 0.2  # DESIGN.md's table: 0.155 at half the dataset


def test_a_dataset_that_fits_in_free_memory_always_hits():
    assert hit_rate("torch", dataset_bytes=10**6, samples=10, cache_bytes=None) == 1.0


@pytest.mark.parametrize("loader", ["torch", "cached"])
def test_a_bigger_cache_makes_the_fetch_term_smaller(loader):
    m = measured(loader=loader)
    fetch = [epoch_terms(m, cache_bytes=round(f * D), workers=2)["fetch"] for f in (0.25, 0.5, 0.75, 1.0)]
    assert fetch == sorted(fetch, reverse=True) and len(set(fetch)) == 4 and fetch[-1] == 0.0


@pytest.mark.parametrize("loader", ["torch", "cached"])
def test_the_measured_point_is_reproduced_exactly(loader):
    m = measured(loader=loader, t2=97.3)
    assert predict(m, cache_bytes=D // 2, workers=2).epoch_seconds == 97.3


def test_no_prediction_is_faster_than_compute():
    # model(measured) is 4x the measured epoch, so an uncapped calibration would predict T1 / 4
    m = measured(loader="cached", t1=60.0, t2=80.0, storage=25e6)
    best = predict(m, cache_bytes=100 * D, workers=64)
    assert (best.epoch_seconds, best.bound) == (60.0, "compute")
    assert all(p.epoch_seconds >= 60.0 for p in what_if(m))


@pytest.mark.parametrize(
    ("options", "bound"),
    [({"storage": 50e6}, "fetch"), ({"rate": 100.0}, "prep"), ({"t1": 300.0, "t2": 310.0}, "compute")],
)
def test_roofline_names_the_largest_term(options, bound):
    m = measured(**options)
    line = roofline(m)
    terms = (line.compute_seconds, line.prep_seconds, line.fetch_seconds)
    assert line.bound == bound
    assert line.bound_ratio == pytest.approx(max(terms) / m.breakdown.epoch_seconds)
    assert line.efficiency == min(1.0, line.bound_ratio)


def test_efficiency_is_capped_and_the_ratio_kept():
    over = roofline(measured(storage=50e6))  # fetch 169 s (LRU misses 0.845 of 10 GB) against a 100 s epoch
    assert (over.efficiency, over.bound_ratio) == (1.0, pytest.approx(over.fetch_seconds / 100.0))
    assert over.bound_ratio > 1.6
    under = roofline(measured(t1=40.0))
    assert under.efficiency == under.bound_ratio < 1.0


SMALL_RECORD, SMALL_PAGES = 6_000, 8_192  # a 6 KB file costs the device two 4 KiB pages


def small_files(**options) -> Measured:
    """A torch epoch that read 0.75 of the dataset's device bytes at 5 MB/s (kernel bytes throughout)."""
    records = D * SMALL_RECORD // SMALL_PAGES
    m = measured(record_bytes=records, storage=5e6, t1=60.0, t2=1600.0, **options)
    return dataclasses.replace(m, storage_bytes=int(0.75 * D))


def test_small_records_keep_one_unit_so_the_roofline_is_a_bound():
    m = small_files()
    line = roofline(m)
    assert line.fetch_seconds == pytest.approx(0.75 * D / 5e6)  # 1500 s: device bytes at device bytes/s
    assert line.bound == "fetch" and line.bound_ratio == pytest.approx(1500 / 1600) and line.efficiency < 1


def test_the_cached_loader_holds_records_packed_and_the_page_cache_whole_pages():
    records = D * SMALL_RECORD // SMALL_PAGES
    cached = hit_rate("cached", dataset_bytes=D, samples=100_000, cache_bytes=D // 2, record_bytes=records)
    lru = hit_rate("torch", dataset_bytes=D, samples=100_000, cache_bytes=D // 2, record_bytes=records)
    assert cached == pytest.approx(SMALL_PAGES / SMALL_RECORD / 2)  # half the pages' memory: 68% of records
    assert lru == hit_rate("torch", dataset_bytes=D, samples=100_000, cache_bytes=D // 2)  # pages: unchanged


def test_a_switch_to_the_cached_loader_is_predicted_in_device_bytes():
    m = small_files()
    switch = predict(m, cache_bytes=D // 2, workers=2, loader="cached")
    missed = 1 - SMALL_PAGES / SMALL_RECORD / 2  # of the device bytes, at the measured rate of 0.75 in 1600 s
    assert switch.epoch_seconds == pytest.approx(1600 * missed / 0.75)


def test_prediction_bound_moves_from_fetch_to_prep():
    m = measured(loader="cached", storage=50e6, rate=300.0)  # fetch 100 s, prep 167 s at 2 cores
    assert predict(m, cache_bytes=0, workers=8).bound == "fetch"
    assert predict(m, cache_bytes=D, workers=8).bound == "prep"


def test_what_if_deduplicates_sorts_and_includes_the_measured_point():
    preds = what_if(measured(cache=D // 2, workers=2))
    points = [(p.cache_bytes, p.workers) for p in preds]
    expected = {(round(f * D), 2) for f in (0.25, 0.5, 0.75, 1.0)} | {(D // 2, w) for w in (1, 4, 8)}
    assert points == sorted(expected)
    assert next(p for p in preds if (p.cache_bytes, p.workers) == (D // 2, 2)).epoch_seconds == 100.0


def test_advice_for_a_fetch_stall_names_the_cached_loader_and_its_numbers():
    m = measured(loader="torch", t1=60.0, t2=100.0, storage=100e6, rate=2000.0)  # fetch: 84 s at LRU's 0.155
    switch = predict(m, cache_bytes=D // 2, workers=2, loader="cached")
    text = advise(m, what_if(m))
    assert text.startswith(
        "fetch stall is 40% of the epoch: loader.DataLoader with cache_bytes=5_000_000_000 (5.00 GB)"
    )
    assert f"{switch.epoch_seconds:.1f} s ({100 * (switch.epoch_seconds / 100 - 1):+.0f}%)" in text


@pytest.mark.parametrize(
    ("data", "argument"),
    [("/data/digits", "cache_files='/data/digits'"), ("/a,/b", "cache_files=['/a', '/b']")],
)
def test_advice_for_a_dataset_that_opens_its_own_files_names_cache_files(data, argument):
    m = measured(loader="torch", t1=60.0, t2=100.0, storage=100e6, rate=2000.0)
    m = dataclasses.replace(m, workload=dataclasses.replace(m.workload, data=data, opens_own_files=True))
    text = advise(m, what_if(m))
    assert f"loader.DataLoader with cache_bytes=5_000_000_000 (5.00 GB), {argument} would cut" in text


def test_advice_for_a_prep_stall_names_a_worker_count_and_the_decode_rate():
    m = measured(workers=1, cores=8, rate=500.0, t1=60.0, t2=210.0, prep_stall=150.0, storage=10e9)
    # prep takes 200 s of CPU (the 210 s prep run: the CPU explains it); 4 workers make it 50 s, below the
    # 60 s of compute, which the calibration on the measured point (210 / 200) brings to 63 s
    text = advise(m, what_if(m))
    assert text == (
        "prep stall is 71% of the epoch: 4 workers would bring the epoch to 63.0 s (-70%); "
        "decode is 500 samples/s per core"
    )


SLOW_TORCH = (
    "; 3 slow batches (4x the median wait) make 80% of the wait: a few slow samples hold their batches, "
    "which loader.DataLoader with ready_first=True keeps them from"
)
SLOW_CACHED = "make 60% of the wait: a few slow samples hold their batches, which ready_first=True"


@pytest.mark.parametrize(
    ("loader", "share", "said"),
    [("torch", 0.8, SLOW_TORCH), ("cached", 0.6, SLOW_CACHED), ("torch", 0.4, None)],
)
def test_advice_names_ready_first_where_a_few_slow_batches_make_most_of_the_stall(loader, share, said):
    m = measured(loader=loader, rate=500.0, t1=60.0, t2=110.0, prep_stall=50.0, storage=10e9)
    slow = {"slow_batches": 3, "slow_batches_excess_seconds": 40.0, "slow_batches_wait_share": share}
    m = dataclasses.replace(m, breakdown=dataclasses.replace(m.breakdown, **slow), slow_again=0.9)
    by_chance = dataclasses.replace(m, slow_again=0.2)  # other samples slow each epoch: a busy machine's
    assert "ready_first" not in advise(by_chance, what_if(by_chance))
    text = advise(m, what_if(m))
    assert text.startswith("prep stall is 45% of the epoch")
    assert (said in text) if said else ("ready_first" not in text)
    on = dataclasses.replace(m, ready_first=True)  # the loader had it on: what is left is their own prep
    assert (
        "with ready_first=True on: the slow samples' own prep is what is left" in advise(on, what_if(on))
    ) == (said is not None)
    quiet = measured(t1=100.0, t2=105.0, prep_stall=2.0)  # no stall worth acting on: nothing to say of it
    quiet = dataclasses.replace(quiet, breakdown=dataclasses.replace(quiet.breakdown, **slow))
    assert "ready_first" not in advise(quiet, what_if(quiet))


def test_advice_without_a_stall_worth_acting_on():
    m = measured(t1=100.0, t2=105.0, prep_stall=2.0)
    assert advise(m, what_if(m)) == "no stall worth acting on: the epoch is compute-bound (stalls 5%)"


def test_advice_when_the_cache_already_holds_the_dataset():
    m = measured(loader="cached", cache=D, t1=60.0, t2=100.0, storage=100e6)
    assert advise(m, what_if(m)).startswith("fetch stall is 40% of the epoch: no larger cache predicts")


@pytest.mark.parametrize(
    "change",
    [{"loader": "tape"}, {"machine": Machine(2, 0.0, 1e9, 600.0)}, {"machine": Machine(2, 1e8, 1e9, 0.0)}],
)
def test_bad_measurements_are_refused(change):
    with pytest.raises(ValueError, match=r"unknown loader|must be positive"):
        dataclasses.replace(measured(), **change)


def test_advice_for_a_prep_stall_when_every_core_already_works():
    m = measured(workers=2, cores=2, rate=500.0, t1=60.0, t2=110.0, prep_stall=50.0, storage=10e9)
    assert advise(m, what_if(m)) == (
        "prep stall is 45% of the epoch with 2 workers on 2 cores: decode is 500 samples/s per core; "
        "more workers would not help, faster decode or more cores would"
    )


def test_measured_storage_bytes_set_the_fetch_term_of_the_measured_point():
    model_only = measured()
    model_miss = epoch_terms(model_only, cache_bytes=D // 2, workers=2)["fetch"] * 200e6 / D
    half_as_much = dataclasses.replace(model_only, storage_bytes=int(model_miss * D / 2))
    here = epoch_terms(half_as_much, cache_bytes=D // 2, workers=2)["fetch"]
    assert here == pytest.approx(model_miss * D / 2 / 200e6, rel=1e-6)
    smaller = epoch_terms(half_as_much, cache_bytes=D // 4, workers=2)["fetch"]
    assert smaller == pytest.approx(
        epoch_terms(model_only, cache_bytes=D // 4, workers=2)["fetch"] / 2, rel=1e-6
    )
    other_loader = epoch_terms(half_as_much, cache_bytes=D // 2, workers=2, loader="cached")["fetch"]
    assert other_loader == pytest.approx(0.5 * D / 200e6)  # the other loader keeps the model


def test_advice_acts_on_the_bound_not_the_larger_stall():
    # storage bounds the epoch (fetch term 25 s at 200 MB/s) though the measured prep stall is larger
    m = measured(loader="cached", t1=5.0, t2=25.0, prep_stall=12.0, rate=4000.0)
    assert roofline(m).bound == "fetch"
    text = advise(m, what_if(m))
    assert text.startswith("fetch stall is 32% of the epoch and storage bounds it (prep stall 48% waits")
    assert "cache_bytes=" in text


def test_prefetch_depth_moves_no_term_of_the_model():
    m = measured(prep_stall=20.0)
    here = whatif.predict(m, cache_bytes=m.workload.cache_bytes, workers=m.workload.workers)
    got = whatif.prefetch_what_if(m)
    assert [p.prefetch_factor for p in got] == [1, 2, 4, 8]
    assert all(p.epoch_seconds == here.epoch_seconds == 100.0 and p.bound == here.bound for p in got)
    assert whatif.prefetch_what_if(measured(workers=0)) == ()  # no workers: nothing is prefetched


def test_the_forms_the_loader_weighed_move_the_measured_epoch_by_their_difference():
    m = measured(loader="cached", t1=40.0, t2=100.0, prep_stall=60.0)
    weighed = {"raw": 80.0, "prepared": 30.0, "mixed": 50.0}
    cold = RunRecord("cold", (), "", cache_form="mixed", cache_form_epochs=weighed)
    got = {p.form: (p.epoch_seconds, p.as_run) for p in whatif.form_what_if(m, cold)}
    # the run held the mix, 100 s where the loader weighed 50 s: raw 30 s more, prepared 20 s less
    assert got == {"raw": (130.0, False), "prepared": (80.0, False), "mixed": (100.0, True)}
    assert whatif.form_what_if(measured(loader="cached", t1=90.0), cold)[1].epoch_seconds == 90.0  # T1
    assert whatif.form_what_if(m, RunRecord("cold", (), "")) == ()  # no forms weighed: nothing said


def forms(held: str, **epochs: float) -> tuple[FormPrediction, ...]:
    return tuple(FormPrediction(form, seconds, form == held) for form, seconds in epochs.items())


def test_advice_for_a_prep_stall_names_a_faster_form_of_record_and_a_run_makes_it():
    m = measured(loader="cached", workers=2, cores=2, rate=500.0, t1=60.0, t2=110.0, prep_stall=50.0)
    weighed = forms("raw", raw=110.0, prepared=66.0, mixed=80.0)
    assert advise(m, what_if(m), weighed) == (
        "prep stall is 45% of the epoch: cache_form='prepared' would bring the epoch to 66.0 s (-40%); "
        "decode is 500 samples/s per core"
    )
    assert advised(m, what_if(m), weighed) == Advised("cached", 2, D // 2, 66.0, "prepared")
    mixed = forms("raw", raw=110.0, prepared=120.0, mixed=80.0)
    assert "cache_form='auto' (a mix of prepared and raw records) would" in advise(m, what_if(m), mixed)
    assert advised(m, what_if(m), mixed).cache_form == "auto"


@pytest.mark.parametrize(
    "weighed",
    [
        forms("prepared", raw=110.0, prepared=66.0),  # held already
        forms("raw", raw=110.0, prepared=100.0),  # under the loader's 10% margin
        (),  # the loader weighed no forms
    ],
)
def test_no_form_is_advised_where_none_is_10_percent_faster_than_the_one_held(weighed):
    m = measured(loader="cached", workers=2, cores=2, rate=500.0, t1=60.0, t2=110.0, prep_stall=50.0)
    assert "cache_form" not in advise(m, what_if(m), weighed)
    assert advised(m, what_if(m), weighed) is None  # every core works: no worker count helps either


def test_a_form_is_advised_where_the_step_shares_the_cores_with_prep_without_a_stall():
    m = measured(loader="cached", workers=2, cores=2, rate=100.0, t1=95.0, t2=100.0, prep_stall=5.0)
    assert roofline(m).bound == "prep"
    text = advise(m, what_if(m), forms("raw", raw=100.0, prepared=70.0))
    assert text.startswith("no stall worth acting on (stalls 5%), but the cores bound the epoch")
    assert text.endswith("; cache_form='prepared' would bring the epoch to 70.0 s (-30%)")
    assert advised(m, what_if(m), forms("raw", raw=100.0, prepared=70.0)).cache_form == "prepared"


def test_a_worker_count_faster_than_any_form_is_advised_instead():
    m = measured(workers=1, cores=8, rate=500.0, t1=60.0, t2=210.0, prep_stall=150.0, storage=10e9)
    m = dataclasses.replace(m, loader="cached")
    chosen = advised(m, what_if(m), forms("raw", raw=210.0, prepared=150.0))
    assert (chosen.workers, chosen.cache_form) == (4, None)


def test_workers_that_waited_for_a_core_other_work_held_are_not_read_as_off_the_cpu():
    """2 workers on 2 cores, their prep all CPU (50 s of it a 30 s prep run cannot hold on 2 cores, but can
    on the 1.6 cores other work left it): read on a quiet machine the gap is off-CPU time more workers would
    overlap; with the other work's 0.4 cores taken out, the CPU explains the run and no worker count helps."""
    quiet = measured(workers=2, cores=2, t1=5.0, t2=32.0, prep_stall=27.0, rate=2_000.0)  # C = 50 s
    busy = dataclasses.replace(quiet, prep_other_load=0.4)
    quiet_prep = {w: epoch_terms(quiet, cache_bytes=D // 2, workers=w)["prep"] for w in (2, 8)}
    busy_prep = {w: epoch_terms(busy, cache_bytes=D // 2, workers=w)["prep"] for w in (2, 8)}
    assert quiet_prep[8] < quiet_prep[2]  # read as off-CPU waits: 8 workers would overlap them
    assert busy_prep[8] == pytest.approx(busy_prep[2])  # the cores bound it: more workers cannot help
    assert not any(p.workers > 2 and p.epoch_seconds < 0.98 * 32.0 for p in what_if(busy))
