"""A pytest plugin that makes a slower data pipeline fail CI: the ``loader_stalls`` fixture.

    def test_pipeline(benchmark, loader_stalls):
        result = loader_stalls(loader, step=train_step, steps=50, max_wait_fraction=0.2)

The fixture runs ``step(batch)`` over up to ``steps`` batches of ``loader`` (starting further epochs when one
ends first), timed by :func:`stallbench.profile`, and returns a :class:`LoaderStalls`. The figures are the
steady state: each epoch's first batch (worker start-up, prefetch) is reported apart, as ``profile`` does,
so a threshold judges the pipeline's throughput rather than a fixed start-up cost. When the test also uses
pytest-benchmark's ``benchmark`` fixture, the run goes through ``benchmark.pedantic`` (one round) so the
table shows its time, and the figures land in ``benchmark.extra_info["stallbench"]`` (and so in
``--benchmark-json``); a test that measures several loaders gets each call's figures under a key of its
own: ``"stallbench"`` for the first, then ``"stallbench[2]"``, ... or ``"stallbench[NAME]"`` for a call
given ``name=NAME``. ``--stallbench-max-wait-fraction`` sets the threshold for calls that give none. Guide:
``docs/how-to/fail-ci-on-stalls.md``.

Installing stallbench registers the plugin (entry point ``pytest11``); ``-p no:stallbench`` turns it off.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from stallbench.profile import Profile, profile

__all__ = ["OPTION", "LoaderStalls", "loader_stalls", "measure_stalls", "pytest_addoption"]

OPTION = "--stallbench-max-wait-fraction"


@dataclasses.dataclass(frozen=True)
class LoaderStalls:
    """What one measurement found; seconds are totals over the ``steady_steps`` steady-state batches (all
    ``steps`` when no epoch got past its first batch), but ``first_batch_seconds``: the epoch starts'.

    ``wait_fraction`` is wait / (wait + step). ``prep_stall_seconds`` and ``fetch_stall_seconds`` split the
    waiting time in the ratio of the loader's own decode + collate time to its fetch time (only for a
    ``loader.DataLoader`` over a source-backed dataset; None otherwise): an estimate of which stage to speed
    up. ``samples_per_s`` is None when a batch's size cannot be told. ``profile`` has the full timings.
    """

    steps: int
    steady_steps: int
    epochs: int
    wait_fraction: float
    wait_seconds: float
    step_seconds: float
    first_batch_seconds: float
    samples_per_s: float | None
    prep_stall_seconds: float | None
    fetch_stall_seconds: float | None
    profile: Profile = dataclasses.field(repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The figures without ``profile``: what goes into ``benchmark.extra_info["stallbench"]``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "profile"}


def measure_stalls(
    loader: Iterable[Any],
    step: Callable[[Any], Any] | None = None,
    steps: int = 50,
    name: str | None = None,
) -> LoaderStalls:
    """Time ``step(batch)`` (None: nothing, the loader's own pace) over up to ``steps`` batches."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if step is not None and not callable(step):
        raise TypeError(f"step must be a callable taking a batch, or None, got {type(step).__name__}")
    before = _stage_seconds(loader)
    prof = profile(loader, name)
    sizes = _drive(prof, step, steps)
    return _result(prof, sizes, _split(before, _stage_seconds(loader)))


def _result(prof: Profile, sizes: list[int | None], stages: tuple[float, float] | None) -> LoaderStalls:
    """The figures of a finished run; ``stages`` is the (fetch, prep) share of the stage times, or None."""
    tl = prof.timeline()
    keep = tl.index > 0 if np.any(tl.index > 0) else np.ones(len(tl.index), dtype=bool)
    wait, spent = float(tl.wait_s[keep].sum()), float(tl.step_s[keep].sum())
    total = wait + spent
    samples = [s for s, k in zip(sizes, keep, strict=True) if k]
    return LoaderStalls(
        steps=len(sizes),
        steady_steps=int(keep.sum()),
        epochs=int(tl.epoch.max()) + 1,
        wait_fraction=wait / total if total > 0 else 0.0,
        wait_seconds=wait,
        step_seconds=spent,
        first_batch_seconds=float(tl.wait_s[tl.index == 0].sum()),
        samples_per_s=sum(samples) / total if None not in samples and total > 0 else None,
        prep_stall_seconds=None if stages is None else wait * stages[1],
        fetch_stall_seconds=None if stages is None else wait * stages[0],
        profile=prof,
    )


def _drive(prof: Profile, step: Callable[[Any], Any] | None, steps: int) -> list[int | None]:
    """Run the loop; each batch's sample count, in the profile's order."""
    sizes: list[int | None] = []
    while len(sizes) < steps:
        start, epoch = len(sizes), iter(prof)
        try:
            for batch in epoch:
                sizes.append(_batch_samples(batch))
                if step is not None:
                    step(batch)
                if len(sizes) == steps:
                    break
        finally:
            epoch.close()  # ends the epoch's record now, not whenever the generator is collected
        if len(sizes) == start:
            raise ValueError(f"loader gave no batch in epoch {prof.timeline().epoch.max(initial=0) + 1}")
    return sizes


def _batch_samples(batch: Any) -> int | None:
    """Leading dimension of a tensor or array, of the first field of a tuple or dict, or a list's length."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if isinstance(batch, Mapping):
        return _batch_samples(next(iter(batch.values()))) if batch else None
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes) and batch:
        first = batch[0]
        nested = hasattr(first, "shape") or isinstance(first, Mapping | list | tuple)
        return _batch_samples(first) if nested else len(batch)
    return None


def _stage_seconds(obj: object) -> tuple[float, float] | None:
    """(fetch, decode + collate) seconds so far of a ``loader.DataLoader``; None for any other loader."""
    module = sys.modules.get("loader.dataloader")  # not imported: obj cannot be one of its loaders
    if module is None or not isinstance(obj, module.DataLoader):
        return None
    s = obj.stats()
    return s.fetch_seconds, s.decode_seconds + s.collate_seconds


def _split(before: tuple | None, after: tuple | None) -> tuple[float, float] | None:
    """(fetch, prep) shares of the stage time spent during the measurement; None without stage timings."""
    if before is None or after is None:
        return None
    fetch, prep = after[0] - before[0], after[1] - before[1]
    if fetch + prep <= 0:  # a plain torch dataset under loader.DataLoader: no stage timings
        return None
    return fetch / (fetch + prep), prep / (fetch + prep)


def _check_fraction(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


def _fraction_option(text: str) -> float:
    try:
        return _check_fraction(float(text), OPTION)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from err


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("stallbench").addoption(
        OPTION,
        type=_fraction_option,
        default=None,
        metavar="FRACTION",
        help="fail a loader_stalls measurement that waits for data more than this share of the time, "
        "unless the call gives its own max_wait_fraction",
    )


def _fail_message(result: LoaderStalls, limit: float, source: str) -> str:
    lines = [
        f"loader stalls: training waited for data {result.wait_fraction:.1%} of the time "
        f"(wait_fraction {result.wait_fraction:.3f}), above the threshold {source} {limit:g}",
        f"  waited {result.wait_seconds:.3f} s, stepped {result.step_seconds:.3f} s over "
        f"{result.steady_steps} steady-state batches ({result.steps} in {result.epochs} epoch(s)), "
        f"plus {result.first_batch_seconds:.3f} s waiting at epoch starts",
    ]
    if result.prep_stall_seconds is not None:
        lines.append(
            f"  of the wait, about {result.prep_stall_seconds:.3f} s is decode + collate and "
            f"{result.fetch_stall_seconds:.3f} s is fetching records"
        )
    return "\n".join(lines)


@pytest.fixture
def loader_stalls(request: pytest.FixtureRequest) -> Callable[..., LoaderStalls]:
    """``loader_stalls(loader, step=None, steps=50, max_wait_fraction=None, name=None)`` ->
    :class:`LoaderStalls`."""
    default = request.config.getoption(OPTION)
    bench = request.getfixturevalue("benchmark") if "benchmark" in request.fixturenames else None
    keys: list[str] = []

    def measure(
        loader: Iterable[Any],
        step: Callable[[Any], Any] | None = None,
        steps: int = 50,
        max_wait_fraction: float | None = None,
        name: str | None = None,
    ) -> LoaderStalls:
        key = f"stallbench[{name}]" if name else f"stallbench[{len(keys) + 1}]" if keys else "stallbench"
        if key in keys:
            raise ValueError(f"loader_stalls: {key!r} was measured already in this test; give another name")
        keys.append(key)
        limit, source = default, OPTION
        if max_wait_fraction is not None:
            limit, source = _check_fraction(max_wait_fraction, "max_wait_fraction"), "max_wait_fraction"

        def run() -> LoaderStalls:
            return measure_stalls(loader, step, steps, name=request.node.name)

        # pytest-benchmark allows one use per test: a later call (or a test that used it) measures directly
        result = bench.pedantic(run, rounds=1, iterations=1) if _unused(bench) else run()
        if bench is not None:
            bench.extra_info[key] = result.to_dict()
        if limit is not None and result.wait_fraction > limit:
            pytest.fail(_fail_message(result, limit, source), pytrace=False)
        return result

    return measure


def _unused(bench: Any) -> bool:
    return bench is not None and not getattr(bench, "_mode", None)
