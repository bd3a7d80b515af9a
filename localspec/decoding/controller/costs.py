"""The target's verify cost by batch size (`VerifyCost`), the rules every cost EWMA and line fit
here shares, and how a warm start's recorded costs give way to today's timings (`replace_recorded`).
The draft model's costs, built on the same rules, are in `draft_costs`.

On a CPU t_verify(b) grows with b, on a GPU it is nearly flat; both drift as the context grows and
as other work takes the cores, so every cost is learned online from the decoder's timings.
"""

from __future__ import annotations

import math

import numpy as np

COST_WEIGHT = 0.25         # of a new timing in a cost EWMA: larger follows a drifting machine sooner,
                           # smaller is steadier against one noisy timing
COST_CLIP = 2.0            # one timing moves an estimate by at most this factor: smaller shrugs off
                           # GC pauses and busy moments, larger follows a real jump at once
COST_STALE = 32            # a batch size unmeasured for this many steps: its new timing counts half
                           # (the context grew meanwhile); smaller re-weighs sizes more often
FIT_COUNT_CAP = 16         # in a line fit a size timed more often weighs no more: larger trusts the
                           # usual sizes more, smaller keeps rarely timed sizes in the fit
VERIFY_PRIOR_SLOPE = 0.1   # t_verify(b) ~ 1 + 0.1 (b - 1) until two batch sizes are measured:
                           # larger makes long drafts look dearer before they are timed
VERIFY_FLOOR = 0.5         # no batch is predicted to verify in less than this share of the cheapest
                           # timing: lower lets a steep fitted line reach nearer zero
CURVE_SLACK = 0.02         # a cost that moved less than this share since the fit keeps the fit (once
                           # timed FIT_COUNT_CAP times): larger refits less often, follows drift later
WARM_TRUST = 64            # steps a warm start's verify costs are believed without being re-timed:
                           # longer leans on the record, shorter drops a busy-machine record sooner
SCALAR_TOP = 32            # curves up to this many sizes are built in scalar arithmetic, longer ones
                           # (a batch's, serve --parallel: ~260 rows) with numpy, each where cheaper


JITTER_MIN = 8             # timings compared before a run's jitter is told: fewer is noise itself


def ewma(old: float | None, new: float, weight: float) -> float:
    if old is None:
        return new
    new = min(max(new, old / COST_CLIP), old * COST_CLIP)
    return (1.0 - weight) * old + weight * new


def fit_weight(count: int) -> float:
    """A timing's weight in a line fit: grows with how often it was taken, up to FIT_COUNT_CAP."""
    return math.sqrt(min(count, FIT_COUNT_CAP))


def fit_weights(counts) -> np.ndarray:
    """`fit_weight` of each count."""
    return np.array([fit_weight(c) for c in counts], dtype=float)


def line_fit(xs, ys, w=None) -> tuple[float, float]:
    """(slope, base) of the least-squares line, as np.polyfit(xs, ys, 1, w=w) gives it (w weighs
    the unsquared residuals), in closed form over a handful of points: polyfit's SVD costs ~100 µs,
    and a fit runs after every step that timed something new."""
    xs = [float(x) for x in xs]
    ys = [float(y) for y in ys]
    ws = [1.0] * len(xs) if w is None else [float(v) * float(v) for v in w]
    total = sum(ws)
    mx = sum(wi * x for wi, x in zip(ws, xs)) / total
    my = sum(wi * y for wi, y in zip(ws, ys)) / total
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(ws, xs))
    sxy = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(ws, xs, ys))
    slope = sxy / sxx if sxx > 0 else 0.0
    return slope, my - slope * mx


def fit_line(xs: np.ndarray, ys: np.ndarray, counts) -> tuple[float, float]:
    """(base, slope) of the weighted least-squares line; never a negative slope: more tokens
    never cost less."""
    slope, base = line_fit(xs, ys, [fit_weight(c) for c in counts])
    return float(base), max(float(slope), 0.0)


