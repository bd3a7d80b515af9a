"""Ctrl-C stops every decode, a one-token step included, through llama.cpp's abort check.

The interrupt is requested at a known point (as llama_decode starts), never after a delay: the
tests read llama_decode's return code (2: aborted) and the cache, not the clock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import llama_cpp
import pytest

from localspec.engine import Cancelled, interrupt

ABORTED = 2  # llama_decode's code for a decode its abort callback stopped


@pytest.fixture
def decode_codes(monkeypatch):
    """Make llama_decode run `before()` first (set `.before`), and record what each call returned."""
    real = llama_cpp.llama_decode

    class Spy(list):
        before = staticmethod(lambda: None)

    codes = Spy()

    def decode(ctx, batch):
        codes.before()
        rc = real(ctx, batch)
        codes.append(rc)
        return rc

    monkeypatch.setattr(llama_cpp, "llama_decode", decode)
    yield codes
    assert not interrupt.requested()  # nothing left pending for the next test


def _ready(target, codes) -> list[int]:
    prompt = target.tokenize("The lighthouse keeper climbed the stairs")
    target.sync(prompt[:-1])
    codes.clear()
    return prompt


def test_an_interrupt_stops_a_one_token_step(target, decode_codes):
    prompt = _ready(target, decode_codes)
    before = list(target.tokens)
    decode_codes.before = interrupt.request  # the Ctrl-C lands as the decode starts
    with pytest.raises(KeyboardInterrupt):
        target.eval(prompt[-1:], logits_from=0)
    assert decode_codes == [ABORTED]  # llama.cpp stopped it, rather than finishing first
    assert target.tokens == before
    decode_codes.before = lambda: None
    assert target.eval(prompt[-1:], logits_from=0).shape == (1, target.n_vocab)  # still usable


def test_off_the_main_thread_the_stop_is_cancelled(target, decode_codes):
    """A worker thread (the chat's, the server's) gets Cancelled; raising the interrupt is the main
    thread's, which takes it at its next engine call."""
    prompt = _ready(target, decode_codes)
    before = list(target.tokens)
    decode_codes.before = interrupt.request
    caught = []

    def work():
        try:
            target.eval(prompt[-4:], logits_from=0)
        except Cancelled as e:
            caught.append(e)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert len(caught) == 1 and decode_codes == [ABORTED] and target.tokens == before
    with pytest.raises(KeyboardInterrupt):
        interrupt.raise_pending()


def test_a_real_ctrl_c_during_a_step_reaches_llama_cpp(target, decode_codes):
    """SIGINT while the main thread is inside the engine: Python's handler cannot run during the C
    call, so the watcher thread, woken by the signal's wakeup byte, sets what llama.cpp reads."""
    prompt = _ready(target, decode_codes)
    before = list(target.tokens)

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 60  # a guard against hanging, not a margin
        while not interrupt.requested():
            assert time.monotonic() < deadline, "the watcher never noted the Ctrl-C"
            time.sleep(0.001)

    decode_codes.before = ctrl_c
    with pytest.raises(KeyboardInterrupt):
        target.eval(prompt[-1:], logits_from=0)
    assert decode_codes == [ABORTED] and target.tokens == before


def test_outside_the_engine_ctrl_c_is_an_ordinary_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10**8):  # the handler runs at the next bytecodes
            pass
    assert not interrupt.requested()


def test_a_second_ctrl_c_during_one_call_exits_at_once():
    """For the calls that never ask llama.cpp to stop (creating a context): the user means it."""
    script = (
        "import os, signal, time\n"
        "from localspec.engine import interrupt\n"
        "with interrupt.deferred():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    while not interrupt.requested(): time.sleep(0.001)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(120)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert "interrupted" in done.stderr and "not reached" not in done.stdout
