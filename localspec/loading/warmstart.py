"""What the k controller learned, kept across runs, so that the next run starts warm.

A CLI user mostly runs short generations, and a controller that starts from nothing spends its
first steps measuring (and probing a pair that never pays). So at the end of a run the controller's
costs and acceptance are saved, and the next run on the same pair and machine starts from them;
fresh measurements override them within a few steps (`KController.warm_start`).

One JSON record per model pair, machine, thread count and GPU layers, in `<cache>/controller/`:
- `verify`: seconds to verify a batch of b tokens, by b (the target here; `verify_age`: `_aged`);
- `drafters.<model|lookup>`: seconds per drafted token, of drafting n (`draft_by_n`), of a first
  decode of n (`first_decode`) and of a catch-up after plain steps, and α
  (overall and by draft position) per temperature band, `greedy` or `sampled`. α is per tested
  position, as everywhere (localspec.decoding.stats), and `trials` counts tested positions; records have
  always stored α so (the controller and doctor's calibration count trials that way), and
  `trials` is informational only, so older records stay valid as they are.
`localspec doctor` shows the record (`record_view`) and `doctor --forget` deletes it; `--no-warm-start` (or
LOCALSPEC_NO_WARM_START=1) neither reads nor writes it. A stale, foreign or corrupt record is
ignored (a note under LOCALSPEC_VERBOSE), never fatal.

A run during which other work took the cores its threads needed (`machine.loaded`) saves its α
but not its timings: α depends on the text and the pair, not on the load, while the timings would
describe a machine slower than this one (seen: verify 910 ms against 17 ms, which then kept later
runs plain). Not saving beats saving them down-weighted: a record is replayed as one set of costs,
so a down-weighted one would still set the first steps' choices, and the previous, quiet record is
the better start. `measured` keeps the conditions a record's timings were taken in.

Load that comes and goes within a run is not seen by that test; it shows in the timings themselves,
which stray from step to step (`VerifyCost.jitter`). A record's `weight` (0..1) says how steady the
run that wrote it was: 1 up to JITTER_STEADY, 0 at JITTER_ERRATIC. A run under MIN_WEIGHT saves α
but not its timings, and a run's timings replace a record's only where it weighs at least half as
much as the record does now. A record's weight halves every HALF_LIFE_DAYS. A warm start believes
a record by its weight (`KController.warm_start`), and a verdict that rests on the record alone is
re-tested within the run at a bounded price (`decoding.controller.probes`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from weakref import WeakKeyDictionary

from localspec import machine
from localspec.decoding.controller import KController
from localspec.machine import usable_cpus

SCHEMA = "localspec.controller/1"
MAX_AGE_DAYS = 30   # older records are stale: drivers, builds and machines change
HALF_LIFE_DAYS = 7  # a record's weight halves in this time: longer trusts an old record longer
JITTER_STEADY = 0.08    # timings straying up to ~8 % from step to step (quiet runs: 2.5-5 %)...
JITTER_ERRATIC = 0.3    # ...weigh 1, at ~30 % 0 (load that comes and goes: 24-27 % seen)
MIN_WEIGHT = 0.3    # a run weighing less saves α but not its timings
KEEP_RUNS = 3       # a size not re-timed is dropped by the this-many-th save since: longer keeps a busy
                    # moment's timing longer, shorter leaves runs after plain ones less shape (`_aged`)
AGED_FIELDS = ("draft_by_n", "first_decode")   # a drafter's costs by size, kept as `verify` is

# Per controller, when what it has timed since began (its `load_into` or last `save`): the window
# whose other work `save` judges when the caller has no decoding window of its own to give.
_since: WeakKeyDictionary = WeakKeyDictionary()


def enabled() -> bool:
    return not os.environ.get("LOCALSPEC_NO_WARM_START")


def _note(message: str) -> None:
    if os.environ.get("LOCALSPEC_VERBOSE"):
        print(f"localspec: {message}", file=sys.stderr, flush=True)


def band(temperature: float) -> str:
    """Greedy and sampled decoding accept differently: α is kept for each."""
    return "greedy" if temperature == 0 else "sampled"


def _file_id(path: str | Path | None) -> dict | None:
    if path is None:
        return None
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return {"name": p.name}
    return {"name": p.name, "size": st.st_size, "mtime": int(st.st_mtime)}


def key(target, draft, threads: int, target_gpu_layers: int, draft_gpu_layers: int) -> dict:
    """What a record is valid for: the two files (name, size, mtime), this machine, and how
    llama.cpp runs them here."""
    from importlib import metadata

    try:
        lcp = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        lcp = None
    return {
        "target": _file_id(target),
        "draft": _file_id(draft),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": usable_cpus(),
        "threads": threads,
        "target_gpu_layers": target_gpu_layers,
        "draft_gpu_layers": draft_gpu_layers,
        "llama_cpp_python": lcp,
    }


def session_key(session) -> dict:
    t, d = session.target, session.draft
    return pair_key(t, d, {"target": t.cfg.n_gpu_layers, "draft": d.cfg.n_gpu_layers if d is not None else -1})


def directory() -> Path:
    from .defaults import cache_dir

    return cache_dir() / "controller"


def path_for(k: dict) -> Path:
    digest = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16]
    return directory() / f"{k['target']['name']}.{digest}.json"


def read(k: dict) -> dict | None:
    """The record for key `k`, or None (missing, stale, foreign or corrupt: the reason is noted)."""
    try:
        path = path_for(k)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        _note(f"warm start: cannot read the controller record ({e}); starting cold")
        return None
    try:
        rec = json.loads(text)
        if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
            raise ValueError("unknown schema")
        if rec.get("key") != k:
            raise ValueError("recorded for another pair or machine")
        if not time.time() - float(rec["saved"]) < MAX_AGE_DAYS * 86400:
            _note(f"warm start: {path} is older than {MAX_AGE_DAYS} days; starting cold")
            return None
        _check(rec)
    except (ValueError, KeyError, TypeError) as e:
        _note(f"warm start: ignoring {path}: {e}")
        return None
    return rec


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _check(rec: dict) -> None:
    verify = rec["verify"]
    if not isinstance(verify, dict) or not all(k.isdigit() and _positive(v) for k, v in verify.items()):
        raise ValueError("bad verify costs")
    if rec.get("weight") is not None and not (_positive(rec["weight"]) and rec["weight"] <= 1):
        raise ValueError("bad weight")
    for name, d in rec["drafters"].items():
        for field in ("draft_cost", "resume_cost"):
            if d.get(field) is not None and not _positive(d[field]):
                raise ValueError(f"bad {name}.{field}")
        for field in ("draft_by_n", "first_decode"):
            if not all(n.isdigit() and _positive(t) for n, t in d.get(field, {}).items()):
                raise ValueError(f"bad {name}.{field}")
        for b, a in d.get("alpha", {}).items():
            if not (_positive(a["alpha"]) and a["alpha"] <= 1):
                raise ValueError(f"bad {name}.alpha.{b}")
            if not all(r is None or (_positive(r) and r <= 1) for r in a.get("by_position", [])):
                raise ValueError(f"bad {name}.alpha.{b}.by_position")


def record_name(drafter: str | None) -> str | None:
    """Whose record a drafter reads and writes: `auto`'s controller is the draft model's (its
    lookup statistics are learned afresh each run, in a few steps)."""
    return "model" if drafter == "auto" else drafter


def apply(controller: KController, rec: dict | None, drafter: str, temperature: float) -> bool:
    """Warm-start `controller` (for `drafter` at `temperature`) from `rec`; False if nothing fit."""
    if not rec:
        return False
    drafter = record_name(drafter)
    verify = {int(b): float(t) for b, t in rec["verify"].items()}
    d = rec["drafters"].get(drafter, {})
    a = d.get("alpha", {}).get(band(temperature))
    controller.warm_start(verify, d.get("draft_cost"), d.get("resume_cost"),
                          a["alpha"] if a else None, a.get("by_position") if a else None,
                          {int(n): float(t) for n, t in d.get("draft_by_n", {}).items()},
                          weight=weight(rec),
                          first_decode={int(n): float(t) for n, t in d.get("first_decode", {}).items()})
    return bool(verify)


def weight(rec: dict, now: float | None = None) -> float:
    """What a record is worth now: the steadiness of the run that wrote it (records from before
    weights count 1), halved every HALF_LIFE_DAYS."""
    age = max((time.time() if now is None else now) - float(rec["saved"]), 0.0) / 86400
    return float(rec.get("weight", 1.0)) * 0.5 ** (age / HALF_LIFE_DAYS)


def steadiness(jitter: float | None) -> float:
    """A run's weight from how its timings strayed (`VerifyCost.jitter`; None: too few to tell)."""
    if jitter is None:
        return 1.0
    return float(min(max((JITTER_ERRATIC - jitter) / (JITTER_ERRATIC - JITTER_STEADY), 0.0), 1.0))


