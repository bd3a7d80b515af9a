"""A long reply's tokens/s in `localspec chat` (a real terminal: a pty) against `localspec generate`
with the same options, interleaved (issue 10: the screen must not slow generation).

    python tools/chat_speed.py [--rounds 3] [--threads 1] [--max-tokens 4000] [--prompt TEXT]

The chat's figure is its reply's tokens / seconds from the turn's start, as saved with the reply
(prefill included: a few dozen prompt tokens); generate's is tokens / (prefill + decode seconds).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import sqlite3
import struct
import subprocess
import sys
import tempfile
import termios
import time

PROMPT = "Count from 1 to 3000, one number per line, with nothing else."


def chat_once(args, history: str) -> dict:
    env = dict(os.environ, LOCALSPEC_HISTORY=history, TERM="xterm-256color")
    cmd = [sys.executable, "-m", "localspec", "chat", "--threads", str(args.threads), "--max-tokens",
           str(args.max_tokens), "--temperature", "0", "--no-warm-start"]
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(cmd[0], cmd, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", args.lines, args.columns, 0, 0))

    seen = bytearray()

    def drain(seconds: float, until: bytes | None = None) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    return
                if until is not None:
                    seen.extend(chunk)
                    if until in seen:
                        return

    # The input is disabled while the models load; the top line names the pair once they have.
    drain(120.0, until=args.ready_marker.encode())
    drain(1.0)
    os.write(fd, args.prompt.encode())
    drain(0.5)                         # Enter in the same read as the text would count as typed text
    os.write(fd, b"\r")
    stats = None
    while stats is None:
        drain(0.5)
        stats = _finished_reply(history)
    os.write(fd, b"\x11")               # Ctrl+Q
    drain(1.0)
    os.waitpid(pid, 0)
    return stats


def _finished_reply(history: str) -> dict | None:
    if not os.path.exists(history):
        return None
    with sqlite3.connect(history) as db:
        row = db.execute("SELECT stats FROM messages WHERE role = 'assistant' AND partial = 0 "
                         "AND stats IS NOT NULL ORDER BY id DESC LIMIT 1").fetchone()
    return json.loads(row[0]) if row else None


def generate_once(args) -> dict:
    out = subprocess.run([sys.executable, "-m", "localspec", "generate", "--threads", str(args.threads),
                          "--max-tokens", str(args.max_tokens), "--temperature", "0", "--no-warm-start",
                          "--json", args.prompt], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    return {"n_tokens": r["n_tokens"],
            "tokens_per_second": r["n_tokens"] / (r["prefill_seconds"] + r["seconds"]),
            "decode_tokens_per_second": r["tokens_per_second"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--columns", type=int, default=120)
    p.add_argument("--lines", type=int, default=40)
    p.add_argument("--ready-marker", default="· ready", help="Text the screen shows once the models are loaded.")
    args = p.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("chat", "generate") if r % 2 == 0 else ("generate", "chat")
            got = {}
            for what in order:
                got[what] = (chat_once(args, os.path.join(tmp, f"h{r}.sqlite3")) if what == "chat"
                             else generate_once(args))
            ratio = got["chat"]["tokens_per_second"] / got["generate"]["tokens_per_second"]
            ratios.append(ratio)
            print(f"round {r + 1}: chat {got['chat']['n_tokens']} tokens {got['chat']['tokens_per_second']:.1f} t/s · "
                  f"generate {got['generate']['n_tokens']} tokens {got['generate']['tokens_per_second']:.1f} t/s "
                  f"(decode only {got['generate']['decode_tokens_per_second']:.1f}) · chat/generate {ratio:.3f}",
                  flush=True)
    ratios.sort()
    print(f"median chat/generate {ratios[len(ratios) // 2]:.3f} over {len(ratios)} rounds "
          f"(--threads {args.threads}, --max-tokens {args.max_tokens})")


if __name__ == "__main__":
    main()
