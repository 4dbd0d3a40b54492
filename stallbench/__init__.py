"""stallbench: measure where a training job waits for its data, and compare loaders side by side."""

from stallbench.profile import Profile, profile

__all__ = ["Profile", "profile"]