def load_into(controller: KController, session, drafter: str, temperature: float) -> bool:
    """Read the record of this session's pair and warm-start `controller` from it; opens the
    window whose load `save` judges."""
    _since[controller] = machine.sample()
    if not enabled() or controller.fixed_k is not None:
        return False
    try:
        k = session_key(session)
        return apply(controller, read(k), drafter, temperature)
    except Exception as e:  # a warm start is an optimisation: never fatal
        _note(f"warm start: skipped ({type(e).__name__}: {e})")
        return False


def save(controller: KController, session, drafter: str | None, temperature: float,
         run: machine.Usage | None = None) -> Path | None:
    """Merge what `controller` learned into this session's record. Never raises. `run`: what the
    CPUs did while it decoded (`machine.usage` over the run); default, since the controller's
    `load_into` or last save, which is judged by other work only (idle time in it, a chat's user
    typing, would read as a low CPU share). Timings taken on a loaded machine are not saved."""
    if not enabled():
        return None
    learned = controller.learned()
    if not controller.verify_costs.by_size:   # nothing known, not even a record's
        return None
    threads = session.target.n_threads
    busy = _loaded_during(controller, run, threads)
    busy = busy and f"{busy} during the run"
    steady = steadiness(controller.verify_costs.jitter)
    if not busy:
        busy = _erratic(steady, controller.verify_costs.jitter, session)
    if busy:
        _note(f"warm start: timings not saved: {busy} (α is)")
    drafter = record_name(drafter)
    update: dict = {}
    if drafter and drafter != "none":
        if not busy:
            update = {f: learned[f] for f in ("draft_cost", "resume_cost", "draft_by_n", "first_decode")
                      if learned[f] is not None}
        if learned["alpha"] is not None:
            update["alpha"] = {band(temperature): {
                "alpha": learned["alpha"], "by_position": learned["by_position"], "trials": learned["trials"]}}
    if busy and not update:
        return None
    try:
        measured = None if busy or run is None else run.as_dict(threads)
        if measured is not None and controller.verify_costs.jitter is not None:
            measured["jitter"] = round(controller.verify_costs.jitter, 3)
        return _merge(session_key(session), {} if busy else learned["verify"], {drafter: update} if update else {},
                      measured, None if busy else steady)
    except Exception as e:
        _note(f"warm start: could not save the controller record ({type(e).__name__}: {e})")
        return None