class VerifyCost:
    """Seconds of one target decode of b tokens: EWMAs per batch size, a fitted line across them.

    The first timing of a size is often cold (seen: +10..40%): a faster second replaces it. Costs
    drift as the context grows, most for a size timed long ago (t_verify(1) while speculating),
    so a stale size's new timing counts half. With three batched sizes a line a + c·b is fitted;
    before that VERIFY_PRIOR_SLOPE shapes it. A warm start's costs take their level from each first
    timing here (`replace_recorded`); those never re-timed are forgotten after WARM_TRUST steps."""

    def __init__(self, k_max: int) -> None:
        self.k_max = k_max
        self.by_size: dict[int, float] = {}        # batch size b -> EWMA seconds
        self.recorded: set[int] = set()            # sizes known only from a warm start
        self._level_from: int | None = None        # the size whose first timing set their level
        self._timed: dict[int, tuple[int, int]] = {}   # b -> (step of last timing, timings)
        self._curve: np.ndarray | None = None      # cost(1..k_max+1), refitted lazily
        self._curve_list: list[float] | None = None   # the last fit, as a list (`last_fit`)
        self.row_share = 0.0   # the cheapest added verify row as a share of a plain pass, at the last fit
        self._fit_values: dict[int, float] = {}    # by_size as the curve was fitted
        self.steps = 0                             # target passes reported, timed or not
        self.trust = WARM_TRUST                    # steps untimed recorded sizes are believed
        self._jitter = (0.0, 0)                    # (sum of |log(new / before)|, count): `jitter`

    def timed_here(self, b: int) -> bool:
        return b in self.by_size and b not in self.recorded

    def times_here(self, b: int) -> int:
        """How many timings of b tokens this run has made (0: none, or only a record's)."""
        return self._timed.get(b, (0, 0))[1] if self.timed_here(b) else 0

    def untimed(self) -> None:
        """A target pass timed elsewhere (a batch's decode, by the batcher): a step, no timing."""
        self.steps += 1

    def trust_ends(self) -> bool:
        """Whether the last step reported was the one after which the record's untimed costs,
        these and the draft model's, are forgotten (`KController.observe_verify`)."""
        return self.steps == self.trust

    def observe(self, b: int, seconds: float) -> float | None:
        """Record one target pass over b tokens. Returns the factor by which it moved the level of
        a warm start's record (the recorded draft cost follows it), None when it did not."""
        self.steps += 1
        if not (math.isfinite(seconds) and seconds > 0):   # a scalar test: numpy's costs µs a step
            return None
        ratio = None
        last, n = self._timed.get(b, (self.steps, 0))
        if b not in self.recorded:
            self._note_jitter(b, seconds)
        if b in self.recorded:
            ratio = replace_recorded(self.by_size, b, seconds, self.recorded - {b})
            self._level_from, n = b, 0
        elif n == 1 and seconds < self.by_size[b]:
            if b == self._level_from:   # a cold first timing had set the record's level
                ratio = seconds / self.by_size[b]
                for other in self.recorded:
                    self.by_size[other] *= ratio
            self.by_size[b] = seconds
        else:
            weight = 0.5 if self.steps - last >= COST_STALE else COST_WEIGHT
            self.by_size[b] = ewma(self.by_size.get(b), seconds, weight)
        self._timed[b] = (self.steps, n + 1)
        self.recorded.discard(b)
        # A size timed often, whose cost moved little since the fit, leaves the fit as it is:
        # refitting after every plain step cost ~0.1 ms, 2-3 % of a GPU-class pass.
        fit = self._fit_values.get(b) if self._curve is not None and ratio is None else None
        if fit is None or n + 1 <= FIT_COUNT_CAP or abs(self.by_size[b] - fit) > CURVE_SLACK * fit:
            self._curve = None
            if b > 1 or ratio is not None:   # `last_fit` stands for plain timings only
                self._curve_list = None
        return ratio

    def _note_jitter(self, b: int, seconds: float) -> None:
        """How far a timing strays from its size's estimate (a first timing: nothing to compare)."""
        before = self.by_size.get(b)
        if before is not None and before > 0:
            total, count = self._jitter
            self._jitter = (total + abs(math.log(seconds / before)), count + 1)

    @property
    def jitter(self) -> float | None:
        """The mean |log| ratio of a timing to its batch size's estimate before it (0.1: timings
        stray ~10 %), None before JITTER_MIN such timings: how erratic this run's timings were."""
        total, count = self._jitter
        return total / count if count >= JITTER_MIN else None


    def forget_recorded(self) -> None:
        """Drop the recorded batch sizes no step has re-timed (the plain one stays: it is timed
        before any drafting). A record written while the machine
        was busy can price every batch too high; believed for ever, it keeps the controller plain,
        so those sizes are never timed again (prompt lookup has no probes, and the model's become
        hopeless-rare): a bench stayed 100% plain that way. Forgotten, the curve rests on what was
        measured here, with the prior's mild slope beyond it, and drafting gets tried."""
        for b in self.recorded - {1}:
            del self.by_size[b]
        self.recorded &= {1}
        self._curve = self._curve_list = None

    def warm_start(self, by_size: dict[int, float]) -> None:
        """Recorded costs (already checked usable), believed until timed here."""
        for b, t in by_size.items():
            self.by_size[b] = t
            self.recorded.add(b)
        self._curve = self._curve_list = None

    def curve(self, top: int) -> np.ndarray:
        """Predicted seconds to verify b = 1..top tokens (needs one timing)."""
        return self.fitted()[:top] if top <= self.k_max + 1 else self._fit_curve(top)

    def fitted(self) -> np.ndarray:
        if self._curve is None:
            curve = self._curve = self._fit_curve(self.k_max + 1)
            self._fit_values = dict(self.by_size)
            c = self._curve_list = curve.tolist()
            if len(c) > 1 and c[0] > 0:
                self.row_share = max(min(b - a for a, b in zip(c, c[1:])) / c[0], 0.0)
        return self._curve

    def last_fit(self) -> list[float]:
        """t_verify(1..k_max + 1) as last fitted, as a list, not refitted for timings since: what
        a step held plain prices lookup's candidate with (between decisions only the plain step's
        cost moves, and a refit there cost ~30 µs cache-cold, 1 % of a GPU-class pass)."""
        if self._curve_list is None:
            self.fitted()
        return self._curve_list

    def _fit_curve(self, top: int) -> np.ndarray:
        """t_verify(1..top): a fitted line for batches once three sizes are timed; before that
        exact at measured sizes, linear between, a linear fit beyond. In scalar arithmetic over a
        dozen sizes: a plain step's new timing asks for a refit, and numpy's fixed cost per call
        made one ~80 µs cache-cold beside a GPU-class pass."""
        sizes = sorted(self.by_size)
        if sum(1 for x in sizes if x >= 2 and x not in self.recorded) >= 3:
            # Enough measured here: a warm start's other sizes may come from a machine state that
            # has changed, and the line fit would keep them forever (large sizes are seldom tried).
            sizes = [x for x in sizes if x == 1 or x not in self.recorded]
        ts = [float(self.by_size[x]) for x in sizes]
        # Every decode reads all the weights whatever its size, so no batch costs much less than
        # the cheapest one timed; a line fitted to steep costs (a CPU's) extrapolates below zero
        # at b = 1 when that size is unmeasured, and a cost <= 0 would make tokens/s infinite or
        # negative. The floor (also the sparse branch's bound below its smallest size) keeps every
        # prediction positive and finite.
        floor = VERIFY_FLOOR * min(ts)
        curve = self._curve_through(sizes, ts, top)
        if isinstance(curve, np.ndarray):
            return np.maximum(curve, floor)
        return np.array([max(c, floor) for c in curve])

    def _curve_through(self, bs: list[int], ts: list[float], top: int) -> list[float]:
        if len(bs) == 1:  # the prior shape 1 + 0.1 (b - 1), through the one measured point
            scale = ts[0] / (1 + VERIFY_PRIOR_SLOPE * (bs[0] - 1))
            return [scale * (1 + VERIFY_PRIOR_SLOPE * (b - 1)) for b in range(1, top + 1)]
        batched = [(b, t) for b, t in zip(bs, ts) if b >= 2]
        if len(batched) >= 3:
            # Per-size averages are noisy (one busy moment skews a size for many steps) and a
            # noisy curve makes the argmax over k jump. A batch of b > 1 tokens costs about
            # a + c·b on CPUs and GPUs alike (c ≈ 0 on a GPU), so fit that line, weighting sizes
            # by how often they were timed; a single token runs other kernels and keeps its own.
            counts = [self._timed.get(b, (0, 1))[1] for b, _ in batched]
            base, slope = fit_line([b for b, _ in batched], [t for _, t in batched], counts)
            if slope == 0.0:
                w = [fit_weight(c) for c in counts]
                base = sum(wi * t for wi, (_, t) in zip(w, batched)) / sum(w)
            first = ts[0] if bs[0] == 1 else min(base + slope, base + 2 * slope)
            if top > SCALAR_TOP:
                out = np.maximum(base + slope * np.arange(1, top + 1, dtype=float), first)
                out[0] = first
                return out
            return [first] + [max(base + slope * b, first) for b in range(2, top + 1)]
        # Never a negative slope beyond the data: more tokens never cost less.
        slope = max(line_fit(bs, ts)[0], 0.0)
        if top > SCALAR_TOP:
            b = np.arange(1, top + 1, dtype=float)
            out = np.interp(b, bs, ts)
            out = np.where(b < bs[0], np.maximum(ts[0] - slope * (bs[0] - b), VERIFY_FLOOR * ts[0]), out)
            return np.where(b >= bs[-1], ts[-1] + slope * (b - bs[-1]), out)
        out = []
        for b in range(1, top + 1):
            if b < bs[0]:
                out.append(max(ts[0] - slope * (bs[0] - b), VERIFY_FLOOR * ts[0]))
            elif b >= bs[-1]:
                out.append(ts[-1] + slope * (b - bs[-1]))
            else:   # linear between the measured sizes around b
                i = next(j for j in range(1, len(bs)) if bs[j] >= b)
                out.append(ts[i - 1] + (ts[i] - ts[i - 1]) * (b - bs[i - 1]) / (bs[i] - bs[i - 1]))
        return out


def replace_recorded(costs: dict[int, float], key: int, timed: float, others: set[int]) -> float:
    """A warm start's cost gives way to the first timing made here, and the machine's speed now
    (it drifts between runs) rescales the recorded costs not timed yet: the record keeps its
    shape, this run sets its level. Returns the factor applied.

    The factor is not bounded. A record written while other work held the cores can be 10× or 50×
    too slow (seen: verify 910 ms against 17 ms today); a bounded factor (it was [0.5, 2]) left
    the sizes not re-timed yet 5× too dear, the controller plain, and those sizes unvisited until
    WARM_TRUST forgot them. The trade: one outlying first timing (a cold cache, a pause) moves the
    whole record by as much. That leaves the choice of k alone while every cost is the record's
    (tokens per second are compared, and a common factor cancels); the faster second timing that
    replaces a cold first one moves the record back with it (VerifyCost.observe); and each other
    size's first timing sets the level again. What stays is a spiked t_verify(1) beside re-timed
    drafting sizes until the next plain step (REFRESH_PLAIN steps at most): the same as after a
    cold start's first timing."""
    old = costs[key]
    ratio = timed / old if old > 0 else 1.0
    for other in others:
        costs[other] *= ratio
    costs[key] = timed
    return ratio
