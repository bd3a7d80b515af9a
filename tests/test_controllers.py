"""The one home for making a k controller (localspec.loading.controllers) and the one sampling-
settings record (SamplingConfig.record), without a model: generate, bench, serve and chat each get
their controllers from `controllers.make`, agree on k_max and on one controller per (drafter,
temperature band), and write the same sampling fields."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from localspec.config import DecodeConfig, SamplingConfig
from localspec.decoding.controller import KController
from localspec.loading import controllers, warmstart
from localspec.loading.controllers import Controllers, k_max_for

SAMPLING = SamplingConfig(temperature=0.3, top_k=7, top_p=0.9, min_p=0.01, seed=5)


class Model:
    """What warm start and the callers read of a loaded model."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.n_threads = 2
        self.n_ctx = 256
        self.n_vocab = 100
        self.cfg = SimpleNamespace(n_gpu_layers=0)
        self.chat_template = None
        self.tokens: list[int] = []

    def reset(self) -> None:
        raise Stop("a run started")   # the bench test ends here: its controllers are made by then


class Stop(Exception):
    pass


class Session:
    def __init__(self, tmp_path: Path, drafter_kind: str = "model"):
        for name in ("target.gguf", "draft.gguf"):
            (tmp_path / name).write_bytes(b"GGUF " + name.encode())
        self.target, self.draft = Model(tmp_path / "target.gguf"), Model(tmp_path / "draft.gguf")
        self.drafter_kind = drafter_kind
        self.threads = None

    def make_drafter(self, kind=None):
        kind = kind or self.drafter_kind
        return None if kind == "none" else SimpleNamespace(name=kind, draft_cost_free=kind == "lookup")

    def chat_or_raw(self, chat, notice):
        return False

    def prompt_tokens(self, text, chat, system=None, special=True):
        return [1, 2, 3]

    def check_fits(self, tokens, what="prompt"):
        pass

    def describe(self) -> dict:
        return {}


@pytest.fixture
def session(tmp_path, warm_cache):
    return Session(tmp_path)


@pytest.fixture
def made(monkeypatch):
    """Every call of `controllers.make`, as (drafter name, temperature, k, its controller, warmed)."""
    calls = []
    real = controllers.make

    def spy(session, drafter, temperature, k=None, k_max=None, warm=True):
        c, warmed = real(session, drafter, temperature, k, k_max, warm)
        calls.append((drafter.name if drafter else None, temperature, k, c, warmed))
        return c, warmed

    monkeypatch.setattr(controllers, "make", spy)
    return calls


def trained() -> KController:
    c = KController(8)
    for k, acc in [(4, 4), (4, 3), (0, 0), (6, 6), (6, 2), (0, 0)]:
        c.observe(k, k, acc, 0.002 * k, 0.010 + 0.003 * k)
    return c


# ---- the one function and the one k_max rule ---------------------------------------------------
def test_k_max_is_the_default_raised_to_a_fixed_k():
    assert k_max_for(None) == DecodeConfig.k_max
    assert k_max_for(4) == DecodeConfig.k_max
    assert k_max_for(DecodeConfig.k_max + 8) == DecodeConfig.k_max + 8
    assert k_max_for(None, 5) == 5 and k_max_for(9, 5) == 9


def test_make_warm_starts_from_the_record_and_says_so(session):
    model = session.make_drafter("model")
    warmstart.save(trained(), session, "model", 0.0)
    c, warmed = controllers.make(session, model, 0.0)
    assert warmed and c.k_max == DecodeConfig.k_max and not c.draft_cost_free
    assert c.verify_costs.by_size   # the record's costs are in it
    assert controllers.make(session, model, 0.0, warm=False)[1] is False
    assert controllers.make(session, model, 0.0, k=20)[1] is False   # a fixed k is never warm-started
    assert controllers.make(session, None, 0.0)[1] is False          # plain decoding has no record
    lookup, _ = controllers.make(session, session.make_drafter("lookup"), 0.0, k=20)
    assert lookup.draft_cost_free and lookup.fixed_k == 20 and lookup.k_max == 20


def test_controllers_keep_one_per_drafter_and_band_and_save_each_into_its_band(session, made, monkeypatch):
    saved = []
    monkeypatch.setattr(warmstart, "save", lambda c, s, name, t: saved.append((c, name, warmstart.band(t))))
    kept = Controllers(session)
    model, lookup = session.make_drafter("model"), session.make_drafter("lookup")
    greedy = kept.get(model, 0.0)
    sampled = kept.get(model, 0.7)
    assert greedy is not sampled and kept.get(model, 1.0) is sampled and kept.get(model, 0.0) is greedy
    assert kept.get(lookup, 0.7) not in (greedy, sampled) and kept.get(None, 0.7) not in (greedy, sampled)
    assert [(name, t) for name, t, *_ in made] == [("model", 0.0), ("model", 0.7), ("lookup", 0.7), (None, 0.7)]
    kept.save(model, 1.0)
    assert saved == [(sampled, "model", "sampled")]
    saved.clear()
    kept.save_all()   # plain decoding's controller has no record
    assert saved == [(greedy, "model", "greedy"), (sampled, "model", "sampled"), (made[2][3], "lookup", "sampled")]
    saved.clear()
    off = Controllers(session, warm=False)
    off.get(model, 0.0)
    off.save(model, 0.0)
    off.save_all()
    assert saved == []


