"""What `localspec doctor` shows of a warm-start record (`warmstart`): where it is, its age and
weight, its contents, and what a run would start with from it.

May import the loading layer's `warmstart` and the controller; never the CLI, the server or the UI.
"""

from __future__ import annotations

import time

from localspec.decoding.controller import EXPLORE_FIRST, KController

from .warmstart import apply, enabled, path_for, read, weight


def describe(k: dict) -> dict:
    """The record of key `k`, for `doctor`: where it is, whether it is used, its age and contents."""
    path = path_for(k)
    rec = read(k) if enabled() else None
    out: dict = {"path": str(path), "enabled": enabled(), "exists": path.exists(), "usable": rec is not None}
    if rec is not None:
        out.update(age_days=(time.time() - rec["saved"]) / 86400, verify=rec["verify"], drafters=rec["drafters"],
                   measured=rec.get("measured"), weight=weight(rec), written_weight=rec.get("weight", 1.0),
                   decisions={name: {b: decision(rec, name, b) for b in d.get("alpha", {})}
                              for name, d in rec["drafters"].items()})
    return out


def decision(rec: dict, drafter: str, band_name: str) -> dict:
    """What a run of `drafter` in temperature band `band_name` starts with from `rec`: the k its
    costs and α predict best (0: plain decoding) and that k's speed against plain decoding."""
    c = KController(k_max=12, draft_cost_free=drafter == "lookup")
    apply(c, rec, drafter, 0.0 if band_name == "greedy" else 1.0)
    if not c.costs_known():
        return {"k": None, "speedup": None, "retest_after": None}
    speedups = [c.expected_speedup(k) for k in range(c.k_max + 1)]
    best = max(range(len(speedups)), key=lambda k: (speedups[k] or 0.0, -k))
    return {"k": best, "speedup": max(speedups[1:] or [None], key=lambda x: x or 0.0) if best == 0 else speedups[best],
            "retest_after": EXPLORE_FIRST if best == 0 else None}
