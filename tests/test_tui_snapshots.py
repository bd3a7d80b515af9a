"""Snapshot tests of the chat screen (pytest-textual-snapshot): the SVG of the screen compared with
the accepted one in tests/__snapshots__/, at 80×24 and 200×50, while a reply with a fenced Python
block is streaming and after it has finished.

Everything on screen is fixed: the scripted chat's tokens and step timings (so α, tokens/s and the
note under the reply), a model pair of fixed names, and a message box that does not blink. After
a deliberate change of the screen: `pytest tests/test_tui_snapshots.py --snapshot-update`, and look
at the new SVGs (the HTML report of a failed run shows old and new side by side).

`python -m tests.test_tui_snapshots` writes docs/chat.svg, the README's screenshot, the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("pytest_textual_snapshot")

from tests.test_tui_support import mid_reply, ready, scripted_app, send, wait_for  # noqa: E402

PROMPT = "Write a Python function that adds two numbers."
GATE = 14   # chunks of the reply shown before it pauses: inside the code block (of 23)


async def steady(pilot) -> None:
    app = pilot.app
    app.prompt_box.cursor_blink = False
    app.refresh_panel()   # the panel as of now, not as of the last 4 Hz tick
    conversation = app.query_one("#conversation")
    await pilot.pause()
    # scrolled to the end (the conversation follows its end; the scroll lands a frame or two later)
    await wait_for(pilot, lambda: conversation.max_scroll_y == 0 or conversation.scroll_y == conversation.max_scroll_y)
    # Textual now and then leaves the scrollbar drawn as of a frame before the last scroll
    conversation.vertical_scrollbar.refresh()
    await pilot.pause()


async def streaming(pilot) -> None:
    await ready(pilot)
    await mid_reply(pilot, PROMPT)
    await steady(pilot)


async def finished(pilot) -> None:
    await ready(pilot)
    await send(pilot, PROMPT)
    await steady(pilot)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_while_a_reply_streams(snap_compare, size):
    # The scripted reply waits at GATE until the app stops it, as the screenshot's end does.
    assert snap_compare(scripted_app(gate_after=GATE), terminal_size=size, run_before=streaming)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_after_a_reply(snap_compare, size):
    assert snap_compare(scripted_app(), terminal_size=size, run_before=finished)


def write_docs_screenshot(path: Path, size=(110, 34)) -> None:
    import asyncio

    async def shoot() -> None:
        app = scripted_app()
        async with app.run_test(size=size) as pilot:
            await finished(pilot)
            app.save_screenshot(filename=path.name, path=str(path.parent))

    asyncio.run(shoot())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "docs" / "chat.svg"
    write_docs_screenshot(target)
    print(f"wrote {target} ({target.stat().st_size} bytes)")