def _erratic(steady: float, jitter: float | None, session) -> str | None:
    """Why a run's timings should not replace the record's: too erratic to save, or weighing
    less than half of what the record weighs now; None when they should."""
    if steady < MIN_WEIGHT:
        return f"its timings strayed {jitter:.0%} from step to step (erratic)"
    try:
        old = read(session_key(session))
    except Exception:   # noqa: BLE001 - a warm start is an optimisation
        old = None
    if old is not None and old.get("verify") and steady < 0.5 * weight(old):
        return f"its timings (weight {steady:.2f}) were less steady than the record's ({weight(old):.2f})"
    return None


def _loaded_during(controller: KController, run: machine.Usage | None, threads: int) -> str | None:
    """Why `controller`'s timings since its window opened were taken on a loaded machine, or None;
    opens the next window. Never raises: a machine that cannot be read is taken as quiet."""
    try:
        if run is None and controller in _since:
            window = machine.usage(_since[controller])
            run = window if window.other_cores is not None else None
        _since[controller] = machine.sample()
        return machine.loaded(run, threads) if run is not None else None
    except Exception as e:  # noqa: BLE001 - a warm start is an optimisation
        _note(f"warm start: could not tell whether the machine was loaded ({type(e).__name__}: {e})")
        return None


def save_calibration(target, draft, gpu_layers: dict[str, int], calibration: dict) -> list[Path]:
    """What `doctor` measured, as records for the pair (and for the target alone, which prompt
    lookup runs without a draft model use). Never raises."""
    if not enabled() or not calibration:
        return []
    verify = calibration["verify_cost"]
    drafters = {}
    for name, d in calibration["drafters"].items():
        if d["alpha"] is None:
            continue
        drafters[name] = {"alpha": {band(calibration["sampling"]["temperature"]): {
            "alpha": d["alpha_estimate"], "by_position": [], "trials": d["n_tested"]}}}
        if d["draft_cost"] is not None:
            drafters[name]["draft_cost"] = d["draft_cost"]
    keys = [pair_key(target, draft, gpu_layers)]
    if draft is not None:
        keys.append(pair_key(target, None, gpu_layers))
    written = []
    for i, k in enumerate(keys):
        try:
            use = drafters if i == 0 else {n: d for n, d in drafters.items() if n == "lookup"}
            written.append(_merge(k, verify, use, calibration.get("machine")))
        except Exception as e:
            _note(f"warm start: could not save the calibration ({type(e).__name__}: {e})")
    return written


