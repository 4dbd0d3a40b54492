"""Errors that name the record, file, column or option at fault."""

from __future__ import annotations

__all__ = ["BadRecordError", "SourceError"]


class SourceError(ValueError):
    """A data source cannot be opened: missing path, empty folder, missing column, bad layout."""


class BadRecordError(ValueError):
    """One record cannot be read or decoded. The message names the index and where the record lives."""

    def __init__(self, where: str, index: int, reason: str) -> None:
        super().__init__(f"record {index} ({where}): {reason}")
        self.where = where
        self.index = index
        self.reason = reason

    def __reduce__(self):  # keep the fields when the error crosses from a worker to the main process
        return (type(self), (self.where, self.index, self.reason))
