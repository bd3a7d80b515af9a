"""Counters of `localspec serve`, rendered as Prometheus text at /metrics.

Written by the worker thread (per generation) and the event loop (per answer), read by the loop:
one lock, O(1) work per update. α and draft efficiency are over the server's whole life, with the
one definition every localspec report uses (localspec.decoding.stats): accepted / tested positions, and
accepted / drafted tokens.
"""

from __future__ import annotations

import threading
from collections import Counter

ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, int]] = Counter()
        self._finish: Counter[str] = Counter()
        self.completion_tokens = 0
        self.target_passes = 0
        self.emitting_passes = 0   # passes that put a token into the output: tokens per pass divides by these
        self.drafted = 0
        self.accepted = 0
        self.tested = 0
        self.k_sum = 0
        self.seconds = 0.0

    def request(self, path: str, status: int) -> None:
        with self._lock:
            self._requests[(path if path in ENDPOINTS else "other", status)] += 1

    def cancelled(self) -> None:
        with self._lock:
            self._finish["cancelled"] += 1

    def generated(self, stats, finish: str | None) -> None:
        """One generation's RunStats (finished, cut short or failed)."""
        with self._lock:
            self._finish[finish or "error"] += 1
            self.completion_tokens += stats.n_tokens
            self.target_passes += stats.n_steps
            self.emitting_passes += stats.n_passes
            self.drafted += stats.n_drafted
            self.accepted += stats.n_accepted
            self.tested += stats.n_tested
            self.k_sum += stats.k_sum
            self.seconds += stats.seconds

    def render(self, queue_depth: int, busy: int, slots: int = 1) -> str:
        with self._lock:
            requests = sorted(self._requests.items())
            finish = sorted(self._finish.items())
            c = dict(vars(self))
        ratio = lambda a, b: a / b if b else float("nan")  # noqa: E731
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples) -> None:
            lines.append(f"# HELP localspec_{name} {help_}")
            lines.append(f"# TYPE localspec_{name} {kind}")
            for labels, value in samples:
                lines.append(f"localspec_{name}{labels} {value}")

        metric("requests_total", "counter", "HTTP answers by endpoint and status.",
               [(f'{{endpoint="{p}",status="{s}"}}', n) for (p, s), n in requests])
        metric("generations_total", "counter",
               "Generations by how they ended (stop, length, context, cancelled, error).",
               [(f'{{finish="{f}"}}', n) for f, n in finish])
        metric("completion_tokens_total", "counter", "Generated tokens.", [("", c["completion_tokens"])])
        metric("target_passes_total", "counter", "Target evaluations (decoder steps).", [("", c["target_passes"])])
        metric("draft_tokens_total", "counter", "Drafted tokens.", [("", c["drafted"])])
        metric("draft_tokens_accepted_total", "counter", "Accepted draft tokens.", [("", c["accepted"])])
        metric("draft_positions_tested_total", "counter", "Draft positions the acceptance rule tested.",
               [("", c["tested"])])
        metric("alpha", "gauge", "Acceptance rate: accepted / tested draft positions (NaN before any draft).",
               [("", ratio(c["accepted"], c["tested"]))])
        metric("draft_efficiency", "gauge", "Accepted / drafted tokens (NaN before any draft).",
               [("", ratio(c["accepted"], c["drafted"]))])
        metric("tokens_per_pass", "gauge", "Generated tokens per target pass that emitted a token (generate --json: tokens_per_pass).",
               [("", ratio(c["completion_tokens"], c["emitting_passes"]))])
        metric("mean_k", "gauge", "Mean draft length chosen per step.", [("", ratio(c["k_sum"], c["target_passes"]))])
        metric("tokens_per_second", "gauge", "Generated tokens per decoding second (prefill excluded).",
               [("", ratio(c["completion_tokens"], c["seconds"]))])
        metric("queue_depth", "gauge", "Requests waiting for a generation slot.", [("", queue_depth)])
        metric("busy", "gauge", "1 while a generation runs.", [("", int(busy > 0))])
        metric("slots", "gauge", "Generation slots (--parallel).", [("", slots)])
        metric("slots_busy", "gauge", "Slots running a generation.", [("", busy)])
        return "\n".join(lines) + "\n"
