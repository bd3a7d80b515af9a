"""The chat behind the screen and its command line, without a model: one k controller per
temperature band, the prompt-fit rule it shares with generate, `--resume` with an id no row can
have, and a model file that cannot load refused before the screen opens."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from localspec.loading import warmstart
from localspec.config import ConfigError, SamplingConfig
from localspec.engine import EngineError
from localspec.loading.session import LoadConfig, Session, resolve_files
from tests.tiny_gguf import write_tiny_gguf

pytest.importorskip("textual")

from localspec_tui.chat import Chat  # noqa: E402
from tests.test_tui_support import FakeModel, FakeSession, script  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GREEDY = SamplingConfig(temperature=0.0, seed=1)


class Target(FakeModel):
    """A chat template of one token per character of each message."""

    def chat_prompt(self, messages) -> list[int]:
        return [7] * sum(len(m["content"]) for m in messages)


class DraftingSession(FakeSession):
    def __init__(self, n_ctx: int = 2048) -> None:
        super().__init__()
        self.target = Target(str(self.target.path), n_ctx)

    def make_drafter(self, kind):
        return SimpleNamespace(name=kind, draft_cost_free=kind == "lookup")


class RecordingChat(Chat):
    """The real reply loop; the chunks come from a script, and each reply's controller is kept."""

    def __init__(self, session, **options) -> None:
        super().__init__(session, **options)
        self.controllers = []

    def _stream(self, drafter, prompt, sampling, decode, controller):
        self.controllers.append(controller)
        yield from script("A short reply.")


# ---- item 7: a controller per temperature band ------------------------------------------------
def test_each_temperature_band_has_its_own_controller_and_record(monkeypatch):
    loaded, saved = [], []
    monkeypatch.setattr(warmstart, "load_into", lambda c, s, kind, t: loaded.append((c, kind, t)) or False)
    monkeypatch.setattr(warmstart, "save", lambda c, s, kind, t: saved.append((c, kind, warmstart.band(t))))
    chat = RecordingChat(DraftingSession(), sampling=GREEDY, warm_start=True)
    temperatures = (0.0, 0.3, 0.7, 0.0, 1.0)
    for t in temperatures:
        chat.sampling = replace(GREEDY, temperature=t)
        chat.reply(chat.prepare("Hello?"), lambda chunk: None)
    greedy, sampled = chat.controllers[0], chat.controllers[1]
    assert greedy is not sampled
    assert chat.controllers == [greedy, sampled, sampled, greedy, sampled]
    # each band's controller warm-started from its own band, and saved into it
    assert [(c, kind, warmstart.band(t)) for c, kind, t in loaded] == [
        (greedy, "auto", "greedy"), (sampled, "auto", "sampled")]
    assert saved == [(c, "auto", warmstart.band(t)) for c, t in zip(chat.controllers, temperatures)]
    chat.cycle_drafter()   # model: a controller of its own too
    chat.reply(chat.prepare("Again?"), lambda chunk: None)
    assert chat.controllers[-1] not in (greedy, sampled)


# ---- item 9: the prompt-fit rule --------------------------------------------------------------
def test_a_prompt_of_n_ctx_minus_one_tokens_is_accepted_by_chat_as_by_generate():
    n_ctx = 64
    session = DraftingSession(n_ctx)
    chat = RecordingChat(session, sampling=GREEDY, max_tokens=16)
    turn = chat.prepare("x" * (n_ctx - 1))
    assert len(turn.prompt) == n_ctx - 1
    chat.history.clear()
    with pytest.raises(ConfigError, match="too long"):
        chat.prepare("x" * n_ctx)
    assert chat.history == []   # a refused message costs nothing
    generate = Session(session.target, None, "none")   # what `generate` checks its prompt with
    generate.check_fits([0] * (n_ctx - 1))
    with pytest.raises(ConfigError, match="too long"):
        generate.check_fits([0] * n_ctx)


# ---- item 22: --resume with an id no row can have ---------------------------------------------
def chat_cli(*args: str, env: dict, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", "chat", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, cwd=REPO, **kwargs)


def test_resume_with_an_id_past_sqlite_integers_is_one_line(store, db):
    store.add_message(store.new_conversation({}, None), "user", "hi")
    for number in (2**63, 2**64 + 5):
        r = chat_cli("--resume", str(number), env={"LOCALSPEC_HISTORY": str(db)})
        assert r.returncode == 2 and r.stderr == f"error: no conversation {number} to resume " \
                                                 "(see `localspec history`)\n", r.stderr


# ---- item 26: a model that cannot load, before the screen -------------------------------------
def bad_models(tmp_path: Path) -> dict[str, Path]:
    good = write_tiny_gguf(tmp_path / "good.gguf")
    data = good.read_bytes()
    version = tmp_path / "version99.gguf"
    version.write_bytes(data[:4] + struct.pack("<I", 99) + data[8:])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    header = tmp_path / "header-cut.gguf"
    header.write_bytes(data[:40])
    return {"GGUF version 99": version, "truncated": cut, "GGUF header": header}   # "truncated GGUF header", or "corrupt"


def test_the_whole_header_is_checked_before_any_model_loads(tmp_path):
    for needle, path in bad_models(tmp_path).items():
        with pytest.raises(EngineError) as e:
            resolve_files(LoadConfig(target=str(path), drafter="none"))
        assert needle in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
    good = tmp_path / "good.gguf"
    assert resolve_files(LoadConfig(target=str(good), drafter="none")).target == str(good)


ALTERNATE_SCREEN = b"\x1b[?1049h"   # what Textual writes first when its screen opens


def chat_in_a_terminal(args: list[str]) -> tuple[int | None, str]:
    """`localspec chat ARGS` in a pseudo-terminal (stdin, stdout and stderr, where Textual draws):
    (exit code, or None when the screen opened and the chat had to be ended; what it wrote)."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "chat", *args], stdin=slave, stdout=slave,
                            stderr=slave, cwd=REPO)
    os.close(slave)
    seen = bytearray()
    while ALTERNATE_SCREEN not in seen:
        try:
            chunk = os.read(master, 4096)
        except OSError:   # EIO: the chat ended and closed the terminal
            break
        if not chunk:
            break
        seen.extend(chunk)
    opened = ALTERNATE_SCREEN in seen
    if opened:
        proc.kill()
    code = proc.wait(timeout=60)
    os.close(master)
    return (None if opened else code), seen.decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_chat_refuses_a_model_that_cannot_load_before_its_screen_opens(tmp_path):
    for needle, path in bad_models(tmp_path).items():
        code, out = chat_in_a_terminal(["--target", str(path), "--no-save"])
        assert code == 2, (needle, code, out[-300:])
        assert out.count("\n") == 1 and out.startswith("error: ") and needle in out, out
