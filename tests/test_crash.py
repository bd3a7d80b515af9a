"""A native crash prints the Python stack and a line on how to report it (cli/crash.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from localspec.cli.crash import REPORT

# ctypes.string_at(0) reads address 0: a real SIGSEGV, as a fault inside llama.cpp would be.
CRASH_IN_A_COMMAND = """
import ctypes, sys
import localspec.cli.app as app
def segfault(**_):
    ctypes.string_at(0)
app.app = segfault
sys.argv = ["localspec", "generate", "hi"]
app.main()
"""


def test_a_crash_in_a_command_prints_the_stack_and_the_report_line():
    r = subprocess.run([sys.executable, "-c", CRASH_IN_A_COMMAND], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in r.stderr
    assert "in segfault" in r.stderr            # the Python stack, down to the faulting call
    assert r.stderr.rstrip().endswith(REPORT.rstrip())


def test_a_normal_run_prints_nothing_more_and_leaves_no_process_behind():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "localspec", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "Fatal" not in r.stderr and "crashed" not in r.stderr
    # the watcher holds neither stdout nor stderr past the process: run() returned at its end
    assert time.monotonic() - t0 < 30
    r = subprocess.run([sys.executable, "-m", "localspec", "generate", "--max-tokens", "-3", "hi"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error:")


def test_a_command_whose_package_cannot_load_is_one_line_and_the_others_run():
    code = ("import sys; sys.modules['localspec_tui'] = None; sys.argv = ['localspec'] + sys.argv[1:]; "
            "from localspec.cli.app import main; main()")
    r = subprocess.run([sys.executable, "-c", code, "chat"], capture_output=True, text=True, timeout=60)
    if "No such command" in r.stderr:   # an install without the chat's entry point: nothing to load
        return
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: `localspec chat` cannot start")
    r = subprocess.run([sys.executable, "-c", code, "models"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
