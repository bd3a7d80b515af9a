"""`localspec` command line: generate, plus commands registered by other modules and by `tui`."""

from __future__ import annotations

import importlib
import io
import json
import os
import sys
from importlib.metadata import entry_points
from typing import List, Optional

import typer
from typer.core import TyperGroup

from . import crash, options as o
from .help_style import plain_help
from .options import Resolved, fail
from .constraint_options import DraftMask
from localspec.config import ConfigError, DecodeConfig
from localspec.loading.defaults import MAX_PROMPT_BYTES, read_capped


class _ReaderGone(Exception):
    """The reader of stdout left (`| head -c 10`): the run ends quietly, with exit code 0."""


class _Group(TyperGroup):
    """The root command: a BrokenPipeError from any command becomes `_ReaderGone` here, inside
    Click's main, whose own handler would otherwise turn it into exit code 1. Its help and that of
    every command under it show one style of placeholder and of default (`help_style.plain_help`)."""

    def __init__(self, **attrs):
        super().__init__(**attrs)
        plain_help(self)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _ReaderGone() from None


app = typer.Typer(
    name="localspec",
    help="Exact speculative decoding for local LLMs on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Group,
)


def read_prompt(prompt: str) -> str:
    """The prompt from argv, or from stdin for '-'. Only an empty one is refused: whitespace is text
    a raw model can continue, on either path (and on the server)."""
    if prompt == "-":
        try:
            text = read_capped(sys.stdin.buffer, MAX_PROMPT_BYTES, "the prompt on stdin").decode("utf-8")
        except UnicodeDecodeError as e:
            fail(f"the prompt on stdin is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})")
        except ConfigError as e:
            fail(e)
        if not text:
            fail("empty prompt on stdin")
        return text
    if not prompt:
        fail("empty prompt")
    return o.utf8(prompt, "the prompt")


@app.command()
@o.with_options(o.MODELS, o.SAMPLING)
def generate(
    prompt: str = typer.Argument(..., help="The prompt; '-' reads it from stdin."),
    max_tokens: int = o.max_tokens(256),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt (chat mode)."),
    stop: Optional[List[str]] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    chat: o.ChatTemplate = True,
    special: bool = typer.Option(
        True, "--special/--no-special",
        help="With --raw: read special-token text such as <|im_start|> as those tokens, as llama.cpp "
             "does, or as plain text (default --special)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    options: dict = None,
    k: o.DraftTokens = None,
    tree: o.Tree = o.TREE_DEFAULT,
    no_warm_start: o.NoWarmStart = False,
    draft_mask: DraftMask = True,
) -> None:
    """Generate text with speculative decoding; the output is distributed exactly as the target's."""
    from localspec.engine import EngineError

    if not special and chat:
        fail("--no-special applies to raw prompts: add --raw (a chat template's own tokens are always special)")
    text = read_prompt(prompt)
    system = None if system is None else o.utf8(system, "--system")
    stop = [o.utf8(s, "--stop") for s in stop or ()]
    try:
        opts = o.resolve(options, k=k, tree=tree)
        decode = DecodeConfig(max_tokens=max_tokens, k=opts.k, stop=tuple(stop), tree=opts.tree,
                              mask_draft=draft_mask)
        _generate(text, opts, decode, chat, system, as_json, warm=not no_warm_start, special=special)
    except (ConfigError, EngineError) as e:
        fail(e)


def _generate(text, opts: Resolved, decode: DecodeConfig, chat: bool, system, as_json: bool,
              warm: bool = True, special: bool = True) -> None:
    from localspec.loading.session import Session

    session = Session.load(opts.load)
    try:   # closed on every way out: an error, Ctrl-C, a reader that left (`| head`)
        result = _run(session, text, opts, decode, chat, system, as_json, warm, special)
    finally:
        session.close()
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False))
        return
    sys.stdout.write("\n")
    typer.echo(summary_line(result), err=True)


