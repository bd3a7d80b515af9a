"""Widgets of the chat screen: the speculation panel, message rows, notices, the legend.
(A reply's own view is `tui.reply`, the message box `tui.prompt`.)"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline, Static

from .reply import DRAFT_STYLE, LOOKUP_STYLE

BARS = "▁▂▃▄▅▆▇█"
LABEL_WIDTH = 13


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def short_name(path) -> str:
    return Path(str(path)).name.removesuffix(".gguf") if path else "—"


def speaker(target) -> str:
    """The label of a reply by the model in file `target` (None: unknown): the first word of its
    name, e.g. "smollm" for SmolLM2-135M-Instruct.F32.gguf. One rule for a reply written now and
    one read back from the history (whose stats record the target's path)."""
    name = short_name(target) if target else ""
    return name.split("-")[0].split("_")[0].split(".")[0].lower()[:6] or "model"


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


def fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def bars(rates: list[float], limit: int = 12) -> str:
    """Acceptance rates 0..1 as bars on an absolute scale (a Sparkline would rescale to min..max,
    making 0.97 vs 1.0 look like a collapse)."""
    return "".join(BARS[min(len(BARS) - 1, int(r * (len(BARS) - 1) + 0.5))] for r in rates[:limit]) or "—"


def k_label(view: dict, settings: dict) -> str:
    if settings["drafter"] == "none":
        return "0 (off)"
    mode = "auto" if settings["k"] is None else "fixed"
    source = view.get("source_now")
    by = f" {source}" if source and settings["drafter"] == "auto" else ""
    return f"{'—' if view['k_now'] is None else view['k_now']} ({mode}){by}"


def tree_row(view: dict) -> list[tuple[str, str]]:
    """("tree steps", "3/20"): the steps that verified a draft tree, of all steps, with a mark when
    the last one did; no row before a step verified one (chains only look as they always did)."""
    trees = view.get("tree_steps") or 0
    if not trees:
        return []
    return [("tree steps", f"{trees}/{view['n_steps']}" + (" ◆" if view.get("tree_now") else ""))]


def panel_rows(view: dict, settings: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(rows above the sparkline, rows below it) as (label, value)."""
    above = [
        ("drafter", settings["drafter_label"]),
        ("α (all)", fmt(view["alpha_all"], ".3f")),
        ("α (last 32)", fmt(view["alpha_recent"], ".3f")),
    ]
    below = [
        ("k now", k_label(view, settings)),
        ("steps by", view.get("served") or "—"),
        *tree_row(view),
        ("tokens/pass", fmt(view["tokens_per_pass"])),
        # decode only (no prefill), over the last 32 passes; the note under a reply has both kinds
        ("decode tok/s", fmt(view["tps"], ".1f")),
        ("plain tok/s", fmt(view["plain_tps"], ".1f")),
        ("speedup", fmt(view["speedup"], ".2f", "×")),
        ("drafted", str(view["drafted"])),
        ("accepted", str(view["accepted"])),
        # accepted / drafted: below α, since positions after a rejection are drafted, never tested
        ("draft eff.", fmt(view["draft_efficiency"], ".3f")),
        ("by position", bars(view["by_position"])),
        ("temperature", f"{settings['temperature']:g}"),
    ]
    return above, below


def table(rows: list[tuple[str, str]]) -> Text:
    text = Text()
    for i, (label, value) in enumerate(rows):
        text.append(f"{label:<{LABEL_WIDTH}}", style="dim")
        text.append(value, style="bold")
        if i < len(rows) - 1:
            text.append("\n")
    return text


def compact(view: dict, settings: dict) -> Text:
    """Two lines for narrow terminals; α, k and tokens/s come first so they are never the part cut."""
    text = Text()
    for label, value in (
        ("α", fmt(view["alpha_all"])), ("α32", fmt(view["alpha_recent"])),
        ("k", k_label(view, settings)), ("decode tok/s", fmt(view["tps"], ".1f")),
        ("plain", fmt(view["plain_tps"], ".1f")), ("×", fmt(view["speedup"])),
    ):
        text.append(f"{label} ", style="dim")
        text.append(f"{value}  ", style="bold")
    text.append("\n")
    for label, value in (
        ("tok/pass", fmt(view["tokens_per_pass"])), ("drafted", str(view["drafted"])),
        ("accepted", str(view["accepted"])), ("eff", fmt(view["draft_efficiency"])),
        ("by pos", bars(view["by_position"], 8)),
        ("drafter", settings["drafter"]),
        ("steps", view.get("served") or "—"),
        *(("tree", value) for _, value in tree_row(view)),
    ):
        text.append(f"{label} ", style="dim")
        text.append(f"{value}  ", style="bold")
    return text


class SpecPanel(Vertical):
    """Speculation numbers. Refreshed by the app's timer, never per token. Two forms: a table at
    the right of wide screens, two lines under the conversation on narrow ones (CSS picks)."""

    DEFAULT_CSS = """
    SpecPanel { height: auto; border: round $primary 60%; border-title-color: $text-muted; padding: 0 1; }
    SpecPanel #spark-row { height: 1; }
    SpecPanel #spark-label { width: 14; color: $text-muted; }
    SpecPanel Sparkline { width: 1fr; }
    SpecPanel #spec-compact { display: none; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # Held directly (not queried) so a timer tick during mount or shutdown finds them.
        self.above = Static(id="spec-above")
        self.below = Static(id="spec-below")
        self.compact = Static(id="spec-compact")
        self.spark = Sparkline([], id="spark")

    def compose(self) -> ComposeResult:
        yield self.above
        with Horizontal(id="spark-row"):
            yield Label("recent passes", id="spark-label")
            yield self.spark
        yield self.below
        yield self.compact

    def on_mount(self) -> None:
        self.border_title = "speculation"

    def show(self, view: dict, settings: dict) -> None:
        above, below = panel_rows(view, settings)
        self.above.update(table(above))
        self.below.update(table(below))
        self.compact.update(compact(view, settings))
        if self.spark.data != view["spark"]:
            self.spark.data = view["spark"]


class MessageRow(Horizontal):
    """A speaker label and the message: beside it on wide screens, above it on narrow ones, where
    a 7-column gutter would cost a tenth of the width on every line."""

    DEFAULT_CSS = """
    MessageRow { height: auto; margin-bottom: 1; }
    MessageRow > .who { width: 7; color: $text-muted; text-style: bold; }
    MessageRow > .who-user { color: $success; }
    MessageRow > .body { width: 1fr; height: auto; }
    """   # the narrow form is in ChatApp.CSS: a widget's own CSS only sees inside the widget

    def __init__(self, who: str, body: Static, user: bool = False) -> None:
        super().__init__()
        self.who, self.body = who, body
        self.user = user

    def compose(self) -> ComposeResult:
        yield Label(self.who, classes="who who-user" if self.user else "who")
        self.body.add_class("body")
        yield self.body


class NoticeLine(Static):
    """Errors and notices in the conversation: one styled line, never a traceback."""

    DEFAULT_CSS = """
    NoticeLine { height: auto; margin-bottom: 1; color: $text-muted; text-style: italic; }
    NoticeLine.warning { color: $warning; }
    """

    def __init__(self, text: str, kind: str = "info") -> None:
        mark = "⚠ " if kind == "warning" else "· "
        super().__init__(Text(mark + text), classes=kind)
        self.text = text


class Legend(Static):
    """What the replies show now, and that F5 switches."""

    def show(self, mode: str) -> None:
        text = Text()
        if mode == "tokens":
            text.append("model draft", style=DRAFT_STYLE)
            text.append("  lookup draft", style=LOOKUP_STYLE)
            text.append("  target", style="")
            text.append("  F5 Markdown", style="dim")
        else:
            text.append("Markdown", style="")
            text.append("  F5 draft tokens", style="dim")
        self.update(text)
