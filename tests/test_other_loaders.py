"""LitData, MosaicML Streaming and WebDataset beside torch's loader and ours: the data converted with their
own tools (beside it, or beside it in the bucket), every sample as our dataset gives it, and ``stallbench
compare --loaders`` with all five in one report."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import documented_command

import loader
from stallbench.jobs.converted import ConversionError, converted_copy, existing_copy
from stallbench.jobs.kinds import KINDS
from stallbench.jobs.others import LITDATA, STREAMING, WEBDATASET, convert
from stallbench.jobs.spec import GENERATED_STATS, WorkloadJob
from stallbench.jobs.streaming_import import STAND_IN_NOTE
from stallbench.report import validate_report_json
from stallbench.workloads import make_jpeg_folder

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "stallbench.md"
OTHERS = (LITDATA, STREAMING, WEBDATASET)
IMAGES = 40


@pytest.fixture
def images(tmp_path: Path) -> Path:
    return make_jpeg_folder(tmp_path / "imgs", num_images=IMAGES, record_bytes=6000, width=64, height=48)


def _samples(dl) -> list[tuple[int, torch.Tensor]]:
    return [(int(y), x) for xs, ys in dl for x, y in zip(xs, ys, strict=True)]


def _by_content(samples: list[tuple[int, torch.Tensor]]) -> list[tuple[int, torch.Tensor]]:
    return sorted(samples, key=lambda s: (s[0], s[1].numpy().tobytes()))


def _peer_samples(data: str, kind: str) -> list[tuple[int, torch.Tensor]]:
    """An epoch of ``kind``'s loader over its copy of ``data``, by content (2 workers: the peers' files are
    opened, and closed, in them)."""
    job = WorkloadJob(kind, data, workers=2, batch_size=8, transform="eval")
    ours = loader.ImageFolder(data, transform="eval")
    options = dict(batch_size=8, shuffle=True, num_workers=2)
    dl = KINDS[kind].build(ours, torch.utils.data.default_collate, job, **options)
    return _by_content(_samples(dl))


@pytest.mark.parametrize("kind", OTHERS)
def test_each_loader_gives_every_sample_ours_gives_once_an_epoch(images, kind):
    convert(str(images), kind)
    job = WorkloadJob(kind, str(images), workers=2, batch_size=8, transform="eval")
    ours = loader.ImageFolder(str(images), transform="eval")
    options = dict(batch_size=8, shuffle=True, num_workers=2, persistent_workers=True)
    dl = KINDS[kind].build(ours, torch.utils.data.default_collate, job, **options)
    expected = _by_content(_samples(torch.utils.data.DataLoader(ours, batch_size=8)))
    for _ in range(2):  # every epoch, each image once
        got = _by_content(_samples(dl))
        assert len(got) == IMAGES and getattr(dl, GENERATED_STATS, None) is None  # no stage counters
        assert all(a == b and torch.equal(x, y) for (a, x), (b, y) in zip(got, expected, strict=True))


@pytest.mark.parametrize("kind", OTHERS)
def test_a_copy_is_made_once_and_again_when_the_data_changes(images, kind):
    copy = convert(str(images), kind)
    assert copy == str(images.with_name(f"imgs.{kind}")) and existing_copy(images, kind) == copy
    stamp = (Path(copy) / "stallbench-source.json").stat()
    assert convert(str(images), kind) == copy
    assert (Path(copy) / "stallbench-source.json").stat().st_ino == stamp.st_ino  # reused, not written again
    first = sorted(images.rglob("*.jpg"))[0]
    first.write_bytes(sorted(images.rglob("*.jpg"))[1].read_bytes())
    with pytest.raises(ConversionError, match=r"no .* copy of .* that matches it"):
        existing_copy(images, kind)
    convert(str(images), kind)
    assert existing_copy(images, kind) == copy
    assert sorted(p.name for p in images.parent.iterdir()) == ["imgs", f"imgs.{kind}"]


def test_a_folder_we_did_not_write_is_named_and_left_alone(images):
    theirs = images.with_name("imgs.litdata")
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(
        ConversionError, match=rf"{re.escape(str(theirs))}: the litdata copy of .* something else is there"
    ):
        convert(str(images), LITDATA)
    assert (theirs / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("planted", ["link", "group-writable"])
def test_a_copy_we_cannot_trust_is_never_read_or_removed(images, tmp_path, planted):
    convert(str(images), WEBDATASET)
    copy = images.with_name("imgs.webdataset")
    if planted == "link":  # someone's copy elsewhere, linked in place of ours
        theirs = copy.rename(tmp_path / "elsewhere")
        copy.symlink_to(theirs)
    else:
        copy.chmod(0o775)
    with pytest.raises(ConversionError, match="no webdataset copy"):
        existing_copy(images, WEBDATASET)
    with pytest.raises(ConversionError, match="something else is there"):
        convert(str(images), WEBDATASET)
    assert (copy / "stallbench-source.json").exists()  # left as it was


def test_litdata_s_tool_leaves_this_process_s_ctrl_c_and_tmp_alone(images):
    before = signal.getsignal(signal.SIGINT)
    chunks = Path("/tmp/chunks")
    existed = chunks.exists() and chunks.stat().st_mtime_ns
    convert(str(images), LITDATA)
    assert signal.getsignal(signal.SIGINT) is before
    assert (chunks.exists() and chunks.stat().st_mtime_ns) == existed
    assert (images.with_name("imgs.litdata") / "index.json").is_file()


def test_only_an_image_folder_converts(tmp_path):
    data = tmp_path / "tokens.arrow"
    data.write_bytes(b"not an image folder")
    with pytest.raises(
        ConversionError, match=rf"{re.escape(str(data))}: other loaders are compared on an image folder"
    ):
        convert(str(data), WEBDATASET)


def test_a_conversion_cut_short_leaves_no_copy(images):
    def dies(data: str, folder: Path) -> None:
        (folder / "half.tar").write_bytes(b"x" * 100)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        converted_copy(images, WEBDATASET, dies)
    assert sorted(p.name for p in images.parent.iterdir()) == ["imgs"]
    with pytest.raises(ConversionError, match="no webdataset copy"):
        existing_copy(images, WEBDATASET)


def _writer(log: Path, seconds: float):
    """A conversion that says it started (a line of its pid in ``log``) and takes ``seconds``."""

    def write(data: str, folder: Path) -> None:
        with log.open("a") as f:
            f.write(f"{os.getpid()}\n")
        (folder / "half.tar").write_bytes(b"x" * 100)
        time.sleep(seconds)

    return write


def _converter(images: Path, log: Path, seconds: float) -> multiprocessing.Process:
    """A process converting ``images``, started once its conversion has begun (its line in ``log``)."""
    process = multiprocessing.get_context("fork").Process(
        target=converted_copy, args=(images, WEBDATASET, _writer(log, seconds))
    )
    process.start()
    deadline = time.monotonic() + 30
    while str(process.pid) not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.01)
    return process


def _beside(images: Path) -> list[str]:
    return sorted(p.name for p in images.parent.iterdir())


def test_two_conversions_at_once_write_one_copy(images, tmp_path_factory):
    """Two analyses of one folder at once (issue 49): the second waits for the first's copy and uses it, where
    it wrote its own and moved the first's aside while the first's runs read it."""
    log = tmp_path_factory.mktemp("log") / "writes"
    first = _converter(images, log, 1.0)
    try:
        copy = converted_copy(images, WEBDATASET, _writer(log, 0.0))
        first.join(timeout=30)
        assert first.exitcode == 0
    finally:
        first.kill()
    assert copy == existing_copy(images, WEBDATASET) == str(images.with_name("imgs.webdataset"))
    assert log.read_text().splitlines() == [str(first.pid)]  # written once, by the first
    assert _beside(images) == ["imgs", "imgs.webdataset"]


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_a_converter_killed_mid_copy_leaves_the_next_free_and_nothing_behind(images, tmp_path_factory, stop):
    log = tmp_path_factory.mktemp("log") / "writes"
    killed = _converter(images, log, 60.0)
    try:
        os.kill(killed.pid, stop)
        killed.join(timeout=30)
        assert killed.exitcode == -stop
        copy = converted_copy(images, WEBDATASET, _writer(log, 0.0))
    finally:
        killed.kill()
    assert copy == existing_copy(images, WEBDATASET)
    assert _beside(images) == ["imgs", "imgs.webdataset"]  # the half-written copy removed


def test_a_stopped_converter_is_named_not_waited_for(images, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "writes"
    stopped = _converter(images, log, 60.0)
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        with pytest.raises(ConversionError, match=rf"process {stopped.pid} is converting it and is stopped"):
            converted_copy(images, WEBDATASET, _writer(log, 0.0))
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
        stopped.kill()
        stopped.join(timeout=30)
    assert log.read_text().splitlines() == [str(stopped.pid)]  # nothing written beside it meanwhile


def test_a_library_not_installed_is_named(images, monkeypatch):
    monkeypatch.setitem(sys.modules, "litdata", None)  # import litdata now raises ImportError
    with pytest.raises(ConversionError, match=r"--loaders litdata: litdata is not installed here"):
        convert(str(images), LITDATA)


def test_streaming_s_package_is_named_as_pip_knows_it(images, monkeypatch):
    def missing():
        raise ImportError("No module named 'streaming'")

    monkeypatch.setattr("stallbench.jobs.others.streaming", missing)
    with pytest.raises(
        ConversionError, match=r"streaming is not installed here \(pip install mosaicml-streaming\)"
    ):
        convert(str(images), STREAMING)


def test_streaming_imports_beside_a_torchvision_that_does_not_and_nothing_else_sees_a_stand_in():
    script = """
