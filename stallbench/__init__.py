"""stallbench: measure where a training job waits for its data, and compare loaders side by side."""

__all__: list[str] = []
