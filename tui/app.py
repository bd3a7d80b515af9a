"""The `localspec chat` app: layout, keys, and the two thread workers (loading, generating).

Workers never touch widgets; they post the messages of `tui.messages`, handled here on the UI
thread. The speculation panel is redrawn by a 4 Hz timer from `Chat.live`, never per token, and a
reply by its ReplyView at most 20 times a second. The generation worker also saves its turn
(`tui.saving`). Slash commands, copying and the saved conversations are in `tui.commands`.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, Label, ProgressBar, Static

from localspec.config import SamplingConfig
from localspec.chats.conversation import Conversation
from localspec.engine import gpu_offload_supported
from localspec.chats.store import Store
from localspec.loading.session import LoadConfig, Session

from .chat import Chat, LiveStats
from .commands import Commands, as_message, reply_note
from .messages import Loaded, LoadFailed, LoadProgress, Notice, PromptReady, ReplyChunk, ReplyDone, ReplyFailed
from .prompt import ChatInput
from .reply import ReplyView
from .saving import Saver, reply_stats, settings_of
from .terminal import keep_on_loss
from .widgets import Legend, MessageRow, NoticeLine, SpecPanel, one_line, pair_label, short_name, speaker

PANEL_HZ = 4


class ChatApp(Commands, App):
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    CSS = """
    #top { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    #top-line { width: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }
    #top-right { width: auto; padding-left: 2; }
    #body { height: 1fr; }
    #conversation { width: 1fr; height: 1fr; border: round $primary 60%; border-title-color: $text-muted;
                    padding: 0 1; scrollbar-size-vertical: 1; }
    #legend-row { height: 1; padding: 0 1; }
    #legend { width: auto; }
    #status { width: 1fr; padding-left: 2; color: $text-muted; text-align: right; text-wrap: nowrap; text-overflow: ellipsis; }
    #panel { width: 38; }
    #loading { height: 3; padding: 1 1 0 1; }
    #loading ProgressBar { width: 24; }
    #loading-text { width: 1fr; color: $text-muted; }
    Screen.-narrow #body { layout: vertical; }
    Screen.-narrow #panel { width: 1fr; border: none; border-top: round $primary 60%; padding: 0 1; }
    Screen.-narrow #spec-above, Screen.-narrow #spec-below { display: none; }
    Screen.-narrow #spec-compact { display: block; }
    Screen.-narrow MessageRow { layout: vertical; }
    Screen.-narrow MessageRow > .who { width: 1fr; }
    """
    # /help is made from these (tui.commands.help_text): the tooltip says what a key does there.
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="stop the reply (/continue goes on)"),
        Binding("f2", "toggle_speculation", "Spec on/off", tooltip="speculation on/off"),
        Binding("f3", "cycle_drafter", "Drafter", tooltip="next drafter (auto, model, lookup, none)"),
        Binding("f4", "cycle_temperature", "Temp", tooltip="next temperature (0, 0.3, 0.7, 1)"),
        Binding("f5", "toggle_view", "View", tooltip="Markdown or the draft tokens"),
        Binding("ctrl+o", "conversations", "Chats", tooltip="saved conversations"),
        # Ctrl+Y is TextArea's redo and Ctrl+B tmux's prefix: copying takes R(eply) and G(rab code)
        Binding("ctrl+r", "copy_reply", "Copy reply", show=False, tooltip="copy the last reply"),
        Binding("ctrl+g", "copy_code", "Copy code", show=False, tooltip="copy the last code block"),
        Binding("ctrl+q", "quit", "Quit", priority=True, tooltip="quit"),
    ]

    def __init__(self, source: LoadConfig | Session, sampling: SamplingConfig, *, k: int | None = None,
                 max_tokens: int | None = None, system: str | None = None, warm_start: bool = True,
                 store: Store | None = None, resume: Conversation | None = None,
                 view_mode: str = "markdown", chat_factory=Chat, tree: str | tuple[int, ...] = "off") -> None:
        """`source` is a LoadConfig (loaded here, in a worker) or an already-loaded Session.
        `store`: where conversations are saved (None: not saved); `resume`: a stored conversation
        to show and continue; `chat_factory(session, **options)` makes the Chat (tests script one);
        `max_tokens`: a cap on each reply, None for none (a reply runs until the model stops or the
        context is full); `tree`: draft trees (`Chat.tree`; the models need its `n_seq`)."""
        super().__init__()
        self.source = source
        self.options = dict(sampling=sampling, k=k, max_tokens=max_tokens, system=system, warm_start=warm_start, tree=tree)
        self.chat_factory = chat_factory
        self.saver = Saver(store)
        self.resume = resume
        self.session: Session | None = None
        self.chat: Chat | None = None
        self.busy = False
        self.view_mode = view_mode
        self.turn = 0
        self.reply_view: ReplyView | None = None   # the reply being written
        self.last_reply: ReplyView | None = None   # the reply /continue extends (None: there is none)
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
        self.prompt_box = ChatInput(placeholder="Message · Enter sends · Ctrl+J newline · /help",
                                    id="prompt", disabled=True)
        yield self.prompt_box
        yield Footer(compact=True)

    def on_mount(self) -> None:
        conversation = self.query_one("#conversation", VerticalScroll)
        conversation.border_title = "conversation"
        conversation.anchor()
        self.prompt_box.display = False
        self.query_one(Legend).show(self.view_mode)
        self.set_interval(1 / PANEL_HZ, self.refresh_panel)
        self.refresh_panel()
        if self.resume is not None:   # shown while the models load
            self.show_conversation(self.resume)
        notice = self.saver.take_notice()
        if notice:   # the store could not be opened: the chat goes on, unsaved
            self.add_notice(notice, "warning")
        if self.saver.enabled:
            self.load_prompt_history()
        if isinstance(self.source, LoadConfig):
            self.load_models(self.source)
        else:
            self.post_message(Loaded(self.source))

    def on_unmount(self) -> None:
        if self.chat is not None:   # however the app ends, a reply stops after its current pass
            self.chat.stop.set()

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
    def generate(self, chat: Chat, text: str | None, turn: int) -> None:
        """Answer `text`, or (None) continue the last reply: its stored message grows."""
        continued = text is None
        try:
            prepared = chat.prepare_continue() if continued else chat.prepare(text)
        except Exception as e:
            self.post_message(ReplyFailed(turn, one_line(e), continued))
            return
        saver, sampling, k = self.saver, chat.sampling, chat.k
        user_msg = None if continued else saver.add_user(text, settings_of(chat), chat.system)
        writer = saver.continue_reply(prepared.base) if continued else saver.start_reply()
        self.post_saver_notice()
        self.post_message(PromptReady(turn, prepared.dropped, len(prepared.prompt), prepared.cached, prepared.base))

        def on_chunk(chunk) -> None:
            self.post_message(ReplyChunk(turn, chunk.pieces))
            if writer is not None:
                writer.append(chunk.text)   # written at most every few seconds (history.FLUSH_SECONDS)

        forget = keep_on_loss(writer, self)   # a lost RPC worker ends the process: the reply stays
        try:
            reply = chat.reply(prepared, on_chunk)
        except Exception as e:
            saver.reply_failed(continued, user_msg, writer)
            self.post_message(ReplyFailed(turn, one_line(e), continued))
            return
        finally:
            forget()
        # A continuation that added nothing keeps the reply's numbers (None: the stored ones stay).
        stats = reply_stats(reply, chat, sampling, k) if reply.n_tokens or not continued else None
        if writer is not None:   # stopped by Esc or by quitting: kept, marked partial
            writer.finish(stats, partial=reply.finish == "stopped")
        self.post_saver_notice()
        self.post_message(ReplyDone(turn, reply.finish, stats))

    def post_saver_notice(self) -> None:
        notice = self.saver.take_notice()
        if notice:
            self.post_message(Notice(notice, "warning"))

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
        self.chat = self.chat_factory(session, **self.options)
        if self.resume is not None:
            self.continue_conversation(self.resume)
        self.query_one("#loading").display = False
        prompt = self.prompt_box
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
        if message.base is not None and self.reply_view is not None and message.turn == self.turn:
            self.reply_view.cut(len(message.base))   # the trailing whitespace a template trims

    def on_reply_chunk(self, message: ReplyChunk) -> None:
        if self.reply_view is not None and message.turn == self.turn:
            self.reply_view.add(message.pieces)

    def on_reply_done(self, message: ReplyDone) -> None:
        self.last_done = message
        if self.reply_view is not None:
            self.reply_view.finish()
            if message.stats is not None:
                self.reply_view.set_note(reply_note(message.stats, message.finish == "stopped"))
        if message.stats is None:
            self.add_notice("nothing added: the model ends the reply there")
        elif message.finish == "length":
            self.add_notice(f"the reply reached --max-tokens {self.chat.max_tokens}; /continue goes on")
        elif message.finish == "context":
            older = "; /continue goes on, the oldest turns dropped" if len(self.chat.history) > 2 else ""
            self.add_notice(f"the context is full: /reset starts over (or restart with a larger --n-ctx){older}",
                            "warning")
        self.end_turn()

    def on_reply_failed(self, message: ReplyFailed) -> None:
        if not message.continued:   # the turn was taken back: its reply is no conversation's
            self.last_reply = None
            if self.reply_view is not None and not self.reply_view.pieces:
                self.reply_view.parent.remove()
        kept = "the reply keeps what it had" if message.continued else "this message was not kept"
        self.add_notice(f"error: {message.error} ({kept})", "warning")
        self.end_turn()

    def on_notice(self, message: Notice) -> None:
        self.add_notice(message.text, message.kind)

    def on_chat_input_submitted(self, event: ChatInput.Submitted) -> None:
        # The box is already empty (ChatInput.action_submit); a message not taken goes back into it.
        text = event.value.rstrip().lstrip("\n")   # a first line's indent is the user's
        if not text:
            return
        if self.chat is None:
            event.input.give_back(event.value)
            return
        if self.run_command(text):
            event.input.remember(text)
            return
        if self.busy:
            event.input.give_back(event.value)
            self.notify("a reply is still running; Esc stops it", timeout=3)
            return
        event.input.remember(text)
        text = as_message(text)
        self.add_row(MessageRow("you", Static(Text(text)), user=True))   # Text: no markup parsing
        self.reply_view = self.last_reply = ReplyView(self.view_mode)
        self.add_row(MessageRow(self.assistant_label(), self.reply_view))
        self.start_generating(text)

    def start_generating(self, text: str | None) -> None:
        self.turn += 1
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

    def action_toggle_view(self) -> None:
        self.view_mode = "tokens" if self.view_mode == "markdown" else "markdown"
        for view in self.query(ReplyView):
            view.set_mode(self.view_mode)
        self.query_one(Legend).show(self.view_mode)

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
        if self.reply_view is not None:   # a failed /continue gets its note back (ReplyView.continuing)
            self.reply_view.finish()
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
        self.resume = None
        self.last_reply = None
        self.saver.opened(None)   # the next message starts a new saved conversation
        if self.chat is not None:
            self.chat.reset()
            self.chat.system = self.options["system"]
        self.query_one("#conversation").remove_children()
        self.add_notice("new conversation")

    def add_row(self, widget) -> None:
        self.query_one("#conversation", VerticalScroll).mount(widget)

    def add_notice(self, text: str, kind: str = "info") -> None:
        self.add_row(NoticeLine(text, kind))

    def assistant_label(self) -> str:
        return speaker(self.session.target.path if self.session else None)

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
