"""What stallbench measures with, from inside the loader: one public face, so that nothing outside ``loader``
reaches into its folders.

* ``StatsBoard``: the shared array a loader's processes count into (``loader.stats.board``); a generated job
  gives torch's loader one so that both loaders are counted alike;
* ``TimedCollate``: the collate that times collation and counts into a board (``loader.transport.collate``);
* ``index_bytes``: the bytes a store's index takes for a number of records (a cache too small for it is no
  cache);
* ``Split``, ``split_share``, ``Layout``, ``Inbox``, ``Exchange``: the partitioned cache's split rule, the
  plan of an epoch's exchange, a node's inbox and the exchange itself (``loader.partition``), which the
  nodes what-if predicts with and the exchange probe runs.

Each name is imported from its module when first used (PEP 562): ``split_share`` loads nothing but the
standard library, ``index_bytes`` numpy; the board, the collate and the exchange load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader._lazy import lazy_names

if TYPE_CHECKING:
    from loader.cache._layout import index_bytes
    from loader.partition.exchange import Exchange
    from loader.partition.inbox import Inbox
    from loader.partition.plan import Layout
    from loader.partition.split import Split, split_share
    from loader.stats.board import StatsBoard
    from loader.transport.collate import TimedCollate

_HOMES = {
    "StatsBoard": "loader.stats.board",
    "TimedCollate": "loader.transport.collate",
    "index_bytes": "loader.cache._layout",
    "Split": "loader.partition.split",
    "split_share": "loader.partition.split",
    "Layout": "loader.partition.plan",
    "Inbox": "loader.partition.inbox",
    "Exchange": "loader.partition.exchange",
}

__all__ = ["Exchange", "Inbox", "Layout", "Split", "StatsBoard", "TimedCollate", "index_bytes", "split_share"]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
