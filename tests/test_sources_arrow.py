"""ArrowSource over Arrow IPC and Parquet: binary and token columns, labels, fingerprint, pickling, errors."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _data import jpeg_bytes, make_image_folder, read_in_fork

from loader.errors import BadRecordError, SourceError
from loader.sources import ArrowSource, image_folder_to_arrow

FORK_WARNING = "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"
IMAGES = [jpeg_bytes(i) for i in range(7)]
TOKENS = [list(range(i, 3 * i)) for i in range(7)]


def table(binary_type: pa.DataType | None = None, token_type: pa.DataType | None = None) -> pa.Table:
    return pa.table(
        {
            "image": pa.array(IMAGES, binary_type or pa.binary()),
            "tokens": pa.array(TOKENS, token_type or pa.list_(pa.int64())),
            "label": pa.array(range(7), pa.int32()),
            "name": [f"r{i}" for i in range(7)],
        }
    )


def write(path, data: pa.Table, rows_per_chunk: int = 3):
    """An IPC file (record batches) or a Parquet file (row groups) of ``rows_per_chunk`` rows."""
    if str(path).endswith(".parquet"):
        pq.write_table(data, path, row_group_size=rows_per_chunk)
    else:
        with pa.ipc.new_file(path, data.schema) as writer:
            for batch in data.to_batches(max_chunksize=rows_per_chunk):
                writer.write_batch(batch)
    return path


@pytest.fixture(params=["data.arrow", "data.parquet"])
def path(request, tmp_path):
    return write(tmp_path / request.param, table())


def test_binary_column_reads_bytes_across_chunks(path):
    source = ArrowSource(path, column="image", label_column="label")
    assert len(source) == 7
    assert [source.read(i) for i in [6, 0, 3, 2, 5, 1, 4]] == [IMAGES[i] for i in [6, 0, 3, 2, 5, 1, 4]]
    assert [source.label(i) for i in range(7)] == list(range(7))
    assert source.describe(4) == f"{path}:4"


def test_token_column_reads_little_endian_int32(path):
    source = ArrowSource(path, column="tokens")
    for i in [5, 0, 6]:
        assert source.read(i) == np.asarray(TOKENS[i], dtype="<i4").tobytes()
    assert source.read(0) == b""
    assert source.label(3) is None


@pytest.mark.parametrize("binary_type, token_type", [(pa.large_binary(), pa.large_list(pa.int16()))])
def test_large_types(tmp_path, binary_type, token_type):
    path = write(tmp_path / "large.arrow", table(binary_type, token_type))
    assert ArrowSource(path, column="image").read(4) == IMAGES[4]
    assert ArrowSource(path, column="tokens").read(4) == np.asarray(TOKENS[4], dtype="<i4").tobytes()


def test_single_record_column_is_picked(tmp_path):
    path = write(tmp_path / "one.arrow", table().drop_columns(["tokens"]))
    assert ArrowSource(path).column == "image"


def test_fingerprint_stable_and_sensitive_to_add_remove_change(path):
    base = ArrowSource(path, column="image").fingerprint
    assert ArrowSource(path, column="image").fingerprint == base
    assert ArrowSource(path, column="tokens").fingerprint != base
    original = table()
    variants = [
        pa.concat_tables([original, original.slice(0, 1)]),  # added
        original.slice(1),  # removed
        original.set_column(0, "image", pa.array([b"x", *IMAGES[1:]], pa.binary())),  # changed
    ]
    fingerprints = {base}
    for variant in variants:
        write(path, variant)
        fingerprints.add(ArrowSource(path, column="image").fingerprint)
    assert len(fingerprints) == 4


def test_pickle_round_trip(path):
    source = ArrowSource(path, column="image", label_column="label")
    source.read(2)
    copy = pickle.loads(pickle.dumps(source))
    assert [copy.read(i) for i in range(7)] == IMAGES
    assert (copy.label(5), copy.fingerprint) == (5, source.fingerprint)


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_read_in_forked_child(path):
    source = ArrowSource(path, column="image")
    source.read(0)
    assert read_in_fork(source, [6, 0, 3]) == [IMAGES[6], IMAGES[0], IMAGES[3]]


def test_image_folder_to_arrow(tmp_path):
    records = make_image_folder(tmp_path / "imgs", {"b": 2, "a": 3})
    source = image_folder_to_arrow(tmp_path / "imgs", tmp_path / "out.arrow", batch_rows=2)
    assert [(source.read(i), source.label(i)) for i in range(len(source))] == records
    assert sorted(os.listdir(tmp_path)) == ["imgs", "out.arrow"]


def test_missing_file(tmp_path):
    with pytest.raises(SourceError, match=re.escape(str(tmp_path / "none.arrow"))):
        ArrowSource(tmp_path / "none.arrow")


def test_not_arrow_or_parquet(tmp_path):
    (tmp_path / "x.arrow").write_text("hello, world")
    with pytest.raises(SourceError, match=re.escape(str(tmp_path / "x.arrow")) + ".*neither"):
        ArrowSource(tmp_path / "x.arrow")


def test_missing_column_lists_columns(path):
    with pytest.raises(SourceError, match=f"{re.escape(str(path))}.*'pixels'.*image.*tokens.*label.*name"):
        ArrowSource(path, column="pixels")
    with pytest.raises(SourceError, match=r"no label column 'target'.*image"):
        ArrowSource(path, column="image", label_column="target")


def test_ambiguous_or_wrong_type_column(path):
    with pytest.raises(SourceError, match=r"name the record column.*\['image', 'tokens'\]"):
        ArrowSource(path)
    with pytest.raises(SourceError, match="'name' is string, not binary"):
        ArrowSource(path, column="name")


def test_null_and_out_of_range_values_name_file_and_row(tmp_path):
    data = pa.table(
        {
            "image": pa.array([b"a", None, b"c"]),
            "tokens": pa.array([[1], [2**40], [None]], pa.list_(pa.int64())),
        }
    )
    path = write(tmp_path / "bad.arrow", data)
    where = re.escape(f"{path}:1")
    with pytest.raises(BadRecordError, match=f"record 1 \\({where}\\).*null"):
        ArrowSource(path, column="image").read(1)
    with pytest.raises(BadRecordError, match=f"record 1 \\({where}\\).*int32"):
        ArrowSource(path, column="tokens").read(1)
    with pytest.raises(BadRecordError, match=re.escape(f"{path}:2") + ".*null"):
        ArrowSource(path, column="tokens").read(2)


def test_docs_examples_run(tmp_path, monkeypatch):
    doc = Path(__file__).resolve().parent.parent / "docs" / "sources.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    exec(compile("\n".join(blocks), str(doc), "exec"), {})