def _merge(k: dict, verify: dict, drafters: dict, measured: dict | None = None,
           steady: float | None = None) -> Path:
    """Update the record of key `k` (verify costs by size, per-drafter fields) atomically;
    `measured`: the conditions new timings were taken in (`machine.Usage.as_dict`); `steady`: the
    weight of those timings (`steadiness`), None when none are saved."""
    rec = read(k) or {"schema": SCHEMA, "key": k, "verify": {}, "drafters": {}}
    verify, old = {str(b): float(t) for b, t in verify.items()}, rec["verify"].get("1", 0)
    level = verify["1"] / old if "1" in verify and old > 0 else 1.0   # the run's plain pass / the record's
    if verify:
        rec["verify"], rec["verify_age"] = _aged(rec["verify"], rec.get("verify_age"), verify, level)
    if measured is not None:
        rec["measured"] = measured
    if verify and steady is not None:
        rec["weight"] = round(steady, 3)
    elif rec.get("weight") is not None:   # α alone: the timings keep their weight, aged to now
        rec["weight"] = round(weight(rec), 3)
    for name, fields in drafters.items():
        d = rec["drafters"].setdefault(name, {})
        alpha = fields.get("alpha", {})
        fields = dict(fields)
        for f in AGED_FIELDS:
            if f in fields:
                fields[f], fields[f + "_age"] = _aged(d.get(f, {}), d.get(f + "_age"), fields[f], level)
        d.update({f: v for f, v in fields.items() if f != "alpha"})
        d.setdefault("alpha", {}).update(alpha)
    rec["saved"] = time.time()
    path = path_for(k)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(rec, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _aged(old: dict, ages, timed: dict, level: float) -> tuple[dict[str, float], dict[str, int]]:
    """The sizes of a table of costs (verify, draft lengths, first decodes) a save keeps: those the
    run timed, and the record's others, at the run's `level`, until the KEEP_RUNS-th save that did
    not re-time them drops them (`ages`: how many saves have not). Merged by size for ever, one timed
    in a busy moment was written back run after run; dropped at once, a run held plain (timing 1 and 3
    tokens) left the next one a two-point line, which on a CPU prices long drafts far too dear."""
    ages = ages if isinstance(ages, dict) else {}
    kept, kept_ages = {str(n): float(t) for n, t in timed.items()}, {}
    for b, t in old.items():
        age = ages.get(b, 0)
        age = age + 1 if isinstance(age, int) and not isinstance(age, bool) else KEEP_RUNS
        if b not in kept and age < KEEP_RUNS and _positive(t):
            kept[b], kept_ages[b] = t * level, age
    return kept, kept_ages


def pair_key(target, draft, gpu_layers: dict[str, int]) -> dict:
    """The key for loaded models (as `doctor` has them, without a Session)."""
    k = key(target.path, draft.path if draft else None, target.n_threads, gpu_layers["target"],
            gpu_layers["draft"] if draft else -1)
    # Workers, flash attention and cache types change what a pass costs: records are kept apart
    # (the key of a run with llama.cpp's defaults is the one earlier releases wrote).
    placements = {role: getattr(getattr(m, "cfg", None), "placement", None) for role, m in (("target", target), ("draft", draft))}
    placed = {role: p.record() for role, p in placements.items() if p is not None and p.record()}
    return k | ({"placement": placed} if placed else {})


def forget(k: dict) -> Path | None:
    """Delete the record of key `k`; returns its path if there was one."""
    path = path_for(k)
    try:
        path.unlink()
        return path
    except FileNotFoundError:
        return None
