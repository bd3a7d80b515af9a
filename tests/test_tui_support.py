"""A scripted stand-in for the models behind `localspec chat`, for tests that need no model.

`ScriptedChat` is the real tui Chat (history, stop, live numbers, the Reply it returns) with two
parts replaced: `prepare` builds no prompt through a chat template, and `_stream` yields Chunks
made from a fixed text instead of decoding. Every step has fixed timings and its clock is a fake
one, so each number on screen (α, tokens/s, the note under a reply) is the same on every run.

The helpers (`scripted_app`, `send`, `wait_for`, `screen_text`) are shared by tests/test_tui_*.py.
The tests at the bottom check the stand-in itself.
"""

from __future__ import annotations

import asyncio
import io
import re
import threading
import time
from pathlib import Path
from dataclasses import replace
from types import SimpleNamespace

import pytest

pytest.importorskip("textual")

from rich.console import Console  # noqa: E402

from localspec.config import SamplingConfig  # noqa: E402
from localspec.decoding.decoder import Step  # noqa: E402
from localspec.decoding.stream import Chunk  # noqa: E402
from localspec_tui.app import ChatApp  # noqa: E402
from localspec_tui.chat import Chat  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0, seed=1)
ACCEPTED = (3, 4, 1, 0, 4, 2, 4, 3)   # accepted draft tokens per step, cycled (k 4)
STEP_SECONDS = (0.004, 0.012, 0.001)  # draft, verify, host: per step, whatever it produced
PLAIN_EVERY = 7                       # every 7th step is plain (k 0), so "plain tok/s" is known

CODE_REPLY = """Here is a small function that adds two numbers:

```python
def add(a: int, b: int) -> int:
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b


print(add(2, 3))
```

Call it as `add(2, 3)` to get **5**; it works for floats too.
"""


def long_reply(paragraphs: int) -> str:
    """A long Markdown reply: paragraphs, a list and small code blocks, none of them long."""
    parts = []
    for i in range(paragraphs):
        parts.append(f"Paragraph {i}: lighthouses guide ships along the coast at night, and keepers "
                     f"trimmed the wicks every few hours so the light never failed.")
        if i % 5 == 2:
            parts.append(f"```python\ndef keeper_{i}(lamp):\n    return lamp.trim()\n```")
        if i % 5 == 4:
            parts.append(f"- item {i}a\n- item {i}b")
    return "\n\n".join(parts) + "\n"


def tokenize(text: str) -> list[str]:
    """Token-like pieces: a word with its leading space, or a run of punctuation/newlines."""
    return re.findall(r"\s*\w+|\s*[^\w\s]+|\s+", text)


def script(text: str, finish: str = "stop", speculating: bool = True) -> list[Chunk]:
    """The chunks a decoder could have produced for `text`, one per target pass (all plain
    without `speculating`)."""
    tokens = tokenize(text)
    chunks, i, n = [], 0, 0
    while i < len(tokens):
        plain = n % PLAIN_EVERY == PLAIN_EVERY - 1 or not speculating
        accepted = 0 if plain else ACCEPTED[n % len(ACCEPTED)]
        take = tokens[i:i + accepted + 1]
        accepted = len(take) - 1 if len(take) <= accepted else accepted
        last = i + len(take) >= len(tokens)
        step = Step(tokens=tuple(range(i, i + len(take))), from_draft=(True,) * accepted + (False,),
                    k=0 if plain else 4, n_drafted=0 if plain else 4, n_accepted=accepted,
                    t_draft=0.0 if plain else STEP_SECONDS[0], t_verify=STEP_SECONDS[1],
                    t_python=STEP_SECONDS[2], finish=finish if last else None, source="" if plain else "model")
        pieces = tuple(zip(take, step.kinds()))
        chunks.append(Chunk("".join(take), step, step.tokens, pieces, 0.0))
        i += len(take)
        n += 1
    return chunks


TURN_START, TURN_END = 1_000_000, 1_000_001
ROLES = {"system": 1_000_002, "user": 1_000_003, "assistant": 1_000_004}


