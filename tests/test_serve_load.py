"""The serve load test, small enough for CI: `python -m localspec.serve.loadtest` against a real server
on loopback (the full run, 32 clients then 500 requests, is in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def test_concurrent_then_sequential_requests_are_all_answered_and_memory_stays_flat():
    r = subprocess.run([sys.executable, "-m", "localspec.serve.loadtest", "--clients", "16", "--sequential", "120",
                        "--max-tokens", "4", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    for phase in ("concurrent", "sequential"):
        p = report[phase]
        assert p["answered"] == p["requests"] and p["tokens"] >= p["requests"]
        assert 0 < p["ttft_p50"] <= p["ttft_p99"]
    assert report["concurrent"]["requests"] == 16 and report["sequential"]["requests"] == 120
    assert abs(report["sequential"]["rss_growth"]) < 0.05
