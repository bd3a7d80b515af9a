"""The draft model's costs: drafting n tokens (`DraftCost`) and its first decode by how many tokens
it reads (`BatchCost`), learned with the rules of `costs`.

After plain or prompt-lookup steps the draft model is behind the text, and its next proposal must
first read what it missed: on a GPU about one decode whatever the count, on a CPU more with each
token. `BatchCost` learns that line a + c·n, so that choosing the draft model after lookup steps is
charged what catching up costs.
"""

from __future__ import annotations

import math

import numpy as np

from .costs import COST_CLIP, COST_WEIGHT, ewma, fit_line, fit_weights, line_fit, replace_recorded

FIRST_DECODE_PRIOR_SLOPE = 0.1  # per extra token read, as a share of a one-token decode, until two
                                # sizes are timed: larger prices a catch-up dearer before it is timed
USUAL_FIRST = 2            # tokens a drafting step's first decode reads after an all-accepted step:
                           # the last draft token and the bonus token (its usual size)
FIRST_DECODE_MAX = 512     # longer first decodes (a prompt's prefill) are not learned from: larger
                           # lets rare long reads pull the line fitted to catch-ups


class DraftCost:
    """Seconds of drafting n tokens with the draft model (EWMAs per length, a line base + slope·n
    once two lengths are timed), and of its catch-up on text it missed during plain steps.

    A warm start's lengths are believed, at today's level (the first timing here sets it, as
    `costs.replace_recorded` does), until this run has timed two lengths of its own; then only
    those are fitted, and the record's are forgotten after the verify costs' trust (`forget_recorded`),
    or at once after the draft that tests a record's plain verdict (`observe`'s `test`).
    A record's length that no run re-timed was otherwise written back run after run: seen, 1 token
    12 ms and 3 tokens 59 ms beside 2 tokens 1.7 ms timed each run, a fitted 24 ms a token that
    wrote a 128k-vocabulary pair off as hopeless."""

    def __init__(self) -> None:
        self.per_token: float | None = None     # seconds per drafted token (EWMA)
        self.by_n: dict[int, float] = {}        # n drafted -> EWMA seconds of that drafting
        self.recorded: set[int] = set()         # lengths known only from a warm start
        self._count: dict[int, int] = {}        # n -> how often timed here
        self._line: np.ndarray | None = None    # (base, slope), refitted lazily
        self.resume: float | None = None        # seconds a drafter paid to catch up after plain steps
        self._resume_recorded = False           # resume is a warm start's, not timed here
        self._per_token_recorded = False        # per_token is a warm start's, not timed here

    def observe(self, n: int, seconds: float, resume: float = 0.0, test: bool = False) -> None:
        """One drafting of n tokens; `test`: the draft that tests a warm start's plain verdict, after
        which only this run's lengths are priced (the record's are forgotten at once). A record from
        a busy hour can be wrong in shape, not just in level: a real one priced 1 token 54 ms and
        7 tokens 593 ms (85 a token), and rescaled to the test's 2 tokens, its line still priced a
        token 2.5x what the test had just paid, and kept the run plain."""
        if math.isfinite(resume) and resume > 0:   # a record's gives way to the first timing here
            self.resume = resume if self._resume_recorded else ewma(self.resume, resume, COST_WEIGHT)
            self._resume_recorded = False
        if not (math.isfinite(seconds) and seconds >= 0 and n >= 1):
            return
        if n in self.recorded or (self.recorded and not self._count):
            # the first timing here sets the level of the record's lengths not timed yet
            self.by_n.setdefault(n, self.per_token * n)
            self.recorded.discard(n)
            replace_recorded(self.by_n, n, seconds, set(self.recorded))
            self._count.pop(n, None)
        if self._per_token_recorded:
            self.per_token, self._per_token_recorded = seconds / n, False
        else:
            self.per_token = ewma(self.per_token, seconds / n, COST_WEIGHT)
        self.by_n[n] = seconds if n not in self._count else ewma(self.by_n.get(n), seconds, COST_WEIGHT)
        self._count[n] = self._count.get(n, 0) + 1
        self._line = None
        if test:
            self.forget_recorded()

    def rescale(self, ratio: float) -> None:
        """Today's speed (from a verify timing) sets the level of a recorded, untimed draft cost,
        until drafting is timed here: the first such timing sets the recorded lengths' level itself
        (`observe`), and a verify re-level after it would move them off the draft model's."""
        if self._per_token_recorded:
            self.per_token *= ratio
        if not self._count:
            for n in self.recorded:
                self.by_n[n] *= ratio
            self._line = None
        if self._resume_recorded and self.resume is not None:
            self.resume *= ratio

    def warm_start(self, per_token: float, by_n: dict[int, float]) -> None:
        """Recorded costs (already checked usable), believed until drafting is timed here."""
        self.per_token, self._per_token_recorded = per_token, True
        self.by_n, self.recorded, self._count = dict(by_n), set(by_n), {}
        self._line = None

    def warm_resume(self, seconds: float) -> None:
        """A recorded catch-up cost: believed (at today's level) until a catch-up is timed here. A
        record's catch-up from a busy moment (seen: 0.6-0.95 s against 10 ms) spaced probes
        hundreds of steps apart, and an EWMA would take many resumes to forget it."""
        self.resume, self._resume_recorded = seconds, True

    def timed_here(self) -> dict[int, float]:
        """Seconds by drafted length, for the lengths this run timed (what a save keeps)."""
        return {n: t for n, t in self.by_n.items() if n not in self.recorded}

    def forget_recorded(self) -> None:
        """Drop the record's lengths no step has re-timed (`VerifyCost.forget_recorded`'s moment)."""
        if self.recorded:
            for n in self.recorded:
                del self.by_n[n]
            self.recorded = set()
            self._line = None


    def seconds(self, k_top: int) -> np.ndarray:
        """Seconds of drafting k = 0..k_top tokens (needs one timing): base + slope·k for k >= 1.

        A drafting step has a fixed part: a draft whose tokens were all accepted must first read
        its last token and the target's bonus token, two rows in one decode, which on a CPU costs
        about two single-token decodes. Priced per token, that part would make long drafts look
        dearer than they are. Once two draft lengths are timed a line is fitted (weighted like
        the verify curve), its base held between 0 and two tokens' worth."""
        ks = np.arange(k_top + 1, dtype=float)
        sizes = [n for n in self.by_n if n not in self.recorded]
        if len(sizes) < 2:   # the record's shape, at today's level, until two lengths are timed here
            sizes = list(self.by_n)
        if len(sizes) < 2:
            return ks * self.per_token
        if self._line is None:
            ns = np.array(sorted(sizes), dtype=float)
            ts = np.array([self.by_n[int(n)] for n in ns])
            counts = [self._count.get(int(n), 1) for n in ns]
            base, slope = fit_line(ns, ts, counts)
            if not 0.0 <= base <= 2 * slope:
                # Refitted with the base at its bound, not cut there: two near lengths timed with
                # a little noise (3 tokens 24.8 ms, 4 tokens 39 ms) gave slope 14 ms and base -17;
                # cut to 0, that priced 5 tokens 70 ms against a true 48, and kept a pair that
                # pays 1.1x plain for the rest of a run.
                shift = 0.0 if base < 0.0 else 2.0
                w = fit_weights(counts) ** 2 * (ns + shift)
                slope = float(np.sum(w * ts) / np.sum(w * (ns + shift)))
                base = shift * slope
            self._line = np.array([base, slope])
        base, slope = self._line
        out = base + slope * ks
        out[0] = 0.0
        return out


