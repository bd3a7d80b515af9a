"""The second hostile-input pass over the CLI (issue 19): each case through the real entry point,
ending in one `error:` line and exit code 2, or quietly where that is right (a reader that left).

Reads from endless sources run under a 1 GiB address-space limit, so that a read without a cap ends
in MemoryError (exit 1, a failed test) rather than in the machine's memory.
"""

from __future__ import annotations

import codecs
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_hostile import CLI, REPO, one_error_line, run_in_terminal

MEMORY_LIMIT = 1 << 30


def run(*args: str, stdin: bytes | Path = b"", closed: tuple[int, ...] = (), limit_memory: bool = False,
        env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; `stdin` bytes or a file to read it from; `closed`: standard
    descriptors to close before it starts (`<&-`, `>&-`)."""
    def before_exec() -> None:
        if limit_memory:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        for fd in closed:
            os.close(fd)

    source = stdin.open("rb") if isinstance(stdin, Path) else None
    try:
        return subprocess.run(CLI + list(args), input=None if source else stdin, stdin=source,
                              capture_output=True, cwd=REPO, timeout=timeout, preexec_fn=before_exec,
                              env={**os.environ, **(env or {})})
    finally:
        if source:
            source.close()


PRESET = ("description: x\ntarget: {{repo: owner/name, file: '{file}'}}\ndrafter: {drafter}\n"
          "sampling: {{temperature: 0, top_k: 0, top_p: 1.0, min_p: 0}}\nk: auto\nn_ctx: 512\nverified: false\n")


def preset(file: str = "a.gguf", drafter: str = "lookup") -> str:
    return PRESET.format(file=file, drafter=drafter)


def bomb(levels: int, fan: int) -> str:
    """A preset whose `drafter` is fan**(levels + 1) strings, written with levels * (fan - 1) aliases."""
    value = "[" + ", ".join(["lol"] * fan) + "]"
    for i in range(levels):
        value = f"[&a{i} {value}, " + ", ".join([f"*a{i}"] * (fan - 1)) + "]"
    return preset(drafter=value)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostile2")
    (d / "deep.yaml").write_text("description: " + "[" * 20_000 + "]" * 20_000 + "\n")
    (d / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (d / "bomb.yaml").write_text(bomb(9, 9))       # 9^9 strings: gigabytes as text
    (d / "bomb3.yaml").write_text(bomb(3, 6))      # within the alias cap, ~12 kB as text
    (d / "climb.yaml").write_text(preset(file="../../evil.gguf"))
    (d / "absolute.yaml").write_text(preset(file="/etc/evil.gguf"))
    (d / "loop.gguf").symlink_to(d / "loop2.gguf")
    (d / "loop2.gguf").symlink_to(d / "loop.gguf")
    return d


@pytest.fixture(scope="module")
def history_db(tmp_path_factory) -> dict:
    """A history file with one conversation: an id past SQLite's range reaches SQLite only then."""
    from localspec.chats.store import open_store

    path = tmp_path_factory.mktemp("history") / "history.sqlite3"
    store = open_store(path, strict=True)
    store.add_message(store.new_conversation(), "user", "hello")
    store.close()
    return {"LOCALSPEC_HISTORY": str(path)}


BIG = str(2**63)

# (case id, arguments, keyword arguments of `run`, text the error line must contain)
CASES = [
    ("history-show-2^63", ["history", "show", BIG], {}, "2^63"),
    ("history-rm-2^63", ["history", "rm", BIG], {}, "2^63"),
    ("history-export-2^63", ["history", "export", BIG, "md", "-"], {}, "2^63"),
    ("history-limit-2^63", ["history", "--limit", BIG], {}, "--limit"),
    ("preset-deep-generate", ["generate", "hi", "--preset", "{d}/deep.yaml"], {}, "nested deeper"),
    ("preset-deep-doctor", ["doctor", "--preset", "{d}/deep.yaml", "--seconds", "0"], {}, "nested deeper"),
    ("bench-prompts-deep-json", ["bench", "--prompts", "{d}/deep.jsonl"], {}, "deep.jsonl:1"),
    ("stdin-closed", ["generate", "-"], {"closed": (0,)}, "standard input is closed"),
    ("stdout-closed-models", ["models"], {"closed": (1,)}, "standard output is closed"),
    ("stdout-closed-history", ["history"], {"closed": (1,)}, "standard output is closed"),
    ("stdout-closed-generate", ["generate", "hi", "--drafter", "none", "--max-tokens", "2"], {"closed": (1,)},
     "standard output is closed"),
    ("pull-file-climbs", ["pull", "owner/name", "../../evil.gguf"], {}, "no '..'"),
    ("pull-file-absolute", ["pull", "owner/name", "/etc/evil.gguf"], {}, "inside the repo"),
    ("pull-preset-file-climbs", ["pull", "{d}/climb.yaml"], {}, "no '..'"),
    ("preset-file-climbs", ["generate", "hi", "--preset", "{d}/climb.yaml"], {}, "no '..'"),
    ("preset-file-absolute", ["generate", "hi", "--preset", "{d}/absolute.yaml"], {}, "inside the repo"),
    ("target-symlink-loop", ["generate", "hi", "--target", "{d}/loop.gguf"], {}, "loop.gguf"),
    ("doctor-seconds-nan", ["doctor", "--seconds", "nan"], {}, "--seconds"),
    ("doctor-seconds-inf", ["doctor", "--seconds", "inf"], {}, "--seconds"),
    ("doctor-seconds-huge", ["doctor", "--seconds", "1e9"], {}, "--seconds"),
    ("preset-dev-zero", ["generate", "hi", "--preset", "/dev/zero"], {"limit_memory": True}, "over 1 MiB"),
    ("stdin-dev-zero", ["generate", "-"], {"stdin": Path("/dev/zero"), "limit_memory": True}, "over 64 MiB"),
    ("bench-prompts-dev-zero", ["bench", "--prompts", "/dev/zero"], {"limit_memory": True}, "over 64 MiB"),
    ("preset-alias-bomb", ["generate", "hi", "--preset", "{d}/bomb.yaml"], {"limit_memory": True}, "aliases"),
]


@pytest.mark.parametrize("args, kw, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_ends_with_one_error_line(hostile, history_db, args, kw, needle):
    argv = [a.replace("{d}", str(hostile)) for a in args]
    line = one_error_line(run(*argv, env=history_db, timeout=90, **kw))
    assert needle in line, line


# -- bounded messages ----------------------------------------------------------------------------

def test_a_value_echoed_from_an_alias_bomb_is_bounded(hostile):
    from localspec.loading.defaults import MAX_SHOWN

    line = one_error_line(run("generate", "hi", "--preset", str(hostile / "bomb3.yaml"), limit_memory=True))
    assert "drafter: must be one of" in line
    assert len(line) < len(str(hostile)) + 150 + MAX_SHOWN, len(line)


@pytest.mark.parametrize("args", [["x" * 10_000], ["models", "--" + "y" * 10_000], ["-k", "z" * 10_000]],
                         ids=["unknown-command", "unknown-option", "k-value"])
def test_a_huge_value_in_an_error_is_cut(args):
    from localspec.cli.options import MAX_LINE
    from localspec.loading.defaults import MAX_SHOWN

    if args[0] == "-k":
        args = ["generate", "hi", *args]
    line = one_error_line(run(*args))
    assert "…" in line or "..." in line   # cut by error_line, or by `shown` (reprlib)
    assert len(line) <= MAX_LINE + len("error: ") and max(len(w) for w in line.split()) <= MAX_SHOWN


def test_error_line_cuts_long_words_and_long_lines(capsys):
    from localspec.cli.options import MAX_LINE, error_line
    from localspec.loading.defaults import MAX_SHOWN

    error_line(f"bad value {'v' * 5000} in {'/very/long/path' * 40}")
    line = capsys.readouterr().err.rstrip("\n")
    assert line.startswith("error: bad value vvv") and "\n" not in line
    assert max(len(w) for w in line.split()) == MAX_SHOWN
    error_line("many words " * 100_000)
    line = capsys.readouterr().err.rstrip("\n")
    assert len(line) == len("error: ") + MAX_LINE and "…" in line


def test_shown_never_builds_a_huge_repr():
    from localspec.loading.defaults import MAX_SHOWN, shown

    nested: list = ["lol"] * 9
    for _ in range(5):
        nested = [nested] * 9   # 9^6 strings: 4 MB as text (a bomb's gigabytes would be as easy)
    for value in (nested, "x" * 10_000, 10**4400, {"k": ["v"] * 1000}):
        assert len(shown(value)) <= MAX_SHOWN
    assert shown("abc") == "'abc'"


# -- capped reads ----------------------------------------------------------------------------------

class Endless:
    """A byte source that never ends, counting what was read from it."""

    def __init__(self) -> None:
        self.given = 0

    def read(self, n: int = -1) -> bytes:
        assert n >= 0, "an unbounded read of an endless source"
        self.given += n
        return b"a" * n


def test_read_capped_reads_at_most_one_byte_past_the_cap():
    import io

    from localspec.config import ConfigError
    from localspec.loading.defaults import read_capped

    source = Endless()
    with pytest.raises(ConfigError, match="the thing is over 100 bytes"):
        read_capped(source, 100, "the thing")
    assert source.given == 101
    assert read_capped(io.BytesIO(b"a" * 100), 100, "the thing") == b"a" * 100


# -- generate: closing the models, a reader that leaves, whitespace, cut characters ---------------

@pytest.mark.parametrize("fault, code", [(KeyboardInterrupt(), 130), (RuntimeError("injected"), 1)],
                         ids=["ctrl-c", "internal-error"])
def test_generate_closes_the_models_when_generation_fails(monkeypatch, capsys, model_paths, fault, code):
    """A fault after the first chunk, mid-generation: the session's models are closed all the same."""
    from localspec.cli import app as cli
    from localspec.decoding import stream
    from localspec.loading.session import Session

    closed = []
    close, stream_text = Session.close, stream.stream_text

    def counting_close(self) -> None:
        closed.append(self)
        close(self)

    def failing_stream(*args, **kwargs):
        chunks = stream_text(*args, **kwargs)
        try:
            yield next(chunks)
        finally:
            chunks.close()
        raise fault

    monkeypatch.setattr(Session, "close", counting_close)
    monkeypatch.setattr(stream, "stream_text", failing_stream)
    monkeypatch.delenv("LOCALSPEC_VERBOSE", raising=False)
    monkeypatch.setattr(sys, "argv", ["localspec", "generate", "Hi", "--target", str(model_paths[0]),
                                      "--drafter", "lookup", "--max-tokens", "16", "--temperature", "0"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == code, capsys.readouterr().err
    assert len(closed) == 1


def test_a_reader_that_leaves_early_ends_the_run_quietly():
    """`localspec generate … | head -c 10`: exit code 0 and nothing on stderr."""
    proc = subprocess.Popen(CLI + ["generate", "1, 2, 3, 4, 5,", "--raw", "--drafter", "none", "--temperature", "0",
                                   "--max-tokens", "200"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode("utf-8", "replace")
    proc.wait(timeout=120)
    assert len(head) == 10
    assert proc.returncode == 0, err
    assert "error" not in err and "Traceback" not in err, err


def test_a_whitespace_prompt_is_a_prompt_on_argv_and_on_stdin():
    common = ["--raw", "--drafter", "none", "--max-tokens", "2", "--temperature", "0", "--json"]
    prompt = " \n\t "
    on_argv = run("generate", prompt, *common)
    on_stdin = run("generate", "-", *common, stdin=prompt.encode())
    for r in (on_argv, on_stdin):
        assert r.returncode == 0, r.stderr.decode()
    assert json.loads(on_argv.stdout)["n_prompt_tokens"] == json.loads(on_stdin.stdout)["n_prompt_tokens"] > 1
    assert "empty prompt" in one_error_line(run("generate", "-", stdin=b""))


def test_a_character_cut_by_max_tokens_is_left_out(model_paths):
    """😀 is three tokens here; 13 tokens end one token into the fifth. The text holds four whole
    emoji, in --json and streamed alike, not a U+FFFD for the fifth."""
    from localspec.config import ModelConfig
    from localspec.engine import Model

    args = ["generate", "Emoji for happy: 😀😀😀", "--raw", "--drafter", "none", "--temperature", "0",
            "--max-tokens", "13"]
    as_json = run(*args, "--json")
    assert as_json.returncode == 0, as_json.stderr.decode()
    data = json.loads(as_json.stdout)
    with Model(ModelConfig(str(model_paths[1]), n_ctx=64)) as vocab:
        raw = b"".join(vocab.piece(t) for t in data["tokens"])
    decoder = codecs.getincrementaldecoder("utf-8")()
    whole = decoder.decode(raw)
    assert decoder.getstate()[0], "the output ended on a whole character: the test proves nothing"
    assert data["text"] == whole and "\ufffd" not in data["text"]
    streamed = run(*args)
    assert streamed.returncode == 0, streamed.stderr.decode()
    assert streamed.stdout.decode("utf-8") == whole + "\n"


# -- issue 33: silent no-ops -------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (("--rpc", ""), "--rpc is empty"),
    (("--rpc", ","), "--rpc is empty"),
    (("--rpc", "127.0.0.1:1,,127.0.0.1:2"), "--rpc has an empty entry"),
    (("--tensor-split", "3,,1"), "--tensor-split has an empty entry"),
    (("--json-schema", "[1, 2]"), "must be an object, got list"),
    (("--json-schema", "42"), "must be an object, got int"),
    (("--json-schema", '{"type": "object", "properties": {"n": {"type": "string", "minLength": 3, '
                       '"maxLength": 1}}}'), "'minLength' (in the schema.properties.n) is 3"),
    (("--logit-bias", "999999=-inf"), "outside the vocabulary"),   # a mistyped ban let the token through
])
def test_options_that_would_do_nothing_are_refused(args, words):
    r = run("generate", *args, "--max-tokens", "2", "hi")
    one_error_line(r)
    assert words in r.stderr.decode()


def test_an_empty_grammar_or_schema_file_is_refused_not_ignored(tmp_path):
    empty = tmp_path / "empty.gbnf"
    empty.write_text("")
    for option, words in (("--grammar", "grammar file"), ("--json-schema", "JSON schema file")):
        r = run("generate", option, str(empty), "--max-tokens", "2", "hi")
        one_error_line(r)
        assert words in r.stderr.decode() and "is empty" in r.stderr.decode()


def test_bench_constraints_with_concurrency_is_refused_not_half_run():
    r = run("bench", "--constraints", "--concurrency", "2", "--max-tokens", "2")
    one_error_line(r)
    assert "--constraints runs on its own" in r.stderr.decode()


def test_chat_with_a_bad_grammar_fails_in_the_shell_before_the_screen(tmp_path):
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= foo\n")
    r = run_in_terminal("chat", "--grammar", str(bad), "--no-save", env={"LOCALSPEC_NO_WARM_START": "1"})
    line = one_error_line(r)
    assert "Undefined rule identifier 'foo'" in line
