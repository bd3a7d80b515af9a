"""The ``localspec worker`` command: this machine's devices as a llama.cpp RPC worker, which
`--rpc HOST:PORT` on another machine (or process) puts a target's layers on. localspec.cli.app
calls register(app)."""

from __future__ import annotations

import ipaddress
import os
from typing import List, Optional

import typer

from localspec import machine
from . import options as o

PORT_DEFAULT = 50052   # llama.cpp's rpc-server default


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command to ``app``."""

    @app.command("worker")
    def worker_command(
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (default 127.0.0.1, loopback only)."),
        port: int = typer.Option(PORT_DEFAULT, "--port", help=f"Port to listen on (default {PORT_DEFAULT})."),
        threads: Optional[int] = typer.Option(
            None, "--threads", help=f"CPU threads for a CPU device (default: {o.threads_default('worker')} here; "
                                    "fewer while other work keeps cores busy when it starts)."),
        device: Optional[List[str]] = typer.Option(
            None, "--device", help="Device to serve, by ggml's name: CUDA0, Vulkan0, CPU…; repeatable or "
                                   "comma-separated (default: every local GPU, else the CPU)."),
        cache_dir: Optional[str] = typer.Option(
            None, "--cache-dir", help="Keep large tensors here by hash, so a client that loads the same model again "
                                      "sends only hashes (default: no cache)."),
    ) -> None:
        """Serve this machine's devices as a llama.cpp RPC worker (the same protocol as rpc-server).

        The RPC protocol has no authentication: whoever reaches the port can use the devices and run
        any computation on them. Listen on loopback, or on a network you trust."""
        from localspec.engine import EngineError, rpc

        if not 0 < port < 65536:
            o.fail(f"--port must be between 1 and 65535, got {port}")
        if threads is not None and threads < 1:
            o.fail(f"--threads must be >= 1, got {threads}")
        names = tuple(n.strip() for d in device or () for n in d.split(",") if n.strip())
        try:
            if not rpc.supported():
                o.fail(rpc.REBUILD)
            devices = rpc.worker_devices(names)
            if cache_dir:
                os.makedirs(cache_dir, exist_ok=True)
            plan = fit_threads(threads)
            thread = rpc.serve(host, port, plan.threads, devices, cache_dir)
        except (EngineError, OSError) as e:
            o.fail(e)
        # From here a Ctrl-C must end the process at once, wherever it lands: llama.cpp's accept loop
        # never returns, so an interpreter exiting normally would wait for its thread for ever.
        try:
            served = ", ".join(f"{d['name']} ({d['description']})" for d in map(rpc.describe, devices))
            typer.echo(f"localspec worker: serving {served} on {host}:{port}; use it with --rpc {host}:{port}",
                       err=True)
            typer.echo(f"localspec worker: {threads_line(plan)}", err=True)
            if not _loopback(host):
                typer.echo("localspec worker: warning: the RPC protocol has no authentication; anyone who reaches "
                           f"{host}:{port} can use these devices. Run it only on a network you trust.", err=True)
            while thread.is_alive():
                thread.join(0.5)
        except KeyboardInterrupt:
            typer.echo("localspec worker: stopped", err=True)
            os._exit(130)   # as any Ctrl-C; llama.cpp's accept loop never returns, its thread cannot be joined
        o.fail(f"the worker on {host}:{port} stopped (see llama.cpp's message above)")


def fit_threads(requested: int | None):
    """The CPU threads to serve with: --threads as given, else what `generate` would take now (the
    one rule, machine.choose_threads, over the cores other work keeps busy): every core regardless
    ran at 0.8 tokens/s over RPC beside work taking ~1 of 2 cores, 23 with one thread."""
    return machine.choose_threads(requested, 0, machine.other_now())


def threads_line(plan) -> str:
    other = "" if plan.other_cores is None else f"; other work keeps ~{plan.other_cores:.1f} of {plan.cpus} cores busy"
    why = "as --threads asks" if plan.requested is not None else "fitted at start"
    return f"{plan.threads} CPU thread{'' if plan.threads == 1 else 's'} ({why}{other})" + (
        f"; warning: {plan.warning}" if plan.warning else "")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
