"""llama.cpp's extra CPU weight buffers (AMX, repacked layouts): the probe that runs their products in
a child process, and loading without them where the CPU faults (issue: every process died with
SIGILL in ggml-cpu's AMX code on a CPU that lists AMX)."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys

import pytest

from localspec.config import ModelConfig
from localspec.engine import Model, extra_buffers
from localspec.doctor.report import _extra_buffers_line

X86 = platform.machine().lower() in ("x86_64", "amd64")
_PROBE = extra_buffers.probe   # the real one, before a test replaces it

# A child that executes AMX's `tilezero tmm0` (c4 e2 7b 49 c0) without asking for the tile state:
# the instruction that killed every process, faulting here as it did there (SIGILL).
TILEZERO = [sys.executable, "-c", """
import ctypes, mmap
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes([0xc4, 0xe2, 0x7b, 0x49, 0xc0, 0xc3]))
ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
print("{}")
"""]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not decided yet, with a cache of its own for the verdict."""
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(extra_buffers.ENV, raising=False)
    extra_buffers.usable.cache_clear()
    yield tmp_path / "cache"
    extra_buffers.usable.cache_clear()


@pytest.fixture
def amx_cpu(monkeypatch, fresh):
    """This CPU lists AMX and the build offers its buffer type; the probe's child faults on it."""
    if not X86:
        pytest.skip("tilezero is an x86 instruction")
    monkeypatch.setattr(extra_buffers, "cpu_lists_amx", lambda: True)
    offered = extra_buffers.offered()
    monkeypatch.setattr(extra_buffers, "offered", lambda: ["AMX", *offered])
    calls = []
    real = extra_buffers.probe

    def counted(command=None, threads=None):
        calls.append(command)
        return real(TILEZERO, threads)

    monkeypatch.setattr(extra_buffers, "probe", counted)
    return calls


def test_the_real_probe_runs_each_extra_buffer_types_products_and_matches_plain():
    """The child's products through every extra buffer type this build offers here (on an x86 CPU
    with AVX2: CPU_REPACK's Q4_0 and Q4_K layouts) agree with the plain buffer's. Where this CPU
    lists AMX and the build uses it, the verdict is the machine's own: AMX may fault here, which
    is what the check is for."""
    verdict = extra_buffers.probe()
    offered = extra_buffers.offered()
    if "AMX" in offered:
        assert verdict["verdict"] in ("ok", "fault", "wrong"), verdict
        if verdict["verdict"] != "ok":
            return
    assert verdict["verdict"] == "ok", verdict
    assert {k.split("/")[0] for k in verdict["errors"]} <= set(offered)
    if "CPU_REPACK" in offered and X86:
        assert {"CPU_REPACK/q4_0/1", "CPU_REPACK/q4_0/32"} <= set(verdict["errors"])
    if "AMX" in offered:
        assert {f"AMX/{t}/{m}" for t in extra_buffers.TYPES for m in extra_buffers.MS} <= set(verdict["errors"])
    assert all(e <= extra_buffers.TOLERANCE for e in verdict["errors"].values())


@pytest.mark.skipif(not X86, reason="tilezero is an x86 instruction")
def test_a_child_that_dies_on_tilezero_is_a_fault():
    verdict = extra_buffers.probe(TILEZERO)
    assert verdict["verdict"] == "fault"
    assert "SIGILL" in verdict["detail"]


def test_a_child_that_dies_of_another_signal_is_an_error_not_kept(amx_cpu, fresh, monkeypatch):
    died = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    monkeypatch.setattr(extra_buffers, "probe", functools.partial(_PROBE, died))
    state = extra_buffers.state()
    assert (state["verdict"], state["use"]) == ("error", False) and "SIGSEGV" in state["detail"]
    assert not extra_buffers.record_path().exists()   # tried again by the next process


def test_a_build_offering_amx_that_no_product_reached_is_not_ok(monkeypatch):
    """A check whose shapes no AMX product took (a newer ggml asking more of them) says nothing
    about AMX: not "ok"."""
    monkeypatch.setattr(extra_buffers, "offered", lambda: ["AMX", "CPU_REPACK"])
    verdict = extra_buffers.probe([sys.executable, "-c", "print('{\"CPU_REPACK/q4_0/1\": 0.0}')"])
    assert verdict["verdict"] == "error" and "no AMX product" in verdict["detail"]


