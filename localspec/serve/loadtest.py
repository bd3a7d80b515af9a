"""A load test of `localspec serve` on loopback: `python -m localspec.serve.loadtest [options] [-- serve options]`.

It starts the server itself (so it knows the process whose memory it watches), then runs two
phases against /v1/chat/completions with streaming:
1. `--clients` concurrent streaming requests (the server needs `--max-queue` at least that large);
2. `--sequential` requests one after another, reading the server's resident memory after each.

It reports how many requests were answered (none may be lost), time to first token at p50 and p99,
tokens per second, and resident memory at request 100 and at the last request (flat means within
5 %). Greedy requests with a fixed max_tokens keep every run comparable.

`--versus-generate N` instead times one client against `localspec generate` with the same options
(pass the same `--threads` to both through the serve options): N rounds, interleaved, each one
request through the server and one `generate` process, and reports the ratio of decode tokens/s.
`--versus-parallel P --rounds N` times one client of a server with `--parallel P` against one of the
same server with `--parallel 1`, both running, one request to each in turn for N rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import numpy as np

try:
    import httpx
except ImportError:   # a user install without the test extra: one line, not a traceback
    if __name__ == "__main__":
        print("error: the load test needs httpx: pip install 'localspec[test]'", file=sys.stderr)
        sys.exit(2)
    raise

PROMPTS = [
    "Name three colours.",
    "Write one sentence about lighthouses.",
    "What is 12 times 12?",
    "Give me a haiku about rain.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict:
    """One streaming chat request: its status, time to first token, tokens and seconds."""
    body = {"model": "localspec", "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = None
    usage = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"status": r.status_code, "ttft": None, "tokens": 0, "seconds": time.perf_counter() - start}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                first = time.perf_counter() - start
    return {"status": 200, "ttft": first, "tokens": (usage or {}).get("completion_tokens", 0),
            "seconds": time.perf_counter() - start, "usage": usage}


async def run(url: str, clients: int, sequential: int, max_tokens: int, pid: int) -> dict:
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        start = time.perf_counter()
        burst = await asyncio.gather(*(one_request(client, PROMPTS[i % len(PROMPTS)], max_tokens)
                                       for i in range(clients)))
        burst_seconds = time.perf_counter() - start
        seq, memory = [], []
        for i in range(sequential):
            seq.append(await one_request(client, PROMPTS[i % len(PROMPTS)], max_tokens))
            memory.append(rss_bytes(pid))
    return {"burst": burst, "burst_seconds": burst_seconds, "sequential": seq, "rss": memory}


async def versus_parallel(urls: tuple[str, str], rounds: int, max_tokens: int) -> dict:
    """Decode tokens/s of one client of each server (parallel 1, parallel P), interleaved."""
    prompt = "Tell me about lighthouses and why they matter for ships at night."
    got: tuple[list, list] = ([], [])
    clients = [httpx.AsyncClient(base_url=u, timeout=httpx.Timeout(600.0)) for u in urls]
    try:
        for c in clients:
            await one_request(c, prompt, max_tokens)  # warm-up
        for r in range(rounds):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                out = await one_request(clients[i], prompt, max_tokens)
                got[i].append(out["usage"]["localspec"]["tokens_per_second"])
    finally:
        for c in clients:
            await c.aclose()
    return {"parallel_1": got[0], "parallel_n": got[1], "ratio": float(np.median(got[1]) / np.median(got[0]))}


def start_server(port: int, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_up(server: subprocess.Popen, url: str) -> bool:
    """Until /health answers (True), or the server exits (False, its stderr copied to ours)."""
    deadline = time.monotonic() + 300
    while True:
        if server.poll() is not None:
            sys.stderr.write(server.stderr.read().decode("utf-8", "replace"))
            return False
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not come up in 300 s")
        time.sleep(0.2)


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


async def versus_generate(url: str, rounds: int, max_tokens: int, serve_args: list[str]) -> dict:
    """Decode tokens/s of one client through the server and of `localspec generate`, interleaved."""
    prompt = "Tell me about lighthouses and why they matter for ships at night."
    threads = serve_args[serve_args.index("--threads") + 1] if "--threads" in serve_args else None
    gen = [sys.executable, "-m", "localspec", "generate", prompt, "--max-tokens", str(max_tokens),
           "--temperature", "0", "--json", *(["--threads", threads] if threads else [])]
    served, generated = [], []
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0)) as client:
        await one_request(client, prompt, max_tokens)  # warm-up
        for _ in range(rounds):
            r = await one_request(client, prompt, max_tokens)
            served.append(r["usage"]["localspec"]["tokens_per_second"])
            out = subprocess.run(gen, capture_output=True, text=True, check=True)
            generated.append(json.loads(out.stdout)["tokens_per_second"])
    return {"served": served, "generate": generated,
            "ratio": float(np.median(served) / np.median(generated))}


def summary(result: dict) -> dict:
    def phase(rows: list[dict]) -> dict:
        ttft = [r["ttft"] for r in rows if r["ttft"] is not None]
        return {
            "requests": len(rows),
            "answered": sum(r["status"] == 200 for r in rows),
            "ttft_p50": float(np.percentile(ttft, 50)) if ttft else None,
            "ttft_p99": float(np.percentile(ttft, 99)) if ttft else None,
            "tokens": sum(r["tokens"] for r in rows),
        }

    burst, seq = phase(result["burst"]), phase(result["sequential"])
    burst["tokens_per_second"] = burst["tokens"] / result["burst_seconds"]
    rss = result["rss"]
    if rss:
        at_100 = rss[min(99, len(rss) - 1)]
        seq["rss_at_100"], seq["rss_at_end"] = at_100, rss[-1]
        seq["rss_growth"] = rss[-1] / at_100 - 1 if at_100 else None
    return {"concurrent": burst, "sequential": seq}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        extra, argv = argv[argv.index("--") + 1:], argv[: argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--sequential", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--versus-generate", type=int, default=0, metavar="N")
    ap.add_argument("--versus-parallel", type=int, default=0, metavar="P")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.versus_parallel:
        ports = free_port(), free_port()
        servers = [start_server(p, [*extra, "--parallel", str(n)]) for p, n in zip(ports, (1, args.versus_parallel))]
        urls = tuple(f"http://127.0.0.1:{p}" for p in ports)
        try:
            if not all(wait_up(s, u) for s, u in zip(servers, urls)):
                return 2
            report = asyncio.run(versus_parallel(urls, args.rounds, args.max_tokens))
        finally:
            for s in servers:
                stop(s)
        print(json.dumps(report) if args.json else
              f"one client: --parallel {args.versus_parallel} {np.median(report['parallel_n']):.1f} vs --parallel 1 "
              f"{np.median(report['parallel_1']):.1f} tokens/s (medians of {args.rounds}): {report['ratio']:.2f}×")
        return 0
    port = free_port()
    server = start_server(port, ["--max-queue", str(max(args.clients, 16)), *extra])
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_up(server, url):
            return 2
        if args.versus_generate:
            report = asyncio.run(versus_generate(url, args.versus_generate, args.max_tokens, extra))
            print(json.dumps(report) if args.json else
                  f"served {np.median(report['served']):.1f} vs generate {np.median(report['generate']):.1f} "
                  f"tokens/s (medians of {args.versus_generate}): {report['ratio']:.2f}×")
            return 0
        result = asyncio.run(run(url, args.clients, args.sequential, args.max_tokens, server.pid))
    finally:
        stop(server)
    report = summary(result)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, p in report.items():
            line = (f"{name:<11} {p['answered']}/{p['requests']} answered · time to first token "
                    f"p50 {p['ttft_p50'] * 1000:.0f} ms, p99 {p['ttft_p99'] * 1000:.0f} ms" if p["ttft_p50"] else
                    f"{name:<11} {p['answered']}/{p['requests']} answered")
            if "tokens_per_second" in p:
                line += f" · {p['tokens_per_second']:.1f} tokens/s in all"
            if p.get("rss_at_100"):
                line += (f" · memory {p['rss_at_100'] / 1e6:.0f} MB at request 100, {p['rss_at_end'] / 1e6:.0f} MB "
                         f"at the end ({p['rss_growth']:+.1%})")
            print(line)
    lost = sum(p["requests"] - p["answered"] for p in report.values())
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
