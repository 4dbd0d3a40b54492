"""Coordinated prep: concurrent jobs on one machine prepare each batch once and share it (``coordinate=``)."""

from loader.coordinated.options import Coordination, CoordinationStats, CoordinationWarning, PrepFailed

__all__ = ["Coordination", "CoordinationStats", "CoordinationWarning", "PrepFailed"]
