"""A TCP proxy that adds a fixed one-way delay, so LAN and Wi-Fi latencies to an RPC worker can be
measured on one machine.

    python tools/latency_proxy.py --listen 127.0.0.1:50053 --to 127.0.0.1:50052 --delay-ms 5

Each chunk the proxy reads is written on `delay` seconds after it arrived, in each direction, as on
a link whose one-way latency is `delay`: a round trip costs 2 × delay, and bytes keep streaming
(a chunk never waits for the previous one's delay to end, only for its own). Bandwidth is not
limited. Clients connect to --listen and are passed to --to, each over a connection of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk delivered `delay` seconds after it was read."""
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            if chunk is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            chunk = await reader.read(1 << 20)
            queue.put_nowait((time.monotonic() + delay, chunk or None))
            if not chunk:
                break
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the other side may be gone already
            pass


async def serve(listen: tuple[str, int], to: tuple[str, int], delay: float,
                ready: asyncio.Future | None = None) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*to)
        except OSError:
            writer.close()
            return
        for sock in (writer.get_extra_info("socket"), up_writer.get_extra_info("socket")):
            if sock is not None:   # small messages go out at once: the delay is the only latency
                import socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay))

    server = await asyncio.start_server(client, *listen)
    if ready is not None:
        ready.set_result(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:50053", help="HOST:PORT to accept clients on (port 0: any)")
    ap.add_argument("--to", default="127.0.0.1:50052", help="HOST:PORT of the worker")
    ap.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay added in each direction")
    args = ap.parse_args(argv)
    if args.delay_ms < 0:
        ap.error("--delay-ms must be >= 0")

    async def run() -> None:
        ready = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(_endpoint(args.listen), _endpoint(args.to), args.delay_ms / 1000, ready))
        port = await ready
        print(f"latency proxy: {_endpoint(args.listen)[0]}:{port} -> {args.to}, +{args.delay_ms:g} ms each way",
              file=sys.stderr, flush=True)
        await task

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
