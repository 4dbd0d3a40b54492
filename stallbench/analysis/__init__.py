"""``analyze`` and ``compare`` on a generated job: what was asked (``request``), the three differential runs
(``phases``), the machine's figures (``measure``), the what-if model (``whatif``), the storage of N nodes
(``nodes``) and what they make (``results``)."""

__all__: list[str] = []
