"""The conditions a run is measured under, as the kernel enforces them: a cold or warm page cache, a storage
read throttle and a memory limit (``cgroup``), and the sizes they are given in (``storage``, ``memory``)."""

__all__: list[str] = []
