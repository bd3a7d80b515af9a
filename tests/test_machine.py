"""localspec.machine: how many cores other work keeps busy, and whether a run's timings were taken
on a loaded machine. The measurement runs on a fake /proc/stat and a fake clock, so nothing here
depends on what else the machine is doing, except the one test with a real CPU hog."""

from __future__ import annotations

import subprocess
import sys
import time
import types

import pytest

from localspec import machine

TICK = 100   # SC_CLK_TCK on Linux


class FakeCpus:
    """/proc/stat, the monotonic clock and this process's CPU time, advanced by hand."""

    def __init__(self, tmp_path, monkeypatch, cpus=2):
        self.path = tmp_path / "stat"
        self.busy = [0] * cpus          # ticks per CPU
        self.now = self.own = 0.0
        monkeypatch.setattr(machine, "_PROC_STAT", str(self.path))
        monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
        monkeypatch.setattr(machine.os, "sysconf", lambda name: TICK)
        monkeypatch.setattr(machine, "time", types.SimpleNamespace(
            monotonic=lambda: self.now, process_time=lambda: self.own, sleep=self.sleep))
        self.write()

    def write(self):
        busy = [round(b) for b in self.busy]
        rows = [f"cpu{i} {b} 0 0 1000 0 0 0 0 0 0" for i, b in enumerate(busy)]
        self.path.write_text(f"cpu  {sum(busy)} 0 0 2000 0 0 0 0 0 0\n" + "\n".join(rows) + "\nintr 1 2 3\n")

    def run(self, seconds, own_cores, other_cores):
        """`seconds` pass with this process on `own_cores` and other work on `other_cores`."""
        self.now += seconds
        self.own += own_cores * seconds
        self.busy[0] += (own_cores + other_cores) * seconds * TICK   # one CPU: no rounding per CPU
        self.write()

    def sleep(self, seconds):
        self.slept = seconds
        self.run(seconds, 0.0, self.other_while_asleep)

    other_while_asleep = 0.0
    slept = 0.0


@pytest.fixture
def cpus(tmp_path, monkeypatch):
    return FakeCpus(tmp_path, monkeypatch)


def test_other_work_is_the_busy_time_less_our_own(cpus):
    before = machine.sample()
    cpus.run(2.0, own_cores=1.5, other_cores=0.4)    # our threads busy on 1.5 cores, others on 0.4
    run = machine.usage(before)
    assert run.seconds == pytest.approx(2.0)
    assert run.own_cores == pytest.approx(1.5)
    assert run.other_cores == pytest.approx(0.4, abs=0.01)
    assert run.share(2) == pytest.approx(0.75)


def test_only_the_cpus_this_process_may_use_count(cpus, monkeypatch):
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {1}, raising=False)
    cpus.busy = [0, 0]
    cpus.write()
    before = machine.sample()
    cpus.now += 1.0
    cpus.busy = [100, 30]       # cpu0 busy the whole second, but this process may only use cpu1
    cpus.write()
    assert machine.usage(before).other_cores == pytest.approx(0.3)


def test_a_window_shorter_than_a_tenth_of_a_second_is_topped_up(cpus):
    since = machine.sample()
    cpus.run(0.03, own_cores=1.0, other_cores=1.0)   # the models loaded in 30 ms
    cpus.other_while_asleep = 1.0
    assert machine.other_now(since) == pytest.approx(1.0, abs=0.06)
    assert cpus.slept == pytest.approx(machine.MIN_WINDOW - 0.03)
    cpus.slept = 0.0
    since = machine.sample()
    cpus.run(2.0, own_cores=1.0, other_cores=1.0)    # a long load: no waiting at all
    assert machine.other_now(since) == pytest.approx(1.0, abs=0.01) and cpus.slept == 0.0


def test_without_proc_stat_the_load_average_stands_in(cpus, monkeypatch):
    monkeypatch.setattr(machine, "_PROC_STAT", str(cpus.path) + ".missing")
    monkeypatch.setattr(machine, "load_1min", lambda: 1.7)
    assert machine.sample().busy is None
    assert machine.other_now() == 1.7
    before = machine.sample()
    cpus.run(1.0, own_cores=1.2, other_cores=1.0)
    assert machine.usage(before).other_cores is None


@pytest.mark.parametrize("other, threads, loaded", [
    (0.1, 2, False),   # a quiet machine
    (1.0, 2, True),    # one of the two cores taken: both threads wait for the one that shares it
    (1.0, 1, False),   # one thread beside a program busy on the other core: a fair timing of 1 thread
    (1.6, 1, True),    # ...but not when other work spills onto the thread's core too
    (0.4, 2, False),   # under half a core: the threads still had their cores most of the time
])
def test_a_run_is_loaded_when_other_work_took_the_cores_its_threads_needed(other, threads, loaded):
    run = machine.Usage(10.0, threads * 0.9, other)
    assert bool(machine.loaded(run, threads, cpus=2)) is loaded
    if loaded:
        assert f"{other:.1f} of the 2 cores" in machine.loaded(run, threads, cpus=2)


def test_without_other_work_measured_a_low_cpu_share_means_loaded():
    assert machine.loaded(machine.Usage(10.0, 1.9, None), 2, cpus=2) is None
    reason = machine.loaded(machine.Usage(10.0, 1.2, None), 2, cpus=2)
    assert reason and "60%" in reason


def test_the_default_is_every_core_up_to_4_else_half():
    assert [machine.default_threads(n) for n in (1, 2, 4, 6, 8, 16)] == [1, 2, 4, 3, 4, 8]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_a_real_cpu_hog_is_seen_as_other_work():
    """At least the hog's core is busy with other work (the rest of the machine can only add)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)   # the interpreter's start-up is not yet a busy loop
        since = machine.sample()
        assert machine.other_now(since) >= machine.BUSY_CORE
    finally:
        hog.kill()
        hog.wait()