def test_the_server_takes_k_max_from_the_one_rule(monkeypatch):
    """Change the default bound and the requests follow; their own `max(12, k)` would not (bench
    and chat: their own tests)."""
    from localspec.serve.api import Defaults, parse

    monkeypatch.setattr(DecodeConfig, "k_max", 7)
    assert controllers.make(None, None, 0.0, warm=False)[0].k_max == 7
    for k, want in ((None, 7), (3, 7), (9, 9)):
        req = parse({"prompt": "hi"}, Defaults(SAMPLING, k=k), chat=False)
        assert req.decode.k_max == want, k


# ---- each caller gets its controller from the one function -------------------------------------
def test_generate_gets_its_controller_from_make(session, made, monkeypatch):
    from localspec.cli import app
    from localspec.decoding import stream

    monkeypatch.setattr(stream, "stream_text", lambda *a, **kw: iter(()))
    opts = SimpleNamespace(sampling=SAMPLING, k=None)
    warmstart.save(trained(), session, "model", SAMPLING.temperature)
    result = app._run(session, "hi", opts, DecodeConfig(k=None), False, None, True, True, True)
    [(name, temperature, k, c, warmed)] = made
    assert (name, temperature, k, warmed) == ("model", SAMPLING.temperature, None, True)
    assert result["warm_start"] is True and c.k_max == DecodeConfig.k_max


def test_bench_gets_one_controller_per_variant_from_make(session, made, monkeypatch):
    from localspec.bench.run import BenchOptions, BenchPrompt, run_bench

    monkeypatch.setattr(DecodeConfig, "k_max", 7)   # the bound is the one rule's
    opts = BenchOptions(sampling=SAMPLING, ks=(None, 20), warmup=False)
    with pytest.raises(Stop):
        run_bench(session, [BenchPrompt("chat", "hi")], opts)
    assert [(name, t, k) for name, t, k, *_ in made] == [("model", SAMPLING.temperature, None),
                                                          ("model", SAMPLING.temperature, 20)]
    assert [c.k_max for *_, c, _ in made] == [7, 20]


def test_serve_keeps_one_controller_per_band_from_make(session, made, monkeypatch):
    pytest.importorskip("starlette")
    from localspec.serve.api import Defaults
    from localspec.serve.app import Server

    saved = []
    monkeypatch.setattr(warmstart, "save", lambda c, s, name, t: saved.append((c, name, warmstart.band(t))))
    server = Server(session, Defaults(SAMPLING, k=None))
    try:
        drafter = session.make_drafter()
        got = [server._controller(0, t, drafter) for t in (0.0, 0.7, 1.0, 0.0)]
    finally:
        server.close()
    assert got[0] is got[3] and got[1] is got[2] and got[0] is not got[1]
    assert [(name, t) for name, t, *_ in made] == [("model", 0.0), ("model", 0.7)]
    server._maybe_save(force=True)   # what shutdown saves: each band into its own record
    assert saved == [(got[0], "model", "greedy"), (got[1], "model", "sampled")]


def test_chat_keeps_one_controller_per_drafter_and_band_from_make(session, made, monkeypatch):
    pytest.importorskip("textual")
    from localspec_tui.chat import Chat, Turn

    class Quiet(Chat):
        def _stream(self, drafter, prompt, sampling, decode, controller):
            yield from ()

    saved = []
    monkeypatch.setattr(warmstart, "save", lambda c, s, name, t: saved.append((name, warmstart.band(t))))
    monkeypatch.setattr(DecodeConfig, "k_max", 7)   # the chat's bound is the one rule's
    chat = Quiet(session, SAMPLING)
    assert chat.k_max == 7
    for kind, t in (("model", 0.0), ("model", 0.7), ("lookup", 0.7), ("model", 1.0)):
        chat.drafter_kind, chat.sampling = kind, replace(SAMPLING, temperature=t)
        chat.reply(Turn([1, 2, 3], 0, 0), lambda chunk: None)
    assert [(name, t) for name, t, *_ in made] == [("model", 0.0), ("model", 0.7), ("lookup", 0.7)]
    assert [c.k_max for *_, c, _ in made] == [7, 7, 7]
    assert saved == [("model", "greedy"), ("model", "sampled"), ("lookup", "sampled"), ("model", "sampled")]


# ---- one sampling-settings record --------------------------------------------------------------
RECORD = {"temperature": 0.3, "top_k": 7, "top_p": 0.9, "min_p": 0.01, "seed": 5}


def test_generate_json_and_saved_chats_write_the_one_sampling_record(session, monkeypatch):
    from localspec.cli import app
    from localspec.decoding import stream

    assert SAMPLING.record() == RECORD   # the keys and values users' tools read
    # A field added to the one record shows in all three outputs: none writes its own copy.
    real = SamplingConfig.record
    monkeypatch.setattr(SamplingConfig, "record", lambda self: {**real(self), "probe": 1})
    want = {**RECORD, "probe": 1}
    monkeypatch.setattr(stream, "stream_text", lambda *a, **kw: iter(()))
    opts = SimpleNamespace(sampling=SAMPLING, k=None)
    result = app._run(session, "hi", opts, DecodeConfig(), False, None, True, False, True)
    assert {key: result.get(key) for key in want} == want

    pytest.importorskip("textual")
    from localspec.decoding.stats import RunStats
    from localspec_tui.chat import Reply
    from localspec_tui.saving import reply_stats, settings_of

    chat = SimpleNamespace(session=session, sampling=SAMPLING, drafter_kind="model", k=None, max_tokens=None)
    settings = settings_of(chat)
    stats = reply_stats(Reply("stop", RunStats(), 1.0, "model"), chat, SAMPLING, None)
    assert {key: settings.get(key) for key in want} == want == {key: stats.get(key) for key in want}