def _run(session, text, opts: Resolved, decode: DecodeConfig, chat: bool, system, as_json: bool,
         warm: bool, special: bool) -> dict:
    import time

    from localspec import machine
    from localspec.loading import controllers, warmstart
    from localspec.decoding.stats import RunStats
    from localspec.decoding.stream import stream_text

    target = session.target
    chat = session.chat_or_raw(chat, lambda m: typer.echo(m, err=True))
    tokens = session.prompt_tokens(text, chat, system, special)
    session.check_fits(tokens)
    drafter = session.make_drafter()
    temperature = opts.sampling.temperature
    controller, warmed = controllers.make(session, drafter, temperature, decode.k, decode.k_max, warm)
    stats = RunStats()
    pieces: list[str] = []
    out_tokens: list[int] = []
    start = time.perf_counter()
    cpus_before = machine.sample()   # did llama.cpp's threads get their cores during the run?
    first_step_at = None
    stop_string = False
    for chunk in stream_text(target, drafter, tokens, opts.sampling, decode, controller):
        if first_step_at is None:
            first_step_at = time.perf_counter() - start - chunk.step.t_draft - chunk.step.t_verify - chunk.step.t_python
        stats.add(chunk.step)
        stop_string = stop_string or chunk.stopped
        out_tokens.extend(chunk.tokens)
        pieces.append(chunk.text)
        if not as_json and chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    result = {
        "text": "".join(pieces),
        "tokens": out_tokens,
        **stats.summary(),
        "prefill_seconds": first_step_at,
        "stop_string": stop_string,
        "n_prompt_tokens": len(tokens),
        "acceptance_by_position": stats.acceptance_by_position(),
        "drafter": session.drafter_kind,
        "step_drafters": stats.sources,
        "k": "auto" if decode.k is None else decode.k,
        "tree": stats.tree(decode.tree),
        **opts.sampling.record(),
        "target": str(target.path),
        "draft": str(session.draft.path) if session.draft else None,
        "warm_start": warmed,
        "threads": target.n_threads,
        "thread_choice": session.threads.as_dict() if session.threads else None,
    }
    run = machine.usage(cpus_before)
    result["machine"] = run.as_dict(target.n_threads) | {"busy": machine.loaded(run, target.n_threads)}
    if warm and drafter is not None:
        warmstart.save(controller, session, drafter.name, temperature, run=run)
    return result


ENDED = {"length": "--max-tokens reached", "context": "context full"}
"""How the summary line says why generation ended, by the decoder's finish (besides "stop")."""


def ended(r: dict) -> str:
    """Why the run of result `r` ended. The decoder's "stop" is a --stop string (the stream saw it)
    or the end of text, which under a grammar it allows only once the grammar is complete."""
    finish = r.get("finish")
    if finish != "stop":
        return ENDED.get(finish, str(finish))
    if r.get("stop_string"):
        return "stop string"
    return "grammar complete" if r.get("grammar") else "end of text"


def summary_line(r: dict) -> str:
    # α (accepted / tested positions) is what E(α, k) uses; draft efficiency (accepted / drafted)
    # is lower because positions after a rejection are drafted but never tested.
    alpha = "—" if r["alpha"] is None else f"{r['alpha']:.3f}"
    eff = "—" if r["draft_efficiency"] is None else f"{r['draft_efficiency']:.3f}"
    tps = r["tokens_per_second"] or 0.0
    drafter = r["drafter"]
    if len(r.get("drafters") or {}) > 1:   # say who served the steps when more than one did
        drafter += " (" + ", ".join(f"{name} {d['share']:.0%}" for name, d in r["drafters"].items()) + " of steps)"
    tree = r["tree"]   # the steps that verified a tree, when any did
    trees = f" ({tree['tree_steps']} of {r['n_steps']} steps)" if tree["tree_steps"] else ""
    return (
        f"α {alpha} · draft efficiency {eff} · {r['tokens_per_pass'] or 0:.2f} tokens/target pass · "
        f"{tps:.1f} tokens/s · {r['n_steps']} steps · {r['n_tokens']} tokens ({ended(r)}) · "
        f"drafter {drafter} · k {r['k']} · "
        f"tree {tree['setting']}{trees}"
    )


def _register_commands() -> None:
    from . import (bench as cli_bench, doctor as cli_doctor, history as cli_history, presets as cli_presets,
                   serve as cli_serve, worker as cli_worker)

    for module in (cli_presets, cli_bench, cli_doctor, cli_serve, cli_worker, cli_history):
        module.register(app)
    # Commands from other packages (the terminal UI registers `chat`) arrive through entry points,
    # so this package never imports them directly.
    for ep in entry_points(group="localspec.commands"):
        try:
            register = ep.load()
        except ImportError as e:   # its package is broken or gone: every other command still runs
            _unavailable(ep.name, e)
            continue
        register(app)


