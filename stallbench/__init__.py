"""stallbench: measure where a training job waits for its data, and compare loaders side by side."""

from stallbench.profile import Profile, profile
from stallbench.target import TargetResult, time_to_target

__all__ = ["Profile", "TargetResult", "profile", "time_to_target"]