import importlib.util, sys
from stallbench.jobs.streaming_import import needs_stand_in, streaming
package = streaming()
assert needs_stand_in() and package.StreamingDataset and "torchvision" not in sys.modules
assert importlib.util.find_spec("torchvision") is None  # what transformers and Lightning ask
try:
    package.vision.StreamingCIFAR10  # defined, never built here
    package.vision.base.VisionDataset()
except ImportError as err:
    print(err)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "stallbench imported Streaming with a stand-in for it" in done.stdout


def _stallbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", "stallbench", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=600)


@pytest.mark.slow
def test_compare_puts_every_loader_in_one_report_as_documented(tmp_path):
    done = _stallbench(
        *documented_command(REFERENCE, "stallbench compare --data images:100 --loaders"), cwd=tmp_path
    )  # in a fresh folder: its data generated there
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    validate_report_json(report)
    assert [r["loader"] for r in report["loaders"]] == ["torch", "cached", *OTHERS]
    assert set(report["ratios_to_baseline"]) == {"cached", *OTHERS}
    images = report["workload"]["samples"]
    for r in report["loaders"]:
        pipeline = [e for run in r["runs"] if run["phase"] != "ingestion" for e in run["epochs"]]
        assert [e["samples"] for e in pipeline] == [images] * 4, r["loader"]
    cold = {r["loader"]: next(run for run in r["runs"] if run["phase"] == "cold") for r in report["loaders"]}
    assert all(run["epochs"][0]["storage_bytes"] > 0 for run in cold.values())  # each read its own files
    assert all(f"{kind} vs torch" in done.stdout for kind in OTHERS)
    assert " ".join(STAND_IN_NOTE.split()) in " ".join(done.stdout.split())  # named where it stood in


