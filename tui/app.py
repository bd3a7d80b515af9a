"""The `localspec chat` app: layout, keys, and the two thread workers (loading, generating).

Workers never touch widgets; they post the messages of `tui.messages`, handled here on the UI
thread. The speculation panel is redrawn by a 4 Hz timer from `Chat.live`, never per token.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, Label, ProgressBar, Static

from localspec.config import SamplingConfig
from localspec.engine import gpu_offload_supported
from localspec.session import LoadConfig, Session

from .chat import Chat, LiveStats
from .messages import Loaded, LoadFailed, LoadProgress, Notice, PromptReady, ReplyChunk, ReplyDone, ReplyFailed
from .widgets import ChatInput, Legend, MessageRow, NoticeLine, ReplyView, SpecPanel

PANEL_HZ = 4


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def short_name(path) -> str:
    return Path(str(path)).name.removesuffix(".gguf") if path else "—"


def pair_label(session) -> str:
    """"target X F32 · draft Q4_1" when both are encodings of one model, else both file names."""
    target = short_name(session.target.path)
    if session.draft is None:
        return f"target {target} · no draft model"
    draft = short_name(session.draft.path)
    t_stem, _, t_kind = target.rpartition(".")
    d_stem, _, d_kind = draft.rpartition(".")
    if t_stem and t_stem == d_stem:
        return f"target {t_stem} {t_kind} · draft {d_kind}"
    return f"target {target} · draft {draft}"


class ChatApp(App):
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    CSS = """
    #top { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    #top-line { width: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }
    #top-right { width: auto; padding-left: 2; }
    #body { height: 1fr; }
    #conversation { width: 1fr; height: 1fr; border: round $primary 60%; border-title-color: $text-muted; padding: 0 1; }
    #legend-row { height: 1; padding: 0 1; }
    #legend { width: auto; }
    #status { width: 1fr; padding-left: 2; color: $text-muted; text-align: right; text-wrap: nowrap; text-overflow: ellipsis; }
    #panel { width: 38; }
    #loading { height: 3; padding: 1 1 0 1; }
    #loading ProgressBar { width: 24; }
    #loading-text { width: 1fr; color: $text-muted; }
    #prompt { height: 3; }
    Screen.-narrow #body { layout: vertical; }
    Screen.-narrow #panel { width: 1fr; border: none; border-top: round $primary 60%; padding: 0 1; }
    Screen.-narrow #spec-above, Screen.-narrow #spec-below { display: none; }
    Screen.-narrow #spec-compact { display: block; }
    """
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("f2", "toggle_speculation", "Spec on/off"),
        Binding("f3", "cycle_drafter", "Drafter"),
        Binding("f4", "cycle_temperature", "Temp"),
        Binding("f5", "toggle_highlight", "Highlight"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, source: LoadConfig | Session, sampling: SamplingConfig, *, k: int | None = None,
                 max_tokens: int = 256, system: str | None = None, warm_start: bool = True) -> None:
        """`source` is a LoadConfig (loaded here, in a worker) or an already-loaded Session."""
        super().__init__()
        self.source = source
        self.options = dict(sampling=sampling, k=k, max_tokens=max_tokens, system=system, warm_start=warm_start)
        self.session: Session | None = None
        self.chat: Chat | None = None
        self.busy = False
        self.highlight = True
        self.turn = 0
        self.reply_view: ReplyView | None = None
        self._turn_info = ""
        self._pending_reset = False
        self.last_done: ReplyDone | None = None   # the last finished reply (for tests and status)
        self.load_error: str | None = None        # repeated on stderr by the CLI after exit

    # ---- layout --------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        # Widgets the timer updates are held directly: a tick during mount or shutdown must not
        # depend on a DOM query finding them.
        self.spec_panel = SpecPanel(id="panel")
        self.status_line = Static(id="status")
        with Horizontal(id="top"):
            yield Static("localspec · loading…", id="top-line")
            yield Static(id="top-right")
        with Horizontal(id="body"):
            yield VerticalScroll(id="conversation")
            yield self.spec_panel
        with Horizontal(id="legend-row"):
            yield Legend(id="legend")
            yield self.status_line
        with Horizontal(id="loading"):
            yield ProgressBar(total=None, show_eta=False, show_percentage=False)
            yield Label("loading models…", id="loading-text")
        yield ChatInput(placeholder="Message · Enter sends · /reset clears", id="prompt", disabled=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        conversation = self.query_one("#conversation", VerticalScroll)
        conversation.border_title = "conversation"
        conversation.anchor()
        self.query_one("#prompt").display = False
        self.query_one(Legend).show(self.highlight)
        self.set_interval(1 / PANEL_HZ, self.refresh_panel)
        self.refresh_panel()
        if isinstance(self.source, LoadConfig):
            self.load_models(self.source)
        else:
            self.post_message(Loaded(self.source))

    # ---- workers (thread) ----------------------------------------------------------------------
    @work(thread=True, group="load")
    def load_models(self, cfg: LoadConfig) -> None:
        self.post_message(LoadProgress(f"loading models (n_ctx {cfg.n_ctx})…"))
        start = time.perf_counter()
        try:
            session = Session.load(cfg, notice=lambda m: self.post_message(LoadProgress(m)))
        except Exception as e:  # any failure becomes a notice line, never a traceback
            self.post_message(LoadFailed(one_line(e)))
            return
        self.post_message(Loaded(session))
        self.post_message(Notice(f"loaded {pair_label(session)} in {time.perf_counter() - start:.1f} s"))

    @work(thread=True, group="reply")
    def generate(self, chat: Chat, text: str, turn: int) -> None:
        try:
            prepared = chat.prepare(text)
        except Exception as e:
            self.post_message(ReplyFailed(turn, one_line(e)))
            return
        self.post_message(PromptReady(turn, prepared.dropped, len(prepared.prompt), prepared.cached))
        try:
            reply = chat.reply(prepared, lambda c: self.post_message(ReplyChunk(turn, c.pieces)))
        except Exception as e:
            self.post_message(ReplyFailed(turn, one_line(e)))
            return
        self.post_message(ReplyDone(turn, reply.finish, reply.n_tokens, reply.seconds, reply.alpha))

    # ---- worker messages -----------------------------------------------------------------------
    def on_load_progress(self, message: LoadProgress) -> None:
        self.query_one("#loading-text", Label).update(message.text)

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.error
        self.query_one("#loading").display = False
        self.add_notice(f"could not load the models: {message.error} — Ctrl+Q quits", "warning")
        self.query_one("#top-line", Static).update("localspec · no model loaded")

    def on_loaded(self, message: Loaded) -> None:
        session = self.session = message.session
        self.chat = Chat(session, **self.options)
        self.query_one("#loading").display = False
        prompt = self.query_one("#prompt", ChatInput)
        prompt.display, prompt.disabled = True, False
        prompt.focus()
        target = session.target
        self.query_one("#top-line", Static).update(f"localspec · {pair_label(session)} · n_ctx {target.n_ctx}")
        device = "GPU" if gpu_offload_supported() and target.cfg.n_gpu_layers != 0 else "CPU"
        threads = f"{target.n_threads} thread{'s' if target.n_threads != 1 else ''}"
        self.query_one("#top-right", Static).update(f"{device} · {threads}")
        if target.chat_template is None:
            self.add_notice(f"{target.name} has no chat template; chat needs one", "warning")
            prompt.disabled = True
        self.refresh_panel()

    def on_prompt_ready(self, message: PromptReady) -> None:
        if message.dropped:
            self.add_notice(
                f"context full: dropped the {message.dropped} oldest messages to fit n_ctx "
                f"(system prompt kept)", "warning")
        self._turn_info = f"prompt {message.n_prompt} ({message.cached} cached)"

    def on_reply_chunk(self, message: ReplyChunk) -> None:
        if self.reply_view is not None and message.turn == self.turn:
            self.reply_view.add(message.pieces)

    def on_reply_done(self, message: ReplyDone) -> None:
        self.last_done = message
        why = {"length": " · max tokens", "stopped": " · stopped",
               "context": " · context full"}.get(message.finish, "")
        tps = message.n_tokens / message.seconds if message.seconds > 0 else 0.0
        alpha = "" if message.alpha is None else f" · α {message.alpha:.2f}"
        if self.reply_view is not None:
            self.reply_view.set_note(f"{message.n_tokens} tokens · {tps:.1f} tok/s{alpha}{why} · {self._turn_info}")
        if message.finish == "context":
            self.add_notice("the context is full; /reset starts over (or restart with a larger --n-ctx)", "warning")
        self.end_turn()

    def on_reply_failed(self, message: ReplyFailed) -> None:
        if self.reply_view is not None and not self.reply_view.pieces:
            self.reply_view.parent.remove()
        self.add_notice(f"error: {message.error} (this message was not kept)", "warning")
        self.end_turn()

    def on_notice(self, message: Notice) -> None:
        self.add_notice(message.text, message.kind)

    def on_input_submitted(self, event: ChatInput.Submitted) -> None:
        text = event.value.strip()
        if not text or self.chat is None:
            return
        if text == "/reset":
            event.input.value = ""
            self.reset_conversation()
            return
        if text.startswith("/") and " " not in text:
            self.add_notice(f"unknown command {text}; /reset clears the conversation", "warning")
            return
        if self.busy:
            self.notify("a reply is still running; Esc stops it", timeout=3)
            return
        event.input.value = ""
        self.turn += 1
        self._turn_info = ""
        self.add_row(MessageRow("you", Static(Text(text)), user=True))   # Text: no markup parsing
        self.reply_view = ReplyView(self.highlight)
        self.add_row(MessageRow(self.assistant_label(), self.reply_view))
        self.busy = True
        self.chat.stop.clear()
        self.update_status()
        self.generate(self.chat, text, self.turn)

    # ---- actions -------------------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.busy and self.chat is not None:
            self.chat.stop.set()   # the worker stops after the target pass in flight
            self.update_status()

    def action_toggle_speculation(self) -> None:
        if self.chat is not None:
            self.chat.toggle_speculation()
            self.settings_changed()

    def action_cycle_drafter(self) -> None:
        if self.chat is not None:
            self.chat.cycle_drafter()
            self.settings_changed()

    def action_cycle_temperature(self) -> None:
        if self.chat is not None:
            self.chat.cycle_temperature()
            self.settings_changed()

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        for view in self.query(ReplyView):
            view.set_highlight(self.highlight)
        self.query_one(Legend).show(self.highlight)

    async def action_quit(self) -> None:
        if self.chat is not None:
            self.chat.stop.set()   # the reply thread ends after one pass; exiting waits for it
        self.exit()

    # ---- helpers -------------------------------------------------------------------------------
    def settings_changed(self) -> None:
        if self.busy:
            self.notify("applies from the next reply", timeout=2)
        self.update_status()
        self.refresh_panel()

    def end_turn(self) -> None:
        self.busy = False
        self.reply_view = None
        self.update_status()
        self.refresh_panel()
        if self._pending_reset:
            self.reset_conversation()

    def reset_conversation(self) -> None:
        if self.busy:
            self._pending_reset = True   # finish after the reply thread has stopped
            self.action_stop()
            return
        self._pending_reset = False
        self.chat.reset()
        self.query_one("#conversation").remove_children()
        self.add_notice("conversation cleared")

    def add_row(self, widget) -> None:
        self.query_one("#conversation", VerticalScroll).mount(widget)

    def add_notice(self, text: str, kind: str = "info") -> None:
        self.add_row(NoticeLine(text, kind))

    def assistant_label(self) -> str:
        name = (self.session.target.meta("general.name") or "model") if self.session else "model"
        return name.split()[0].split("-")[0].lower()[:6]

    def settings(self) -> dict:
        chat = self.chat
        drafter = chat.drafter_kind
        label = drafter
        if drafter in ("model", "auto") and self.session.draft is not None:
            label = f"{drafter} {short_name(self.session.draft.path).rsplit('.', 1)[-1]}"
        return {"drafter": drafter, "drafter_label": label, "k": chat.k,
                "temperature": chat.sampling.temperature}

    def update_status(self) -> None:
        if self.chat is None:
            return
        state = "stopping…" if self.busy and self.chat.stop.is_set() else "replying…" if self.busy else "ready"
        s = self.settings()
        k = "auto" if s["k"] is None else s["k"]
        self.status_line.update(f"T {s['temperature']:g} · {s['drafter']} · k {k} · {state}")

    def refresh_panel(self) -> None:
        if self.chat is None:   # loading (or failed): the labels with "—", so the layout never jumps
            settings = {"drafter": "—", "drafter_label": "—", "k": None,
                        "temperature": self.options["sampling"].temperature}
            self.spec_panel.show(LiveStats().view(), settings)
            return
        self.spec_panel.show(self.chat.live.view(), self.settings())
        self.update_status()
