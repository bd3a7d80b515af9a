"""The ``localspec serve`` command; localspec.cli.app calls register(app). The server is localspec.serve.app."""

from __future__ import annotations

from typing import List, Optional

import typer

from . import options as o

PARALLEL_DEFAULT = 4   # measured on a 2-core CPU: docs/performance.md#concurrent-requests-2026-12-02
MAX_PARALLEL = 32      # slots × tree branches must stay within llama.cpp's sequences (256)


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to ``app``."""

    @app.command("serve")
    @o.with_options(o.models_for("serve"), o.SAMPLING)
    def serve_command(
        host: str = typer.Option(
            "127.0.0.1", "--host", help="Address to listen on (default 127.0.0.1, loopback only)."),
        port: int = typer.Option(8080, "--port", help="Port to listen on, 0 = any free port (default 8080)."),
        api_key: Optional[str] = typer.Option(
            None, "--api-key", envvar="LOCALSPEC_API_KEY",
            help="Require 'Authorization: Bearer KEY' (except on /health)."),
        parallel: int = typer.Option(
            PARALLEL_DEFAULT, "--parallel", "-np",
            help=f"Generations run at once, their decodes batched together (each keeps the full --n-ctx; "
                 f"the KV cache grows N times); more requests wait in the queue (default {PARALLEL_DEFAULT})."),
        max_queue: int = typer.Option(
            16, "--max-queue", help="Requests that may wait while all slots generate; more get 503 (default 16)."),
        cors_origin: Optional[List[str]] = typer.Option(
            None, "--cors-origin",
            help="Allow browser requests from this origin, '*' = any; repeatable (default: no CORS)."),
        no_prefix_share: bool = typer.Option(
            False, "--no-prefix-share",
            help="Start every request from an empty KV cache: slower for chats that resend their history, but "
                 "no client can learn (from cached_tokens or the prefill time) what another's prompt began with."),
        max_tokens: int = typer.Option(256, "--max-tokens", help="Default max_tokens of a request (default 256)."),
        options: dict = None,
        k: o.DraftTokens = None,
        tree: o.Tree = o.TREE_DEFAULT,
        no_warm_start: o.NoWarmStart = False,
    ) -> None:
        """Serve the model pair over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions)."""
        from dataclasses import replace

        from localspec.config import ConfigError, DecodeConfig
        from localspec.decoding.stats import tree_label
        from localspec.engine import EngineError

        try:
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as e:
            o.fail(f"localspec serve needs {e.name}: pip install 'localspec[serve]'")
        from localspec.serve import app as serve, http as serve_http
        from localspec.serve.api import Defaults
        from localspec.loading.session import Session

        session = sock = None
        try:
            if not 0 <= port <= 65535:
                raise ConfigError(f"--port must be between 0 and 65535, got {port}")
            if not 1 <= parallel <= MAX_PARALLEL:
                raise ConfigError(f"--parallel must be between 1 and {MAX_PARALLEL}, got {parallel}")
            if max_queue < 0:
                raise ConfigError(f"--max-queue must be >= 0, got {max_queue}")
            if api_key is not None and not api_key.strip():
                raise ConfigError("--api-key must not be empty")
            opts = o.resolve(options, k=k, tree=tree)
            DecodeConfig(max_tokens=max_tokens, k=opts.k)   # validates --max-tokens and -k now
            # One core for the event loop (o.RESERVE), as chat leaves one to its screen.
            opts = replace(opts, load=replace(opts.load, reserve_cores=o.RESERVE["serve"][0], parallel=parallel))
            seed = options["seed"] if options["seed"] is not None and options["seed"] >= 0 else None
            defaults = Defaults(opts.sampling, max_tokens=max_tokens, k=opts.k, seed=seed, tree=opts.tree)
            try:
                sock = serve_http.listen(host, port)
            except OSError as e:
                raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
            notice = lambda m: typer.echo(m, err=True)  # noqa: E731
            session = Session.load(opts.load, notice)
            server = serve.Server(session, defaults, api_key=api_key, max_queue=max_queue,
                                  cors_origins=tuple(cors_origin or ()), warm_start=not no_warm_start,
                                  prefix_share=not no_prefix_share, log=notice, parallel=parallel)
            bound_host, bound_port = sock.getsockname()[:2]
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            typer.echo(f"localspec serve: http://{shown}:{bound_port}/v1 · model {server.model_id} · "
                       f"drafter {session.drafter_kind} · k {'auto' if opts.k is None else opts.k} · "
                       f"tree {tree_label(opts.tree)} · slots {parallel} · "
                       f"threads {session.target.n_threads} · Ctrl-C stops", err=True)
            serve_http.run(server, sock)
        except (ConfigError, EngineError) as e:
            o.fail(e)
        finally:
            if sock is not None:
                sock.close()
            if session is not None:
                session.close()
