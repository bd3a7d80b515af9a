"""This machine's usable CPUs and load: what thread counts and timing notices are based on."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def load_1min() -> float | None:
    """1-minute load average: other work on the machine makes every timing noisier."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