def _unavailable(name: str, why: ImportError) -> None:
    """A command whose package cannot be imported: running it is one line saying why."""
    @app.command(name, hidden=True, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def command() -> None:
        fail(f"`localspec {name}` cannot start: {why} (reinstall localspec: pip install localspec)")


_register_commands()


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from localspec.engine import library_version

        try:
            mine = version("localspec")
        except PackageNotFoundError:  # run from a checkout that was never installed
            from localspec import __version__ as mine
        typer.echo(f"localspec {mine} (llama-cpp-python {library_version()})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print localspec's version and exit."),
) -> None:
    """Exact speculative decoding for local LLMs on llama.cpp."""


def main() -> None:
    """The entry point: every way a run can end becomes an exit code and at most one line."""
    from localspec.config import ConfigError
    from localspec.engine.files import EngineError
    from localspec.engine.gguf import GGUFFormatError
    from localspec.decoding.constrain import NothingAllowed
    from localspec.decoding.sampling import BadLogits

    _stand_in_for_closed_streams()
    crash.install()   # a fault in llama.cpp prints the Python stack and how to report it
    usage, aborts, no_args = _click_exceptions()
    try:
        code = app(standalone_mode=False)
    except SystemExit as e:  # Typer's own exits
        code = e.code
    except (KeyboardInterrupt, *aborts):
        code = 130
    except no_args as e:
        typer.echo(e.ctx.get_help())
        code = 0
    except usage as e:
        # Click's usage errors come as a box of several lines; the promise is one line.
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        code = _error(f"{e.format_message()}{hint}")
    except (ConfigError, EngineError, GGUFFormatError, BadLogits, NothingAllowed) as e:
        code = _error(e)
    except (BrokenPipeError, _ReaderGone):
        code = 0  # the reader (`| head`) has what it wanted
    except OSError as e:
        code = _error(f"{e.strerror or e}: {e.filename}" if e.filename else e)
    except Exception as e:
        if os.environ.get("LOCALSPEC_VERBOSE"):
            raise
        code = _error(f"internal error ({type(e).__name__}: {e}); rerun with LOCALSPEC_VERBOSE=1 for "
                      "the traceback, and please report it", 1)
    if code == 130:
        typer.echo("\ninterrupted", err=True)
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # else Python reports it again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(code or 0)


class _Closed(io.TextIOBase):
    """Stands in for a standard stream that was closed when localspec started (`<&-`, `>&-`):
    reading or writing it is one `error:` line. Its descriptor holds /dev/null meanwhile, so that
    no file opened later gets its number (and llama.cpp's prints would land in a model file)."""

    encoding, errors = "utf-8", "strict"

    def __init__(self, fd: int, name: str):
        super().__init__()
        self._fd, self._name = fd, name

    def _refuse(self) -> ConfigError:
        how = "from a file or /dev/null" if self._fd == 0 else "to a file, or to /dev/null to discard it"
        return ConfigError(f"standard {self._name} is closed; redirect it {how}")

    def read(self, *_) -> str:
        raise self._refuse()

    readline = read

    def write(self, text) -> int:
        if text:   # Click probes streams with an empty write
            raise self._refuse()
        return 0

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    @property
    def buffer(self) -> "_Closed":
        return self


def _stand_in_for_closed_streams() -> None:
    """Python sets sys.stdin/stdout/stderr to None when their descriptor was closed at start."""
    for fd, attr, name in ((0, "stdin", "input"), (1, "stdout", "output"), (2, "stderr", "error")):
        if getattr(sys, attr) is None:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            # Nothing can show errors when stderr is closed: they go to /dev/null, the exit code stays.
            setattr(sys, attr, open(fd, "w", closefd=False) if fd == 2 else _Closed(fd, name))


def _click_exceptions() -> tuple[tuple, tuple, tuple]:
    """(usage errors, aborts, "no arguments, show help") of Click: recent Typer vendors its own copy
    as typer._click, older ones use the click package."""
    modules = []
    for name in ("typer._click", "click"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            pass
    pick = lambda attr: tuple(getattr(m.exceptions, attr) for m in modules if hasattr(m.exceptions, attr))  # noqa: E731
    return pick("ClickException"), (typer.Abort, *pick("Abort")), pick("NoArgsIsHelpError")


def _error(message: object, code: int = 2) -> int:
    o.error_line(message)
    return code
