"""Coordinated prep: concurrent jobs on one machine prepare each batch once and share it (``coordinate=``)."""

from loader.coordinated.member import PrepFailed
from loader.coordinated.options import Coordination, CoordinationStats, CoordinationWarning

__all__ = ["Coordination", "CoordinationStats", "CoordinationWarning", "PrepFailed"]
