"""LMDBSource and image_folder_to_lmdb: layout, reads, labels, fingerprint, pickling, fork and errors."""

from __future__ import annotations

import os
import pickle
import re

import lmdb
import numpy as np
import pytest
from _data import make_image_folder, read_in_fork

from loader.errors import BadRecordError, SourceError
from loader.sources import LMDBSource, image_folder_to_lmdb
from loader.sources.lmdb_source import LABELS_KEY, LEN_KEY, pack_record, record_key

FORK_WARNING = "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"


@pytest.fixture
def converted(tmp_path):
    records = make_image_folder(tmp_path / "imgs", {"b": 2, "a": 3})
    return image_folder_to_lmdb(tmp_path / "imgs", tmp_path / "db"), records


def write_env(path, values: dict[bytes, bytes]) -> None:
    with lmdb.open(str(path), map_size=1 << 22, lock=False) as env, env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)


def test_converted_records_labels_and_classes(converted):
    source, records = converted
    assert len(source) == 5
    assert source.classes == ["a", "b"]
    assert [source.read(i) for i in range(5)] == [data for data, _ in records]
    assert [source.label(i) for i in range(5)] == [label for _, label in records]
    assert source.describe(3) == f"{source.path}[3]"


def test_hand_written_layout_without_classes_or_labels_key(tmp_path):
    write_env(
        tmp_path, {LEN_KEY: b"2", record_key(0): pack_record(None, b"x"), record_key(1): pack_record(7, b"")}
    )
    source = LMDBSource(tmp_path)
    assert source.classes is None
    assert [source.read(0), source.read(1)] == [b"x", b""]
    with pytest.warns(UserWarning, match="no b'__labels__' key"):
        assert source.label(0) is None
    assert source.label(1) == 7  # warned once


def test_labels_key_answers_without_reading_records(tmp_path):
    labels = np.array([3, -1], dtype=">i4").tobytes()
    write_env(tmp_path, {LEN_KEY: b"2", LABELS_KEY: labels, record_key(0): pack_record(3, b"x")})
    source = LMDBSource(tmp_path)
    assert [source.label(0), source.label(1)] == [3, None]
    with pytest.raises(BadRecordError, match="record 1"):
        source.read(1)


def test_labels_key_of_wrong_length(tmp_path):
    write_env(tmp_path, {LEN_KEY: b"3", LABELS_KEY: b"\0" * 8})
    with pytest.raises(SourceError, match=re.escape(str(tmp_path)) + ".*__labels__.*8 bytes for b'3'"):
        LMDBSource(tmp_path)


def fingerprint_of(path) -> str:
    """The fingerprint of a fresh opening, closed again so the environment can be written."""
    return LMDBSource(path).fingerprint


def test_fingerprint_stable_and_sensitive_to_add_remove_change(tmp_path):
    make_image_folder(tmp_path / "imgs", {"a": 3})
    db = image_folder_to_lmdb(tmp_path / "imgs", tmp_path / "db").path
    base = fingerprint_of(db)
    assert fingerprint_of(db) == base
    fingerprints = {base}
    edits = [
        {record_key(3): pack_record(0, b"new"), LEN_KEY: b"4", LABELS_KEY: bytes(16)},  # added
        {LEN_KEY: b"3", LABELS_KEY: bytes(12)},  # removed again
        {record_key(2): pack_record(0, b"changed")},  # changed
    ]
    for edit in edits:
        write_env(db, edit)
        fingerprints.add(fingerprint_of(db))
    assert len(fingerprints) == 4


def test_pickle_round_trip(converted):
    source, records = converted
    source.read(0)
    copy = pickle.loads(pickle.dumps(source))
    assert [copy.read(i) for i in range(len(copy))] == [data for data, _ in records]
    assert copy.fingerprint == source.fingerprint


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_read_in_forked_child(converted):
    source, records = converted
    source.read(1)
    assert read_in_fork(source, [4, 1, 0]) == [records[4][0], records[1][0], records[0][0]]


def test_conversion_refuses_existing_destination_and_cleans_up_failures(tmp_path):
    make_image_folder(tmp_path / "imgs", {"a": 2})
    (tmp_path / "db").mkdir()
    with pytest.raises(FileExistsError, match=re.escape(str(tmp_path / "db"))):
        image_folder_to_lmdb(tmp_path / "imgs", tmp_path / "db")
    with pytest.raises(lmdb.MapFullError):
        image_folder_to_lmdb(tmp_path / "imgs", tmp_path / "small", map_size=4096)
    assert sorted(os.listdir(tmp_path)) == ["db", "imgs"]


def test_missing_path(tmp_path):
    with pytest.raises(SourceError, match=re.escape(str(tmp_path / "nope"))):
        LMDBSource(tmp_path / "nope")


def test_not_an_lmdb_environment(tmp_path):
    (tmp_path / "data.mdb").write_bytes(b"not lmdb" * 1000)
    with pytest.raises(SourceError, match=re.escape(str(tmp_path)) + ".*not an LMDB"):
        LMDBSource(tmp_path)


def test_missing_len_key(tmp_path):
    write_env(tmp_path, {record_key(0): pack_record(0, b"x")})
    with pytest.raises(SourceError, match=re.escape(str(tmp_path)) + ".*__len__"):
        LMDBSource(tmp_path)


def test_missing_key_and_truncated_value_name_path_and_index(tmp_path):
    write_env(tmp_path, {LEN_KEY: b"3", record_key(0): pack_record(0, b"x"), record_key(1): b"ab"})
    source = LMDBSource(tmp_path)
    path = re.escape(str(tmp_path))
    with pytest.raises(BadRecordError, match=f"record 2 \\({path}\\[2\\]\\).*no such key"):
        source.read(2)
    with pytest.raises(BadRecordError, match=f"record 1 \\({path}\\[1\\]\\).*truncated"):
        source.read(1)


def test_a_bad_record_among_those_fingerprinted_does_not_stop_the_loader(tmp_path):
    from loader import DataLoader, LMDBDataset

    values = {LEN_KEY: b"16", LABELS_KEY: np.arange(16, dtype=">i4").tobytes()}
    values.update({record_key(i): pack_record(i, bytes([i]) * 10) for i in range(16) if i != 8})
    write_env(tmp_path, values)  # record 8, one the fingerprint samples, is missing
    dl = DataLoader(LMDBDataset(tmp_path, transform=None), batch_size=4, on_error="skip")
    assert [raw for batch, _ in dl for raw in batch] == [bytes([i]) * 10 for i in range(16) if i != 8]
    assert dl.stats().records_skipped == 1
    assert LMDBSource(tmp_path).fingerprint == dl.dataset.source.fingerprint
