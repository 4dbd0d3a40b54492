"""A generated job's dataset and loader: any format the loader reads, every loader kind instrumented alike
(the kind builds it: ``stallbench.jobs.kinds``); token data batched padded or packed
(``stallbench.jobs.batching``). torch is imported where a loader is made: stallbench's own process only opens
the data's source (``open_source``), to size it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stallbench.conditions.storage import in_object_storage
from stallbench.jobs.kinds import KINDS
from stallbench.jobs.spec import WorkloadJob

__all__ = [
    "data_format",
    "make_dataset",
    "make_loader",
    "open_source",
]

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".parquet")


def make_dataset(data: str | Path, transform: Any) -> Any:
    """An image folder (local, or in object storage: ``s3://bucket/prefix``), an LMDB folder (has data.mdb),
    tar shards (a .tar file or a folder of them), an Arrow/Parquet file or a Hugging Face dataset saved to
    disk, as a SourceDataset."""
    import loader

    kind = data_format(data)
    if kind == "lmdb":
        return loader.LMDBDataset(str(data), transform=transform)
    if kind == "tar":
        return loader.TarShards(str(data), transform=transform)
    if kind == "arrow":
        source = open_source(data)  # opened as the job will open it
        labels = "label" if "label" in source.columns else None
        transform = transform if source.kind == "binary" else None  # image transforms do not apply to tokens
        return loader.ArrowDataset(str(data), column=source.column, label_column=labels, transform=transform)
    return loader.ImageFolder(str(data), transform=transform)


def open_source(data: str | Path) -> Any:
    """The records ``make_dataset``'s dataset reads, as the loader's Source: opened without torch (what
    stallbench's own process needs to size the data)."""
    kind = data_format(data)  # each source's own library (lmdb, pyarrow) only where it is needed
    if kind == "lmdb":
        from loader.sources import LMDBSource

        return LMDBSource(str(data))
    if kind == "tar":
        from loader.sources import TarShardsSource

        return TarShardsSource(str(data))
    if kind == "arrow":
        from loader.sources import arrow_data

        return arrow_data(str(data))
    from loader.sources import image_folder

    return image_folder(str(data))


def data_format(data: str | Path) -> str:
    """Which of the loader's formats ``data`` is in: "lmdb", "tar", "arrow" or "images" (a folder of them,
    local or in object storage)."""
    if in_object_storage(data):
        return "images"
    path = Path(data)
    if path.is_dir() and (path / "data.mdb").exists():
        return "lmdb"
    if path.suffix.lower() == ".tar" or (path.is_dir() and any(path.glob("*.tar"))):
        return "tar"
    return "arrow" if _arrow(path) else "images"


def _arrow(path: Path) -> bool:
    """An Arrow/Parquet file, or a folder Hugging Face's ``save_to_disk`` wrote (it holds state.json)."""
    return path.suffix.lower() in ARROW_SUFFIXES or (path / "state.json").is_file()


def make_loader(job: WorkloadJob, transform: Any) -> Any:
    """The job's loader, of its kind (``stallbench.jobs.kinds``)."""
    import torch
    from torch.utils.data import default_collate

    from stallbench.jobs.batching import token_batching

    dataset = make_dataset(job.data, transform)
    generator = torch.Generator().manual_seed(job.seed)
    common = dict(num_workers=job.workers, persistent_workers=_persistent(job), generator=generator)
    if getattr(dataset.source, "kind", "binary") == "tokens":
        options = token_batching(dataset.source.token_lengths(), job, generator)
        return KINDS[job.loader].build(dataset, options.pop("collate_fn"), job, **options, **common)
    if job.packing is not None:
        raise ValueError(f"packing needs token sequences; {job.data} holds none")
    return KINDS[job.loader].build(
        dataset, default_collate, job, batch_size=job.batch_size, shuffle=True, **common
    )


def _persistent(job: WorkloadJob) -> bool:
    """Workers kept from epoch to epoch, as the job asks: a run that cuts each epoch to its first few steps
    (``--steps``) asks for none, so that the epoch is the first steps of the whole shuffled order and its
    workers shut down at its end, as a ``break`` shuts down a user's script's (what ``analyze --steps N --
    COMMAND`` measures). Kept workers would go on with the batches already asked for into the next epoch; an
    order of exactly N batches would leave the workers idle through the epoch's last steps, which a steady
    epoch never does (on 12 batches of the user-job benchmark it read 4-5 points of the epoch less prep stall
    than the script it stands for)."""
    return job.workers > 0 and job.persistent_workers
