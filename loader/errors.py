"""Errors that name the record, file, column or option at fault."""

from __future__ import annotations

import re

__all__ = ["BadRecordError", "SourceError"]

_NAMED = re.compile(r"record (-?\d+) \((.*?)\): (.*)")


class SourceError(ValueError):
    """A data source cannot be opened: missing path, empty folder, missing column, bad layout."""


class BadRecordError(ValueError):
    """One record cannot be read or decoded. The message names the index and where the record lives.

    ``BadRecordError(message)`` alone is how torch's DataLoader rebuilds an error raised in a worker (its
    message then carries the worker's traceback); the fields are read back from that message.
    """

    def __init__(self, where: str, index: int | None = None, reason: str | None = None) -> None:
        if index is None:  # rebuilt from a message: the last record it names is the one at fault
            super().__init__(where)
            found = _NAMED.findall(where)
            index, where, reason = (int(found[-1][0]), *found[-1][1:]) if found else (-1, where, where)
        else:
            super().__init__(f"record {index} ({where}): {reason}")
        self.where = where
        self.index = index
        self.reason = reason

    def __reduce__(self):  # keep the fields when the error crosses from a worker to the main process
        return (type(self), (self.where, self.index, self.reason))