class FakeModel:
    """What the chat reads of a model, and a chat template in the shape of ChatML: per message a
    turn marker, its role, its content in `tokenize` pieces, an end-of-turn marker; then the
    assistant's generation prompt. `decode` reads contents back (a continuation's open turn)."""

    def __init__(self, path: str, n_ctx: int = 2048) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.n_ctx = n_ctx
        self.n_threads = 1
        self.cfg = SimpleNamespace(n_gpu_layers=0)
        self.chat_template = "(scripted)"
        self.tokens: list[int] = []
        self.pieces: list[str] = []   # the vocabulary, grown by use
        self._ids: dict[str, int] = {}

    def meta(self, key: str):
        return {"general.name": "SmolLM2 135M Instruct"}.get(key)

    def chat_prompt(self, messages) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [TURN_START, ROLES[m["role"]], *self.encode(m["content"]), TURN_END]
        return ids + [TURN_START, ROLES["assistant"]]

    def encode(self, text: str) -> list[int]:
        return [self._id(piece) for piece in tokenize(text)]

    def _id(self, piece: str) -> int:
        if piece not in self._ids:
            self._ids[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self._ids[piece]

    def decode(self, ids) -> str:
        return "".join(self.pieces[i] for i in ids if i < len(self.pieces))


class FakeSession:
    """What the app reads of a Session: the model pair's names and sizes, and the drafter."""

    def __init__(self) -> None:
        self.target = FakeModel("/models/SmolLM2-135M-Instruct.F32.gguf")
        self.draft = FakeModel("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        self.drafter_kind = "auto"

    def make_drafter(self, kind):
        return None

    def close(self) -> None:
        pass


PREFILL_SECONDS = 0.05   # the fake clock's time before a reply's first pass (its prompt's prefill)


class ScriptedChat(Chat):
    """Replies with `replies[i]` (cycled) to the i-th message. Its prompts are built by the real
    `prepare` / `prepare_continue` through FakeModel's template; a continuation (an open assistant
    turn) goes on with the rest of the reply whose text begins with what the turn holds. Caps as
    the decoder's: --max-tokens ("length"), the context ("context").

    `gate_after`: stop after that many chunks of each reply until `gate` is set (or the chat is
    stopped), with `paused` set meanwhile — a test looks at the screen mid-reply. `delay`: real
    seconds between chunks, for tests that must land a key press (Esc) or a kill mid-reply.
    `final_pass`: end each reply with a pass that emits nothing (the end-of-generation token)."""

    def __init__(self, session, *, replies=(CODE_REPLY,), gate_after: int | None = None,
                 delay: float = 0.0, final_pass: bool = False, **options) -> None:
        options["warm_start"] = False
        self.now = 1000.0
        super().__init__(session, clock=lambda: self.now, **options)
        self.replies = list(replies)
        self.gate_after = gate_after
        self.delay = delay
        self.final_pass = final_pass
        self.gate = threading.Event()
        self.paused = threading.Event()
        self.prompts: list[list[int]] = []
        self.answered = 0   # new messages replied to (continuations are not)

    def _text(self, prompt: list[int]) -> str:
        target = self.session.target
        if prompt[-2:] == [TURN_START, ROLES["assistant"]]:   # a new reply
            self.answered += 1
            return self.replies[(self.answered - 1) % len(self.replies)]
        start = max(i for i in range(len(prompt) - 1) if prompt[i:i + 2] == [TURN_START, ROLES["assistant"]])
        so_far = target.decode(prompt[start + 2:])
        whole = next((r for r in self.replies if r.startswith(so_far) and r != so_far), so_far)
        return whole[len(so_far):]

    def _stream(self, drafter, prompt, sampling, decode, controller):
        target = self.session.target
        self.prompts.append(list(prompt))
        words = tokenize(self._text(prompt))
        room = target.n_ctx - len(prompt)
        finish = "stop"
        if len(words) >= min(decode.max_tokens, room):
            finish = "length" if decode.max_tokens <= room else "context"
            words = words[:min(decode.max_tokens, room)]
        chunks = script("".join(words), finish, speculating=self.drafter_kind != "none") if words else []
        if self.final_pass or not chunks:   # the end-of-generation token's pass: no output
            last = Step(tokens=(), from_draft=(), k=0, n_drafted=0, n_accepted=0, t_draft=0.0,
                        t_verify=STEP_SECONDS[1], t_python=STEP_SECONDS[2], finish=finish)
            if chunks:
                chunks[-1] = Chunk(chunks[-1].text, replace(chunks[-1].step, finish=None), chunks[-1].tokens,
                                   chunks[-1].pieces, 0.0)
            chunks.append(Chunk("", last, (), (), 0.0))
        self.now += PREFILL_SECONDS
        for n, chunk in enumerate(chunks):
            if n == self.gate_after:
                self.paused.set()
                while not (self.gate.wait(0.05) or self.stop.is_set()):
                    pass
                self.paused.clear()
            if self.delay:
                time.sleep(self.delay)
            self.now += sum(STEP_SECONDS) if chunk.step.n_drafted else sum(STEP_SECONDS[1:])
            yield chunk
        target.tokens = list(prompt)   # what the cache holds for the next prompt to share


def scripted_app(*, replies=(CODE_REPLY,), gate_after=None, delay=0.0, final_pass=False, **app_options) -> ChatApp:
    def make_chat(session, **options):
        return ScriptedChat(session, replies=replies, gate_after=gate_after, delay=delay, final_pass=final_pass,
                            **options)

    return ChatApp(FakeSession(), GREEDY, chat_factory=make_chat, **app_options)


# ---- driving the app --------------------------------------------------------------------------
async def wait_for(pilot, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.02)


def settled(app) -> bool:
    from localspec_tui.reply import ReplyView

    return all(view.settled for view in app.query(ReplyView))


async def ready(pilot) -> ChatApp:
    app = pilot.app
    await wait_for(pilot, lambda: app.chat is not None and settled(app))
    await pilot.pause()
    return app


async def type_and_send(pilot, text: str) -> None:
    pilot.app.query_one("#prompt").value = text
    await pilot.press("enter")


async def send(pilot, text: str) -> None:
    """Send a message and wait until its reply has finished and is drawn."""
    app = pilot.app
    before = app.last_done
    await type_and_send(pilot, text)
    await wait_for(pilot, lambda: not app.busy and app.last_done is not before and settled(app))
    await pilot.pause()


async def mid_reply(pilot, text: str) -> None:
    """Send a message to a chat with `gate_after`, and wait until the reply pauses there, drawn."""
    app = pilot.app
    await type_and_send(pilot, text)
    await wait_for(pilot, lambda: app.chat.paused.is_set())
    await pilot.pause(0.1)   # the last chunks' messages reach the app
    await wait_for(pilot, lambda: settled(app))
    app.refresh_panel()
    await pilot.pause()


def notices(app) -> list[str]:
    """Every notice line of the conversation, scrolled out of view or not."""
    from localspec_tui.widgets import NoticeLine

    return [n.text for n in app.query(NoticeLine)]


def screen_text(app) -> str:
    """The screen as plain text: what export_screenshot() renders, exported as text not SVG."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def run(coro):
    return asyncio.run(coro)


# ---- the stand-in itself ----------------------------------------------------------------------
def test_the_script_adds_up_to_its_text_and_marks_draft_tokens():
    chunks = script(CODE_REPLY)
    assert "".join(c.text for c in chunks) == CODE_REPLY
    assert "".join(p for c in chunks for p, _ in c.pieces) == CODE_REPLY
    assert chunks[-1].step.finish == "stop" and all(c.step.finish is None for c in chunks[:-1])
    kinds = {k for c in chunks for _, k in c.pieces}
    assert kinds == {"model", "target"}
    assert any(c.step.k == 0 for c in chunks)


def test_the_scripted_chat_replies_through_the_real_reply_loop():
    chat = ScriptedChat(FakeSession(), sampling=GREEDY)
    got = []
    turn = chat.prepare("hi")
    assert turn.prompt == chat.session.target.chat_prompt([{"role": "user", "content": "hi"}])
    reply = chat.reply(turn, got.append)
    assert "".join(c.text for c in got) == CODE_REPLY == chat.history[-1]["content"]
    assert reply.n_steps == len(got) and reply.finish == "stop" and reply.drafter == "auto"
    assert reply.seconds == pytest.approx(PREFILL_SECONDS + sum(
        sum(STEP_SECONDS) if c.step.n_drafted else sum(STEP_SECONDS[1:]) for c in got))
    view = chat.live.view()
    assert view["plain_tps"] == pytest.approx(1 / sum(STEP_SECONDS[1:]))


def test_the_scripted_chat_caps_as_the_decoder_does_and_continues_an_open_turn():
    chat = ScriptedChat(FakeSession(), sampling=GREEDY, max_tokens=10)
    reply = chat.reply(chat.prepare("hi"), lambda chunk: None)
    assert reply.finish == "length" and reply.n_tokens == 10
    assert "".join(tokenize(CODE_REPLY)[:10]) == chat.history[-1]["content"]
    chat.max_tokens = None
    rest = chat.reply(chat.prepare_continue(), lambda chunk: None)
    assert rest.finish == "stop" and chat.history[-1]["content"] == CODE_REPLY and len(chat.history) == 2
    target = chat.session.target
    assert chat.prompts[-1][-1] != ROLES["assistant"] and target.decode(chat.prompts[-1][-10:]) == \
        "".join(tokenize(CODE_REPLY)[:10])
    small = ScriptedChat(FakeSession(), sampling=GREEDY)
    small.session.target.n_ctx = 30
    assert small.reply(small.prepare("hi"), lambda chunk: None).finish == "context"
