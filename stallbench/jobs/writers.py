"""The other loaders' own tools, writing an image folder in their formats (``converted.converted_copy``).

- LitData: ``litdata.optimize`` into chunks of 64 MB (its default). It runs in a child process,
  ``python -m stallbench.jobs.writers litdata DATA FOLDER``: it installs a Ctrl-C handler that ends its
  process with exit code 0 and never puts the old one back, and it empties fixed folders under ``/tmp``
  (``/tmp/chunks``, ``/tmp/data``) unless told others; the child gets private ones, removed with it.
- WebDataset: ``webdataset.ShardWriter`` into 16 tar shards (many more than the workers, as WebDataset asks),
  a sample per image: its bytes (``jpg``) and its label (``cls``).
- MosaicML Streaming: ``streaming.MDSWriter`` into MDS shards of 64 MB (its default size, no compression),
  columns ``image`` (bytes) and ``label`` (int).
"""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from stallbench.jobs.kinds import LITDATA, STREAMING, WEBDATASET

__all__ = ["WRITERS"]

_CHUNK_BYTES = 64 << 20
_SHARDS = 16
_TAIL = 2_000  # characters of a failed child's stderr kept in the error


def _source(data: str) -> Any:
    import loader

    return loader.ImageFolderSource(data)


def _record(source: Any, index: int) -> dict[str, Any]:
    return {"image": source.read(index), "label": int(source.label(index))}


def _optimize(data: str, folder: str) -> None:
    import litdata

    source = _source(data)
    litdata.optimize(
        fn=functools.partial(_record, source),
        inputs=list(range(len(source))),
        output_dir=folder,
        chunk_bytes=_CHUNK_BYTES,
        num_workers=1,
        verbose=False,
    )


def write_litdata(data: str, folder: Path) -> None:
    """``litdata.optimize`` in a child process with private working folders; OSError with the end of its
    stderr where it fails."""
    from stallbench.jobs.run import child_env

    work = Path(tempfile.mkdtemp(prefix="sb-litdata-"))
    try:
        env = child_env(work)
        env.update(
            DATA_OPTIMIZER_CACHE_FOLDER=str(work / "chunks"),
            DATA_OPTIMIZER_DATA_CACHE_FOLDER=str(work / "data"),
        )
        argv = [sys.executable, "-m", "stallbench.jobs.writers", LITDATA, data, str(folder)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0 or not (folder / "index.json").is_file():
        raise OSError(f"litdata.optimize exited {done.returncode}: {done.stderr[-_TAIL:]}")


def write_webdataset(data: str, folder: Path) -> None:
    import webdataset

    source = _source(data)
    per_shard = max(1, math.ceil(len(source) / _SHARDS))
    with webdataset.ShardWriter(str(folder / "shard-%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for index in range(len(source)):
            label = str(int(source.label(index))).encode()
            sink.write({"__key__": f"{index:09d}", "jpg": source.read(index), "cls": label})


def write_streaming(data: str, folder: Path) -> None:
    from stallbench.jobs.streaming_import import streaming

    source = _source(data)
    columns = {"image": "bytes", "label": "int"}
    with streaming().MDSWriter(out=str(folder), columns=columns, progress_bar=False) as sink:
        for index in range(len(source)):
            sink.write(_record(source, index))


WRITERS = {LITDATA: write_litdata, STREAMING: write_streaming, WEBDATASET: write_webdataset}

if __name__ == "__main__":
    _optimize(*sys.argv[2:4])
