"""Bad input and faults, as a new user meets them, through the real entry point.

Each case states how it must end: most with exit code 2 and one `error:` line naming the problem
(no traceback, no Click box), some with success (`--seed -1`, `--threads` above the cores, two
first runs at once), Ctrl-C with 130 within a second. Faults that need an unprivileged user run
the CLI in a subprocess without root's file capabilities; a full disk is simulated at the call that
would fail, and made real on a small tmpfs where mounting one is allowed. The second pass (issue 19)
is in test_hostile_cli.py. A whitespace-only prompt is a prompt, on argv and on stdin alike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tiny_gguf import TOKENS, write_tiny_gguf

CLI = [sys.executable, "-m", "localspec"]
REPO = Path(__file__).resolve().parent.parent


def run(*args: str, stdin: bytes | None = None, env: dict | None = None, timeout: float = 120,
        **kw) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(CLI + list(args), input=stdin if stdin is not None else b"", capture_output=True,
                          env=full_env, timeout=timeout, cwd=REPO, **kw)


def run_in_terminal(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run with a pseudo-terminal as stdin and stdout (stderr captured), as `chat` wants."""
    import pty

    main, child = pty.openpty()
    try:
        r = subprocess.run(CLI + list(args), stdin=child, stdout=child, stderr=subprocess.PIPE, cwd=REPO,
                           env={**os.environ, **(env or {})}, timeout=timeout)
    finally:
        os.close(child)
        os.close(main)
    return subprocess.CompletedProcess(r.args, r.returncode, b"", r.stderr)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, (r.returncode, out, err)
    assert "Traceback" not in out + err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("localspec: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def bad(tmp_path_factory, model_paths) -> Path:
    """A folder of broken model files and presets."""
    d = tmp_path_factory.mktemp("hostile")
    good = model_paths[1].read_bytes()  # the Q4_1 draft, 93 MB
    (d / "notes.gguf").write_text("just some text\n")
    (d / "empty.gguf").write_bytes(b"")
    (d / "cut.gguf").write_bytes(good[: len(good) // 3])
    version = bytearray(good)
    version[4:8] = (99).to_bytes(4, "little")
    (d / "version.gguf").write_bytes(version)
    kv = bytearray(good)
    kv[200:260] = b"\xff" * 60  # the type of a metadata value becomes nonsense
    (d / "kv.gguf").write_bytes(kv)
    nan = bytearray(good)
    nan[-20_000_000:-10_000_000] = b"\xff" * 10_000_000  # Q4_1 block scales become NaN
    (d / "nan.gguf").write_bytes(nan)
    (d / "folder.gguf").mkdir()
    (d / "broken.yaml").write_text("description: [unclosed\n")
    (d / "url.yaml").write_text(
        "description: x\ntarget: {repo: 'https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF', file: a.gguf}\n"
        "drafter: lookup\nsampling: {temperature: 0, top_k: 0, top_p: 1.0, min_p: 0}\nk: auto\nn_ctx: 512\n"
        "verified: false\n")
    (d / "suite.jsonl").write_text('{"category": "x"}\n')
    return d


GEN = ["generate", "hello", "--max-tokens", "4"]

# (case id, arguments, stdin, environment, text the error line must contain)
EXIT_2 = [
    ("unknown-option", [*GEN, "--bogus"], None, None, "--bogus"),
    ("missing-prompt", ["generate"], None, None, "PROMPT"),
    ("extra-argument", [*GEN, "more"], None, None, "more"),
    ("not-a-number", ["generate", "hi", "--max-tokens", "ten"], None, None, "--max-tokens"),
    ("unknown-command", ["generat", "hi"], None, None, "generat"),
    ("unknown-root-option", ["--bogus"], None, None, "--bogus"),
    ("max-tokens-0", ["generate", "hi", "--max-tokens", "0"], None, None, "max-tokens"),
    ("k-negative", [*GEN, "-k", "-3"], None, None, "-k"),
    ("k-word", [*GEN, "-k", "many"], None, None, "-k"),
    ("k-above-bound", [*GEN, "-k", "65"], None, None, "64"),
    ("k-huge", [*GEN, "-k", "1000000000000000000000"], None, None, "64"),
    ("temperature-negative", [*GEN, "--temperature", "-0.5"], None, None, "temperature"),
    ("temperature-nan", [*GEN, "--temperature", "nan"], None, None, "temperature"),
    ("temperature-inf", [*GEN, "--temperature", "inf"], None, None, "temperature"),
    ("top-p-above-1", [*GEN, "--top-p", "1.5"], None, None, "top-p"),
    ("top-p-0", [*GEN, "--top-p", "0"], None, None, "top-p"),
    ("min-p-1", [*GEN, "--min-p", "1"], None, None, "min-p"),
    ("top-k-negative", [*GEN, "--top-k", "-1"], None, None, "top-k"),
    ("seed-below-minus-1", [*GEN, "--seed", "-2"], None, None, "seed"),
    ("n-ctx-tiny", [*GEN, "--n-ctx", "4"], None, None, "n-ctx"),
    ("n-ctx-2^32", [*GEN, "--n-ctx", str(2**32)], None, None, "n-ctx"),
    ("n-ctx-2^32+256", [*GEN, "--n-ctx", str(2**32 + 256)], None, None, "n-ctx"),
    ("gpu-layers-below-minus-1", [*GEN, "--target-gpu-layers", "-5"], None, None, "gpu-layers"),
    ("drafter-unknown", [*GEN, "--drafter", "magic"], None, None, "drafter"),
    ("drafter-model-without-draft", [*GEN, "--target", "{d}/cut.gguf", "--drafter", "model"], None, None, "--draft"),
    ("target-missing", [*GEN, "--target", "{d}/missing.gguf"], None, None, "not found"),
    ("target-folder", [*GEN, "--target", "{d}/folder.gguf"], None, None, "is a folder"),
    ("target-text", [*GEN, "--target", "{d}/notes.gguf"], None, None, "not a GGUF"),
    ("target-empty", [*GEN, "--target", "{d}/empty.gguf"], None, None, "empty"),
    ("target-truncated", [*GEN, "--target", "{d}/cut.gguf", "--drafter", "lookup"], None, None, "truncated"),
    ("target-bad-version", [*GEN, "--target", "{d}/version.gguf", "--drafter", "lookup"], None, None, "version 99"),
    ("target-bad-metadata", [*GEN, "--target", "{d}/kv.gguf", "--drafter", "lookup"], None, None, "corrupt GGUF header"),
    ("draft-text", [*GEN, "--draft", "{d}/notes.gguf"], None, None, "not a GGUF"),
    ("draft-folder", [*GEN, "--draft", "{d}"], None, None, "is a folder"),
    ("nan-logits-greedy", [*GEN, "--target", "{d}/nan.gguf", "--drafter", "lookup", "--raw", "--temperature", "0"],
     None, None, "the target nan.gguf: the model returned NaN"),
    ("nan-logits-sampled", [*GEN, "--target", "{d}/nan.gguf", "--draft", "{d}/nan.gguf", "--raw", "--temperature", "1"],
     None, None, "NaN"),
    ("preset-unknown", [*GEN, "--preset", "no-such-preset"], None, None, "unknown preset"),
    ("preset-bad-yaml", [*GEN, "--preset", "{d}/broken.yaml"], None, None, "invalid YAML"),
    ("preset-url-repo", [*GEN, "--preset", "{d}/url.yaml"], None, None, "is a URL"),
    ("prompt-not-utf8", ["generate", b"caf\xe9 \xff", "--max-tokens", "2"], None, None, "not UTF-8"),
    ("stdin-not-utf8", ["generate", "-", "--max-tokens", "2"], b"caf\xe9 \xff", None, "not UTF-8"),
    ("stop-not-utf8", [*GEN, "--stop", b"\xff"], None, None, "not UTF-8"),
    ("system-not-utf8", [*GEN, "--system", b"\xfe"], None, None, "not UTF-8"),
    ("stdin-empty", ["generate", "-"], b"", None, "empty prompt"),
    ("prompt-empty", ["generate", ""], None, None, "empty prompt"),
    ("prompt-too-long", ["generate", "word " * 400, "--n-ctx", "256", "--raw", "--drafter", "lookup"], None, None,
     "too long"),
    ("cache-is-a-file", GEN, None, {"LOCALSPEC_CACHE": "/etc/passwd"}, "LOCALSPEC_CACHE"),
    ("cache-under-a-file", GEN, None, {"LOCALSPEC_CACHE": "/etc/passwd/cache"}, "LOCALSPEC_CACHE"),
    ("bench-cache-is-a-file", ["bench", "--max-tokens", "2"], None, {"LOCALSPEC_CACHE": "/etc/passwd"}, "LOCALSPEC_CACHE"),
    ("bench-prompts-missing", ["bench", "--prompts", "{d}/none.jsonl"], None, None, "none.jsonl"),
    ("bench-prompts-bad", ["bench", "--prompts", "{d}/suite.jsonl"], None, None, "suite.jsonl"),
    ("bench-repeat-0", ["bench", "--repeat", "0"], None, None, "repeat"),
    ("bench-k-0", ["bench", "-k", "0"], None, None, "-k"),
    ("bench-k-above-bound", ["bench", "-k", "1,65"], None, None, "64"),
    ("bench-compare-unknown", ["bench", "--compare", "vllm"], None, None, "--compare"),
    ("bench-category-unknown", ["bench", "--category", "poetry"], None, None, "poetry"),
    ("bench-drafter-none", ["bench", "--drafter", "none"], None, None, "nothing to compare"),
    ("bench-target-truncated", ["bench", "--target", "{d}/cut.gguf", "--drafter", "lookup"], None, None, "truncated"),
    ("doctor-seconds-negative", ["doctor", "--seconds", "-1"], None, None, "--seconds"),
    ("doctor-target-missing", ["doctor", "--target", "{d}/missing.gguf", "--seconds", "0"], None, None, "not found"),
    ("doctor-drafter-unknown", ["doctor", "--drafter", "magic", "--seconds", "0"], None, None, "drafter"),
    ("doctor-target-folder", ["doctor", "--target", "{d}", "--seconds", "0"], None, None, "is a folder"),
    ("pull-url", ["pull", "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF", "a.gguf"], None, None,
     "'Qwen/Qwen2.5-0.5B-Instruct-GGUF'"),
    ("pull-three-parts", ["pull", "a/b/c", "f.gguf"], None, None, "'a/b/c'"),
    ("pull-spaces", ["pull", "my org/model", "f.gguf"], None, None, "repo id"),
    ("pull-url-without-file", ["pull", "https://huggingface.co/Qwen/X"], None, None, "is a URL"),
    ("pull-repo-without-file", ["pull", "Qwen/X"], None, None, "name the GGUF"),
    ("pull-unknown-preset", ["pull", "no-such-preset"], None, None, "unknown preset"),
    ("chat-target-missing", ["chat", "--target", "{d}/missing.gguf"], None, None, "not found"),
    ("chat-target-truncated-header", ["chat", "--target", "{d}/notes.gguf"], None, None, "not a GGUF"),
    ("chat-without-terminal", ["chat"], None, None, "terminal"),
    ("no-special-without-raw", [*GEN, "--no-special"], None, None, "--raw"),
    ("chat-max-tokens-0", ["chat", "--max-tokens", "0"], None, None, "max-tokens"),
    ("chat-system-not-utf8", ["chat", "--system", b"\xff"], None, None, "not UTF-8"),
    ("chat-cache-is-a-file", ["chat"], None, {"LOCALSPEC_CACHE": "/etc/passwd"}, "LOCALSPEC_CACHE"),
    ("models-extra-argument", ["models", "extra"], None, None, "extra"),
    ("models-unknown-option", ["models", "--yaml"], None, None, "--yaml"),
]


@pytest.mark.parametrize("args, stdin, env, needle", [c[1:] for c in EXIT_2], ids=[c[0] for c in EXIT_2])
def test_bad_input_ends_with_one_error_line(bad, args, stdin, env, needle):
    argv = [a.replace("{d}", str(bad)) if isinstance(a, str) else os.fsdecode(a) for a in args]
    if argv[0] == "chat" and needle != "terminal":
        line = one_error_line(run_in_terminal(*argv, env=env))  # with a terminal: the screen must not open
    else:
        line = one_error_line(run(*argv, stdin=stdin, env=env, timeout=60))
    assert needle in line, line


def test_nan_logits_from_the_draft_name_the_draft(bad, model_paths):
    line = one_error_line(run("generate", "hello", "--target", str(model_paths[0]), "--draft", str(bad / "nan.gguf"),
                              "--raw", "--temperature", "1", "-k", "2", "--max-tokens", "4"))
    assert "the draft nan.gguf: the model returned NaN" in line, line


# -- cases that succeed --------------------------------------------------------------------------

def test_seed_minus_one_means_random():
    seeds = set()
    for _ in range(2):
        r = run("generate", "Hi", "--max-tokens", "3", "--seed", "-1", "--temperature", "1", "--json")
        assert r.returncode == 0, r.stderr
        seeds.add(json.loads(r.stdout)["seed"])
    assert len(seeds) == 2 and all(s >= 0 for s in seeds)


def test_threads_above_the_cores_are_clamped_with_a_notice():
    from localspec.machine import usable_cpus

    r = run("generate", "Hi", "--max-tokens", "3", "--threads", "512", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert f"using {usable_cpus()}" in r.stderr.decode()


def test_version():
    from importlib.metadata import version

    r = run("--version")
    assert r.returncode == 0 and r.stdout.decode().startswith(f"localspec {version('localspec')}")


def test_no_arguments_show_help():
    r = run()
    assert r.returncode == 0 and "generate" in r.stdout.decode() and not r.stderr


def test_raw_prompt_reads_special_tokens_unless_told_not_to():
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    counts = {}
    for flag in ("--special", "--no-special"):
        r = run("generate", prompt, "--raw", flag, "--max-tokens", "2", "--temperature", "0", "--json")
        assert r.returncode == 0, r.stderr
        counts[flag] = json.loads(r.stdout)["n_prompt_tokens"]
    assert counts["--special"] < counts["--no-special"]  # <|im_start|> is one token, not ~6 pieces


def test_a_corrupt_cached_copy_says_deleting_it_rebuilds_it(tmp_path, model_paths):
    cache = tmp_path / "cache"
    cache.mkdir()
    data = model_paths[0].read_bytes()
    (cache / model_paths[0].name).write_bytes(data[: len(data) // 2])
    line = one_error_line(run("generate", "hi", "--max-tokens", "2", env={"LOCALSPEC_CACHE": str(cache)}))
    assert "truncated" in line and "delete it" in line


# -- the padded vocabulary: one rule for doctor and generate ------------------------------------

def test_doctor_and_generate_agree_on_a_padded_pair(tmp_path):
    plain = write_tiny_gguf(tmp_path / "a.gguf")
    padded = write_tiny_gguf(tmp_path / "p.gguf", [*TOKENS, *(f"▁pad{i}" for i in range(100))])
    far = write_tiny_gguf(tmp_path / "f.gguf", [*TOKENS, *(f"▁pad{i}" for i in range(200))])
    common = ["--n-ctx", "64", "--threads", "1"]
    for draft, ok in ((padded, True), (far, False)):
        gen = run("generate", "hi", "--raw", "--target", str(plain), "--draft", str(draft), "--max-tokens", "3",
                  "-k", "2", "--temperature", "1", "--seed", "1", *common)
        doc = run("doctor", "--target", str(plain), "--draft", str(draft), "--seconds", "0", "--json", *common)
        assert doc.returncode == 0, doc.stderr
        assert json.loads(doc.stdout)["vocab"]["compatible"] is ok
        if ok:
            assert gen.returncode == 0, gen.stderr
        else:
            assert "sizes differ" in one_error_line(gen)


def test_a_padded_target_whose_extra_ids_the_draft_lacks(tmp_path):
    """Qwen2.5 7B (152064 ids) with 0.5B (151936): the target may emit an id the draft's
    vocabulary lacks, which llama.cpp would refuse to decode in the draft; the drafter reads on after
    it. The tiny random target emits its 100 extra ids often, so the case is exercised."""
    plain = write_tiny_gguf(tmp_path / "a.gguf")
    padded = write_tiny_gguf(tmp_path / "p.gguf", [*TOKENS, *(f"▁pad{i}" for i in range(100))], seed=2)
    emitted_extra = False
    for seed in range(4):
        r = run("generate", "hi the", "--raw", "--target", str(padded), "--draft", str(plain), "--max-tokens", "40",
                "-k", "3", "--temperature", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", str(seed),
                "--n-ctx", "128", "--threads", "1", "--json")
        assert r.returncode == 0, r.stderr.decode()
        data = json.loads(r.stdout)
        emitted_extra |= any(t >= len(TOKENS) for t in data["tokens"])
        assert data["n_drafted"] > 0
    assert emitted_extra, "the target never emitted an id the draft lacks: the test proved nothing"


# -- faults: unprivileged user, full disk ------------------------------------------------------

def _unprivileged() -> dict:
    """subprocess arguments that run the CLI without root's power over file permissions.

    As root, permissions never deny anything. The child keeps uid 0 (so it can still reach the
    interpreter under /root) but loses the capabilities that override them, and owning a file with
    mode 000 or a folder with 555 then stops it like any user."""
    if os.geteuid() != 0:
        return {}
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def drop() -> None:
        for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone after exec
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    probe = subprocess.run(["true"], preexec_fn=drop, capture_output=True) if Path("/bin/true").exists() else None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot drop root's file capabilities here")
    return {"preexec_fn": drop}


def test_unreadable_model_file(tmp_path, model_paths):
    model = tmp_path / "secret.gguf"
    model.write_bytes(model_paths[1].read_bytes()[:1 << 20])
    model.chmod(0o000)
    line = one_error_line(run("generate", "hi", "--target", str(model), "--drafter", "lookup", **_unprivileged()))
    assert "cannot read" in line and "secret.gguf" in line


def test_read_only_cache_names_the_cache(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    line = one_error_line(run("generate", "hi", "--max-tokens", "2", env={"LOCALSPEC_CACHE": str(cache)},
                              **_unprivileged()))
    assert "cannot write" in line and str(cache) in line and "LOCALSPEC_CACHE" in line


def test_a_home_where_no_cache_can_be_made(tmp_path):
    (tmp_path / "locked").mkdir(mode=0o555)
    env = {k: v for k, v in os.environ.items() if k not in ("LOCALSPEC_CACHE", "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path / "locked" / "home")
    r = subprocess.run(CLI + ["generate", "hi", "--max-tokens", "2"], capture_output=True, cwd=REPO, timeout=60,
                       env=env, **_unprivileged())
    assert "LOCALSPEC_CACHE" in one_error_line(r)


def test_full_disk_is_refused_before_writing(tmp_path, monkeypatch, capsys, model_paths):
    """Simulated at the call that would fail: the free-space check before the F32 copy is made."""
    import shutil
    from collections import namedtuple

    from localspec.cli import app as cli

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 5_000_000, 5_000_000))
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["localspec", "generate", "hi", "--max-tokens", "2"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: not enough space in " + str(tmp_path / "cache")), err
    assert "LOCALSPEC_CACHE" in err[-1]
    assert not list((tmp_path / "cache").glob("*.gguf*"))


def test_a_disk_that_fills_while_writing_leaves_nothing(tmp_path, model_paths, monkeypatch):
    """A real full disk (a 64 MB tmpfs) under the quantizer, past the free-space check: the partial
    file is never promoted."""
    from localspec.engine import EngineError
    from localspec.engine import quantize

    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        monkeypatch.setattr(quantize, "_check_space", lambda *a: None)
        with pytest.raises(EngineError, match="making x.gguf in .* failed"):
            quantize.quantize(model_paths[1], mount / "x.gguf", "F32")
        assert list(mount.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# -- Ctrl-C and two first runs at once ---------------------------------------------------------

def _interrupt_when(proc: subprocess.Popen, ready, limit: float = 60.0) -> float:
    """Send SIGINT once `ready()` is true; return the seconds the process then took to exit."""
    deadline = time.monotonic() + limit
    while not ready():
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "never got to the point of interrupting"
        time.sleep(0.005)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    return time.monotonic() - sent


def test_ctrl_c_while_the_model_loads(model_paths):
    """The log line is printed inside llama_model_load_from_file: the signal lands mid-load."""
    proc = subprocess.Popen(CLI + ["generate", "hi", "--max-tokens", "50"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "LOCALSPEC_VERBOSE": "1"})
    seen = []

    def loading() -> bool:
        line = proc.stderr.readline().decode("utf-8", "replace")
        seen.append(line)
        return "llama_model_loader: loaded meta data" in line

    took = _interrupt_when(proc, loading)
    rest = proc.stderr.read().decode("utf-8", "replace")
    assert proc.returncode == 130, rest[-2000:]
    assert took < 1.0 and "interrupted" in rest and "Traceback" not in rest
    assert "cancelled model load" in rest  # llama.cpp stopped loading, rather than finishing first
    assert proc.stdout.read() == b""  # nothing was generated


def test_ctrl_c_while_the_target_is_made_leaves_no_file(tmp_path):
    cache = tmp_path / "cache"
    proc = subprocess.Popen(CLI + ["generate", "hi", "--max-tokens", "4"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "LOCALSPEC_CACHE": str(cache)})

    def writing() -> bool:  # the child quantizer has started writing its .part file
        return any(p.stat().st_size > 0 for p in cache.glob("*.part")) if cache.is_dir() else False

    took = _interrupt_when(proc, writing)
    err = proc.stderr.read().decode()
    assert proc.returncode == 130, err
    assert took < 1.0, took
    assert "Traceback" not in err
    time.sleep(0.2)  # the killed child must not write on
    assert sorted(p.name for p in cache.iterdir() if p.is_file()) == [], list(cache.iterdir())


def test_two_first_runs_at_once_both_succeed(tmp_path):
    env = {**os.environ, "LOCALSPEC_CACHE": str(tmp_path / "cache")}
    args = CLI + ["generate", "Name a colour.", "--max-tokens", "6", "--temperature", "0", "--json"]
    procs = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()
    a, b = (json.loads(out) for out, _ in outs)
    assert a["tokens"] == b["tokens"]
    files = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_file())
    assert files == ["SmolLM2-135M-Instruct.F32.gguf"]


def test_ctrl_c_stops_a_long_prefill_midway(model_paths):
    """One 2000-token decode takes seconds here; llama.cpp's abort callback stops it within a
    fraction of that, and the cache is left as it was before the call."""
    import threading

    from localspec.config import ModelConfig
    from localspec.engine import Model

    with Model(ModelConfig(str(model_paths[0]), n_ctx=4096, n_batch=2048)) as m:
        tokens = m.tokenize("hello world " * 1000)[:2000]
        start = time.perf_counter()
        m.eval(tokens[:600])
        whole = (time.perf_counter() - start) * 1800 / 600
        if whole < 0.6:
            pytest.skip(f"a 1800-token prefill takes only {whole:.2f} s on this machine")
        m.eval(tokens[600:700])
        before = list(m.tokens)
        threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            m.eval(tokens[:1800])
        took = time.perf_counter() - start
        assert took < min(0.5, whole / 2), (took, whole)
        assert m.tokens == before
        assert m.eval(tokens[700:702], logits_from=-1).shape == (1, m.n_vocab)  # still usable
