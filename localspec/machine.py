"""This machine's usable CPUs and the work on them now: what thread counts, warm-start records and
timing notices are based on.

llama.cpp's threads wait for each other at every matrix product, so a decode runs at the pace of
its slowest thread: when other work takes a core one of them shares, every thread waits (a run
with 2 threads on 2 cores, one taken by other work, was 17× slower than with 1 thread). What
matters is therefore how many cores OTHER work keeps busy now, not the load average, which lags by
a minute and counts our own threads. On Linux that is measured directly: the busy time of the
CPUs this process may use (/proc/stat), less this process's own CPU time, over a window. Elsewhere
the 1-minute load average stands in for it (it lags, and counts a run that just ended).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

BUSY_CORE = 0.5     # other work keeping at least half a core busy takes that core from a thread:
                    # sharing it halves that thread's pace, and every other thread waits for it
MIN_SHARE = 0.7     # without /proc/stat: a run whose threads got less of their cores was loaded
MIN_WINDOW = 0.1    # seconds: /proc/stat counts in 10 ms ticks, so a shorter window is noise
_PROC_STAT = "/proc/stat"


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


def default_threads(cpus: int | None = None) -> int:
    """Threads for decoding on an idle machine: every core on small machines, half the logical
    CPUs (≈ physical cores on SMT machines) on bigger ones, since llama.cpp slows down when it
    oversubscribes."""
    n = usable_cpus() if cpus is None else cpus
    return n if n <= 4 else n // 2


# ---------------------------------------------------------------- other work, measured

@dataclass(frozen=True)
class Sample:
    """What the CPUs had done by one instant."""

    wall: float
    """time.monotonic() seconds."""
    own: float
    """CPU seconds this process has used, all its threads (time.process_time)."""
    busy: float | None
    """CPU seconds the CPUs this process may use have been busy, whoever ran; None without
    /proc/stat."""


@dataclass(frozen=True)
class Usage:
    """What happened on the CPUs between two samples."""

    seconds: float
    """Wall seconds between the samples."""
    own_cores: float
    """Cores this process kept busy on average (its CPU seconds / wall seconds)."""
    other_cores: float | None
    """Cores other work kept busy on average; None where it cannot be measured (see `other_now`)."""

    def share(self, threads: int) -> float:
        """The share of `threads` cores this process got: about 1 when llama.cpp's threads had
        their cores (spin-waiting counts as running), lower when other work took them."""
        return self.own_cores / max(threads, 1)

    def as_dict(self, threads: int) -> dict:
        # tenths of a core: what ticks of 10 ms resolve over a short window
        return {"seconds": round(self.seconds, 3), "threads": threads, "cpu_share": round(self.share(threads), 2),
                "other_cores": None if self.other_cores is None else round(self.other_cores, 1)}


def _busy_seconds() -> float | None:
    """Busy seconds of the CPUs in this process's affinity (user, nice, system, irq, softirq and
    steal, which another VM took), from /proc/stat; None where it is missing."""
    try:
        with open(_PROC_STAT, encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    try:
        mine = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    except AttributeError:
        mine = set()
    total, aggregate, seen = 0, None, False
    for line in lines:
        if not line.startswith("cpu"):
            break
        fields = line.split()
        try:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
        except ValueError:
            return None
        busy = user + nice + system + irq + softirq + steal   # guest time is inside user already
        if fields[0] == "cpu":
            aggregate = busy
        elif fields[0] in mine:
            total, seen = total + busy, True
    ticks = total if seen else aggregate   # no per-CPU lines for our CPUs: the machine's total
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def sample() -> Sample:
    """Now, for `usage` to compare with a later sample. Costs one read of /proc/stat (~20 µs)."""
    return Sample(time.monotonic(), time.process_time(), _busy_seconds())


def usage(before: Sample, after: Sample | None = None) -> Usage:
    """What happened between `before` and `after` (default now)."""
    after = after or sample()
    wall = max(after.wall - before.wall, 1e-9)
    own = max(after.own - before.own, 0.0)
    other = None
    if before.busy is not None and after.busy is not None:
        # Ticks are sampled, process time is exact: a slightly negative difference is rounding.
        other = max((after.busy - before.busy - own) / wall, 0.0)
    return Usage(wall, own / wall, other)


def other_now(since: Sample | None = None) -> float | None:
    """Cores other work keeps busy now. With `since` (taken before loading the models, say) the
    window it opened is used, topped up to MIN_WINDOW; without, a MIN_WINDOW sample is taken.
    Without /proc/stat (macOS, Windows) the 1-minute load average is used: it lags by a minute and
    counts our own recent work, so it is only a hint there."""
    start = since or sample()
    wait = MIN_WINDOW - (time.monotonic() - start.wall)
    if start.busy is None:
        return load_1min()
    if wait > 0:
        time.sleep(wait)
    return usage(start).other_cores


def busy_cores(other: float | None) -> int:
    """Whole cores other work takes from us: each BUSY_CORE past a whole core counts as one more."""
    if other is None or not math.isfinite(other):
        return 0
    return max(math.floor(other + 1 - BUSY_CORE), 0)


def loaded(run: Usage, threads: int, cpus: int | None = None) -> str | None:
    """Why timings taken during `run` with `threads` threads do not describe this machine (other
    work took cores the threads needed), or None when they do. Other work on cores the threads did
    not need is no harm: 1 thread on 2 cores beside a program busy on one is a fair timing of 1
    thread. Without /proc/stat the share of their cores the threads got decides, which only means
    something over a window of decoding (idle time reads as a low share)."""
    cpus = usable_cpus() if cpus is None else cpus
    if run.other_cores is not None:
        if run.other_cores - max(cpus - threads, 0) >= BUSY_CORE:
            return f"other work kept {round(run.other_cores, 1):.1f} of the {cpus} cores busy"
        return None
    if run.share(threads) < MIN_SHARE:
        return f"its {threads} thread{'s' if threads != 1 else ''} got {run.share(threads):.0%} of their cores"
    return None


# ---------------------------------------------------------------- the thread count

@dataclass(frozen=True)
class Threads:
    """The thread count a run uses, and why."""

    threads: int
    """Threads llama.cpp runs with."""
    requested: int | None
    """--threads as given; None = chosen here."""
    cpus: int
    """CPUs this process may use."""
    other_cores: float | None
    """Cores other work kept busy when the choice was made; None = not measured."""
    reserve: int = 0
    """Cores left for the screen or the event loop (chat, serve)."""

    @property
    def free(self) -> int:
        """Cores neither other work nor the reserve takes."""
        return _free(self.cpus, self.other_cores, self.reserve)

    @property
    def warning(self) -> str | None:
        """One line (without the `localspec: ` a notice starts with) when an explicit --threads
        outnumbers the free cores (its threads will wait for each other), else None."""
        if self.requested is None or self.requested <= self.free or not busy_cores(self.other_cores):
            return None
        fit = choose_threads(None, self.reserve, self.other_cores, self.cpus).threads
        return (f"other work keeps about {round(self.other_cores, 1):.1f} of the {self.cpus} cores busy: the "
                f"{self.requested} threads of --threads {self.requested} will wait on each other (the default "
                f"would use {fit} now)")

    def as_dict(self) -> dict:
        return {"threads": self.threads, "requested": self.requested, "cpus": self.cpus,
                "other_cores": None if self.other_cores is None else round(self.other_cores, 1),
                "reserve": self.reserve}


def choose_threads(requested: int | None, reserve: int = 0, other: float | None = None,
                   cpus: int | None = None) -> Threads:
    """The threads to decode with. An explicit `requested` is kept (`Threads.warning` says when it
    outnumbers the free cores). Otherwise the idle default (`default_threads`), but no more than the
    cores that other work (`other`, in cores) and the `reserve` leave free, and never below 1.

    Free cores cap the default rather than being subtracted from it: on 16 CPUs the default is 8,
    and a build busy on 4 still leaves 12 free, so 8 threads stay right; on up to 4 cores, where the
    default is every core, the cap is the same as taking the busy cores away."""
    cpus = usable_cpus() if cpus is None else cpus
    if requested is not None:
        return Threads(requested, requested, cpus, other, reserve)
    return Threads(min(default_threads(cpus), _free(cpus, other, reserve)), None, cpus, other, reserve)


def _free(cpus: int, other: float | None, reserve: int) -> int:
    return max(cpus - busy_cores(other) - reserve, 1)
