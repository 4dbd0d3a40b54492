"""The generated default datasets: exact, deterministic, decodable, reused, and validated."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from stallbench import workloads
from stallbench.workloads import make_jpeg_folder, make_token_arrow

SMALL = {"num_images": 24, "num_classes": 3, "width": 160, "height": 120, "record_bytes": 20_000, "seed": 7}


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*.jpg")}


def test_jpeg_folder_layout_size_and_decoding(tmp_path: Path) -> None:
    root = make_jpeg_folder(tmp_path / "imgs", **SMALL)
    assert sorted(p.name for p in root.iterdir()) == [
        ".stallbench-workload.json",
        "class_00",
        "class_01",
        "class_02",
    ]
    files = sorted(root.rglob("*.jpg"))
    assert len(files) == 24
    assert (root / "class_01" / "img_000004.jpg").exists()  # image i lives in class i % num_classes
    for path in files:
        assert path.stat().st_size == 20_000
        with Image.open(path) as img:
            img.load()
            assert (img.format, img.size, img.mode) == ("JPEG", (160, 120), "RGB")
    assert len(set(_digests(root).values())) == 24  # every record unique
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]  # no temporary folder left behind


def test_jpeg_records_larger_than_one_comment_segment(tmp_path: Path) -> None:
    root = make_jpeg_folder(
        tmp_path / "big", num_images=3, num_classes=1, width=64, height=48, record_bytes=150_001
    )
    for path in root.rglob("*.jpg"):
        assert path.stat().st_size == 150_001
        with Image.open(path) as img:
            img.load()


def test_jpeg_without_target_size_has_realistic_sizes(tmp_path: Path) -> None:
    root = make_jpeg_folder(tmp_path / "natural", num_images=8, num_classes=2)
    sizes = [p.stat().st_size for p in root.rglob("*.jpg")]
    assert min(sizes) > 30_000 and max(sizes) < 150_000  # a 500x375 photo at quality 90


def test_jpeg_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    first = _digests(make_jpeg_folder(tmp_path / "a", **SMALL))
    assert _digests(make_jpeg_folder(tmp_path / "b", **SMALL)) == first
    other = _digests(make_jpeg_folder(tmp_path / "c", **{**SMALL, "seed": 8}))
    assert other.keys() == first.keys() and not set(other.values()) & set(first.values())


def test_jpeg_reuse_keeps_the_files_and_mismatch_raises(tmp_path: Path) -> None:
    root = make_jpeg_folder(tmp_path / "imgs", **SMALL)
    stamp = (root / "class_00" / "img_000000.jpg").stat().st_mtime_ns
    assert make_jpeg_folder(root, **SMALL) == root
    assert (root / "class_00" / "img_000000.jpg").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match=r"imgs.*num_images=24 \(wanted 25\).*overwrite=True"):
        make_jpeg_folder(root, **{**SMALL, "num_images": 25})
    make_jpeg_folder(root, **{**SMALL, "num_images": 25}, overwrite=True)
    assert len(list(root.rglob("*.jpg"))) == 25
    assert json.loads((root / workloads.MANIFEST_NAME).read_text())["num_images"] == 25


def test_jpeg_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="mine exists and was not made by stallbench"):
        make_jpeg_folder(tmp_path / "mine", **SMALL, overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()  # an empty folder is fine to fill
    assert len(list(make_jpeg_folder(tmp_path / "empty", **SMALL).rglob("*.jpg"))) == 24


def test_jpeg_progress_reports_the_end(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    make_jpeg_folder(
        tmp_path / "p", **{**SMALL, "num_images": 300}, progress=lambda d, t: calls.append((d, t))
    )
    assert calls == [(256, 300), (300, 300)]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_images": 0}, "num_images"),
        ({"num_images": -3}, "num_images"),
        ({"num_classes": 0}, "num_classes"),
        ({"num_classes": 25}, "num_classes"),
        ({"width": 0}, "width"),
        ({"height": 70_000}, "height"),
        ({"quality": 101}, "quality"),
        ({"record_bytes": 0}, "record_bytes"),
        ({"record_bytes": 5_000}, "record_bytes=5000 is below the JPEG content size"),
        ({"seed": -1}, "seed"),
        ({"num_images": 2.5}, "num_images"),
    ],
)
def test_jpeg_bad_arguments_name_themselves(tmp_path: Path, changes: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_jpeg_folder(tmp_path / "x", **{**SMALL, **changes})
    assert list(tmp_path.iterdir()) == []  # nothing half-made


@pytest.mark.slow
def test_default_image_workload_is_sized(tmp_path: Path) -> None:
    root = workloads.default_image_workload(tmp_path)
    files = list(root.rglob("*.jpg"))
    assert len(files) == workloads.DEFAULT_IMAGE_COUNT
    assert {p.stat().st_size for p in files} == {workloads.DEFAULT_RECORD_BYTES}
    with Image.open(files[0]) as img:
        assert img.size == workloads.DEFAULT_IMAGE_SIZE


def _read_tokens(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def test_token_arrow_readable_and_within_bounds(tmp_path: Path) -> None:
    path = make_token_arrow(tmp_path / "tok.arrow", num_sequences=5_000, min_len=8, max_len=512, vocab=1000)
    table = _read_tokens(path)
    assert table.schema.field("tokens").type == pa.list_(pa.int32())
    assert table.num_rows == 5_000
    lengths = np.array([len(s) for s in table.column("tokens").to_pylist()])
    assert lengths.min() >= 8 and lengths.max() <= 512
    assert 30 < np.median(lengths) < 130  # log-normal around sqrt(8 * 512) = 64
    values = table.column("tokens").combine_chunks().flatten().to_numpy()
    assert values.min() >= 0 and values.max() < 1000


def test_token_arrow_deterministic_reused_and_checked(tmp_path: Path) -> None:
    args = {"num_sequences": 300, "min_len": 4, "max_len": 64, "seed": 3}
    a = make_token_arrow(tmp_path / "a.arrow", **args)
    b = make_token_arrow(tmp_path / "b.arrow", **args)
    assert a.read_bytes() == b.read_bytes()
    stamp = a.stat().st_mtime_ns
    assert make_token_arrow(a, **args) == a and a.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match=r"a\.arrow.*seed=3 \(wanted 4\)"):
        make_token_arrow(a, **{**args, "seed": 4})
    make_token_arrow(a, **{**args, "seed": 4}, overwrite=True)
    assert a.read_bytes() != b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.arrow", "b.arrow"]


def test_token_arrow_fixed_length(tmp_path: Path) -> None:
    table = _read_tokens(make_token_arrow(tmp_path / "t.arrow", num_sequences=10, min_len=16, max_len=16))
    assert {len(s) for s in table.column("tokens").to_pylist()} == {16}


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_sequences": 0}, "num_sequences"),
        ({"min_len": 0}, "min_len"),
        ({"min_len": 65}, "min_len"),
        ({"vocab": 1}, "vocab"),
        ({"seed": -2}, "seed"),
    ],
)
def test_token_arrow_bad_arguments_name_themselves(tmp_path: Path, changes: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_token_arrow(
            tmp_path / "t.arrow", **{"num_sequences": 10, "min_len": 4, "max_len": 64, **changes}
        )
    assert list(tmp_path.iterdir()) == []