class BatchCost:
    """The draft model's first decode of a draft, by tokens read: the price of its catch-up."""

    def __init__(self) -> None:
        self._by_n: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._line: tuple[float, float] | None = None
        self.recorded: set[int] = set()   # sizes known only from a warm start

    def warm_start(self, by_n: dict[int, float]) -> None:
        """A record's first decodes (already checked usable), believed until timed here. Without
        them a warm run's first catch-up is split by the prior's mild slope: about half of reading
        16 missed tokens was counted as drafting, which priced the draft model ~2× too dear (seen:
        21 ms a token against 10) and kept a stale record's verdict after its first probe."""
        for n, t in by_n.items():
            if 1 <= n <= FIRST_DECODE_MAX and t > 0:
                self._by_n[n], self._count[n] = t, 1
                self.recorded.add(n)
        self._line = None

    def rescale(self, ratio: float) -> None:
        """Today's speed (a verify timing) sets the level of the recorded sizes not timed here."""
        for n in self.recorded:
            self._by_n[n] *= ratio
        self._line = None

    def observe(self, n: int, seconds: float) -> None:
        if not (1 <= n <= FIRST_DECODE_MAX and np.isfinite(seconds) and seconds > 0):
            return
        if n in self.recorded:   # a record's gives way to the first timing here
            self.recorded.discard(n)
            del self._by_n[n], self._count[n]
        old = self._by_n.get(n)
        # Clipped from above only: a faster timing is the machine's speed, a slower may be a pause.
        self._by_n[n] = seconds if old is None else (1 - COST_WEIGHT) * old + COST_WEIGHT * min(seconds, COST_CLIP * old)
        self._count[n] = self._count.get(n, 0) + 1
        self._line = None

    def forget_recorded(self) -> None:
        """Drop the record's sizes no step has re-timed (`VerifyCost.forget_recorded`'s moment)."""
        if self.recorded:
            for n in self.recorded:
                del self._by_n[n], self._count[n]
            self.recorded = set()
            self._line = None


    def predict(self, n: int) -> float | None:
        """Seconds for a decode of n tokens; None before any timing. Once two sizes are timed here
        the line rests on them alone (a record's may be from another day's machine)."""
        if not self._by_n:
            return None
        if self._line is None:
            sizes = [x for x in self._by_n if x not in self.recorded]
            ns = np.array(sorted(sizes if len(sizes) >= 2 else self._by_n), dtype=float)
            ts = np.array([self._by_n[int(x)] for x in ns])
            if len(ns) == 1:
                base = ts[0] / (1 + FIRST_DECODE_PRIOR_SLOPE * (ns[0] - 1))
                self._line = (base * (1 - FIRST_DECODE_PRIOR_SLOPE), base * FIRST_DECODE_PRIOR_SLOPE)
            else:
                w = fit_weights([self._count[int(x)] for x in ns])
                slope, base = line_fit(ns, ts, w)
                slope = max(float(slope), 0.0)
                base = max(float(base), 0.0) if slope > 0 else float(np.average(ts, weights=w))
                self._line = (base, slope)
        base, slope = self._line
        return base + slope * n

    def lined(self) -> bool:
        """Whether the line rests on two sizes timed here (a catch-up can then be told apart)."""
        return len(self._by_n) - len(self.recorded) >= 2   # recorded sizes are among _by_n's: O(1), each step

    def extra(self, n, usual: int = USUAL_FIRST):
        """What reading n tokens (an int or an array of them) costs beyond the usual in-step first
        decode (≈ `usual` tokens): the line's slope times the tokens past `usual`."""
        if self.predict(usual) is None:
            return np.zeros(np.shape(n)) if np.ndim(n) else 0.0
        extra = self._line[1] * np.maximum(np.asarray(n, dtype=float) - usual, 0.0)
        return extra if np.ndim(n) else float(extra)

    def timed_here(self) -> dict[int, float]:
        """Seconds by tokens read, for the sizes this run timed (what a save keeps)."""
        return {n: t for n, t in self._by_n.items() if n not in self.recorded}

    def snapshot(self) -> dict:
        return {str(n): t for n, t in sorted(self._by_n.items())}
