"""A MinIO cache partitioned across nodes over ``torch.distributed`` (``DataLoader(partition_cache=...)``)."""

from loader.partition.options import Partition

__all__ = ["Partition"]