def test_products_that_differ_are_refused_and_broken_output_is_an_error():
    wrong = extra_buffers.probe([sys.executable, "-c", "print('{\"AMX/q4_0/32\": 0.5, \"AMX/q4_0/1\": 0.0}')"])
    assert wrong["verdict"] == "wrong" and "AMX/q4_0/32" in wrong["detail"]
    nan = extra_buffers.probe([sys.executable, "-c", "print('{\"AMX/q4_K/1\": NaN}')"])
    assert nan["verdict"] == "wrong"
    broken = extra_buffers.probe([sys.executable, "-c", "import sys; sys.exit('no ggml here')"])
    assert broken["verdict"] == "error" and "no ggml here" in broken["detail"]


def test_no_amx_here_means_no_probe_and_extra_buffers_on(fresh, monkeypatch):
    monkeypatch.setattr(extra_buffers, "cpu_lists_amx", lambda: False)
    monkeypatch.setattr(extra_buffers, "probe", lambda *a, **k: pytest.fail("probed without AMX"))
    assert extra_buffers.usable() is True
    assert not fresh.exists()


def test_a_cpu_that_faults_on_amx_loads_without_extra_buffers_once_noticed(amx_cpu, fresh, model_paths, capfd):
    """The faulting path end to end: the probe's child dies, the verdict is kept, the model loads
    with use_extra_bufts off and decodes, one notice is printed, and doctor says which."""
    _, draft_path = model_paths
    with Model(ModelConfig(str(draft_path), n_ctx=256)) as m:
        assert m.extra_buffers is False
        logits = m.eval([1, 504, 3287], logits_from=-1)
        assert logits.shape == (1, m.n_vocab)
    with Model(ModelConfig(str(draft_path), n_ctx=256)) as m:
        assert m.extra_buffers is False
    err = capfd.readouterr().err
    assert err.count("AMX code faults on this CPU") == 1, err
    assert "SIGILL" in err and extra_buffers.ENV in err
    assert len(amx_cpu) == 1   # probed once
    record = json.loads(extra_buffers.record_path().read_text())
    assert record["verdict"] == "fault" and str(fresh) in str(extra_buffers.record_path())

    # A new process reads the kept verdict instead of probing again.
    extra_buffers.usable.cache_clear()
    state = extra_buffers.state()
    assert (state["use"], state["source"], state["verdict"]) == (False, "record", "fault")
    assert extra_buffers.usable() is False and len(amx_cpu) == 1
    line = _extra_buffers_line(state)
    assert line.startswith("extra CPU buffers: OFF") and "SIGILL" in line and "AMX listed by the CPU: yes" in line


def test_the_variable_forces_either_way_without_a_probe(amx_cpu, fresh, monkeypatch, capfd):
    monkeypatch.setenv(extra_buffers.ENV, "1")
    assert extra_buffers.usable() is True
    extra_buffers.usable.cache_clear()
    monkeypatch.setenv(extra_buffers.ENV, "0")
    assert extra_buffers.usable() is False
    assert amx_cpu == [] and capfd.readouterr().err == ""


def test_a_timed_out_probe_is_not_kept(amx_cpu, fresh, monkeypatch):
    monkeypatch.setattr(extra_buffers, "PROBE_SECONDS", 0.5)
    monkeypatch.setattr(extra_buffers, "probe", functools.partial(_PROBE, [sys.executable, "-c", "import time; time.sleep(30)"]))
    state = extra_buffers.state()
    assert state["verdict"] == "timeout" and state["use"] is False
    assert not extra_buffers.record_path().exists()


def test_the_reference_llama_loads_without_extra_buffers_where_they_fault(model_paths, monkeypatch):
    """bench --compare's `Llama` takes no use_extra_bufts: its defaults are made without them."""
    from localspec.engine.reference import ReferenceModel

    monkeypatch.setattr(extra_buffers, "usable", lambda: False)
    ref = ReferenceModel(model_paths[1], n_ctx=256, threads=1)
    assert ref.llm.model_params.use_extra_bufts is False
    import llama_cpp.llama as high
    assert high.llama_cpp.llama_model_default_params().use_extra_bufts is True   # put back


@pytest.mark.slow
def test_generate_without_extra_buffers_gives_the_same_text(model_paths, tmp_path):
    """The CLI with extra buffer types off (as on a faulting CPU) runs and, on the default pair
    (Q4_1 and F32: on a CPU without AMX neither has an extra layout), writes the same greedy text
    as with the default choice (which, on a CPU whose AMX faults, is off too)."""
    def run(value):
        env = {k: v for k, v in os.environ.items() if k != extra_buffers.ENV}
        if value is not None:
            env[extra_buffers.ENV] = value
        done = subprocess.run([sys.executable, "-m", "localspec", "generate", "The capital of France is",
                               "--max-tokens", "24", "--temperature", "0", "--raw"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout
    assert run("0") == run(None)