def test_a_command_cannot_be_compared_with_a_loader_of_another_format(images, tmp_path):
    argv = [
        "compare",
        "--data",
        str(images),
        "--loaders",
        "torch,litdata",
        "--",
        sys.executable,
        "-c",
        "pass",
    ]
    done = _stallbench(*argv, cwd=tmp_path)
    assert done.returncode == 2
    assert "litdata reads data converted to its own format" in done.stderr
    assert "choose from torch, cached" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def bucket(s3_tls_server, images) -> str:
    from helpers import upload_jpegs

    upload_jpegs(images)
    return "s3://data/train"


@pytest.mark.slow
def test_compare_runs_the_other_loaders_on_their_copies_in_the_bucket_as_documented(bucket, tmp_path):
    command = "stallbench compare --data s3://data/train --loaders litdata"
    done = _stallbench(*documented_command(REFERENCE, command), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    validate_report_json(report)
    assert [r["loader"] for r in report["loaders"]] == list(OTHERS)
    for r in report["loaders"]:
        pipeline = [e for run in r["runs"] if run["phase"] != "ingestion" for e in run["epochs"]]
        assert [e["samples"] for e in pipeline] == [IMAGES] * 2, r["loader"]  # prep, cold
    assert all(existing_copy(bucket, kind) == f"{bucket}.{kind}" for kind in OTHERS)


def test_a_copy_in_the_bucket_is_put_once_and_what_is_not_ours_is_named(s3_server, images):
    import boto3
    from helpers import upload_jpegs

    upload_jpegs(images)
    s3 = boto3.client("s3")
    copy = convert("s3://data/train", WEBDATASET)
    assert copy == "s3://data/train.webdataset"
    stamp = s3.head_object(Bucket="data", Key="train.webdataset/stallbench-source.json")["ETag"]
    assert convert("s3://data/train", WEBDATASET) == copy  # reused: nothing put again
    assert s3.head_object(Bucket="data", Key="train.webdataset/stallbench-source.json")["ETag"] == stamp
    s3.put_object(Bucket="data", Key="train.litdata/theirs.bin", Body=b"not ours")
    with pytest.raises(ConversionError, match=r"s3://data/train\.litdata: .*something else is there"):
        convert("s3://data/train", LITDATA)
    assert s3.get_object(Bucket="data", Key="train.litdata/theirs.bin")["Body"].read() == b"not ours"
    with pytest.raises(ConversionError, match=r"s3://data/train\.litdata: no litdata copy"):
        existing_copy("s3://data/train", LITDATA)


def test_an_analysis_downloads_and_converts_the_bucket_once(s3_server, images, monkeypatch):
    """Issue 49: the analysis's copy in memory, converted for its prep run, is what goes beside the data in
    the bucket for its cold run, where ``prepare`` downloaded and converted the objects once more."""
    from helpers import upload_jpegs

    from stallbench.analysis import object_data
    from stallbench.analysis.analyze import prepare
    from stallbench.analysis.request import AnalysisRequest
    from stallbench.jobs import object_copies
    from stallbench.jobs.writers import WRITERS

    upload_jpegs(images)
    downloads, conversions = [], []
    download, write = object_copies.download, WRITERS[WEBDATASET]
    counted_download = lambda source, folder: (downloads.append(folder), download(source, folder))  # noqa: E731
    monkeypatch.setattr(object_copies, "download", counted_download)
    monkeypatch.setattr(object_data, "download", counted_download)
    monkeypatch.setitem(WRITERS, WEBDATASET, lambda data, out: (conversions.append(data), write(data, out)))
    plan = prepare(AnalysisRequest(data="s3://data/train"), ["torch", WEBDATASET])
    assert (downloads, conversions) == ([], [])  # prepare checks the tool is there; the runs convert
    with plan.opened() as (opened, _):
        assert existing_copy("s3://data/train", WEBDATASET) == "s3://data/train.webdataset"  # the cold run's
        prep_copy = existing_copy(opened.in_memory_data, WEBDATASET)  # the prep run's, beside the copy
        cold = _peer_samples("s3://data/train", WEBDATASET)
        assert len(cold) == IMAGES
        same = zip(cold, _peer_samples(opened.in_memory_data, WEBDATASET), strict=True)
        assert all(a == b and torch.equal(x, y) for (a, x), (b, y) in same)  # one conversion, in two places
    assert len(downloads) == 1 and len(conversions) == 1, (downloads, conversions)
    assert not Path(prep_copy).exists()  # removed with the copy in memory


def test_a_copy_in_the_bucket_cut_short_or_stale_is_replaced_and_data_at_the_root_gets_none(
    s3_server, images
):
    import boto3
    from helpers import upload_jpegs

    upload_jpegs(images)
    s3 = boto3.client("s3")
    # a conversion killed mid-upload: its first stamp says it was being written, a shard is half there
    s3.put_object(
        Bucket="data",
        Key="train.webdataset/stallbench-source.json",
        Body=b'{"data": "s3://data/train", "writing": true}',
    )
    s3.put_object(Bucket="data", Key="train.webdataset/shard-00000.tar", Body=b"half a shard")
    with pytest.raises(ConversionError, match="no webdataset copy"):
        existing_copy("s3://data/train", WEBDATASET)  # never trusted while cut short
    copy = convert("s3://data/train", WEBDATASET)
    shard = s3.get_object(Bucket="data", Key="train.webdataset/shard-00000.tar")["Body"].read()
    assert shard != b"half a shard" and existing_copy("s3://data/train", WEBDATASET) == copy
    s3.put_object(
        Bucket="data", Key="train/class0/extra.jpg", Body=sorted(images.rglob("*.jpg"))[0].read_bytes()
    )
    with pytest.raises(ConversionError, match="no webdataset copy"):
        existing_copy("s3://data/train", WEBDATASET)  # the data changed: the copy is stale
    assert (
        convert("s3://data/train", WEBDATASET) == copy
        and existing_copy("s3://data/train", WEBDATASET) == copy
    )
    s3.create_bucket(Bucket="root")  # an image folder at a bucket's root
    for path in sorted(images.rglob("*.jpg")):
        s3.put_object(Bucket="root", Key=str(path.relative_to(images)), Body=path.read_bytes())
    with pytest.raises(ConversionError, match=r"s3://root: .*bucket's root has no place beside it"):
        convert("s3://root", WEBDATASET)
