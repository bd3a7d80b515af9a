"""The controller record that makes later runs start warm: written, read, refused, never fatal."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from localspec import machine
from localspec.loading import warmstart
from localspec.decoding.controller import KController

CLI = [sys.executable, "-m", "localspec"]


class _Model:
    def __init__(self, path, threads=2, gpu_layers=-1):
        self.path = path
        self.n_threads = threads
        self.cfg = type("Cfg", (), {"n_gpu_layers": gpu_layers})()


class _Session:
    def __init__(self, target, draft=None, threads=2):
        self.target = _Model(target, threads)
        self.draft = _Model(draft, threads) if draft else None


@pytest.fixture
def pair(tmp_path, warm_cache):
    t, d = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    t.write_bytes(b"GGUF target")
    d.write_bytes(b"GGUF draft")
    return _Session(t, d)


def _trained() -> KController:
    c = KController(8)
    for k, acc in [(4, 4), (4, 3), (0, 0), (6, 6), (6, 2), (0, 0)]:
        c.observe(k, k, acc, 0.002 * k, 0.010 + 0.003 * k)
    return c


def test_saved_record_warms_the_next_controller(pair):
    path = warmstart.save(_trained(), pair, "model", 0.0)
    assert path is not None and path.is_file()
    rec = json.loads(path.read_text())
    assert rec["schema"] == warmstart.SCHEMA and set(rec["drafters"]) == {"model"}
    assert set(rec["drafters"]["model"]["alpha"]) == {"greedy"}
    c = KController(8)
    assert warmstart.load_into(c, pair, "model", 0.0)
    assert c.draft_cost == pytest.approx(_trained().draft_cost)
    assert c.choose() == 0                       # the plain cost is measured afresh first,
    c.observe(0, 0, 0, 0.0, 0.010)
    assert c.choose() > 0 and c.alpha is None   # then no start-up probing; α is this run's only


def test_alpha_is_kept_per_drafter_and_temperature_band(pair):
    greedy, sampled = KController(8), KController(8)
    for _ in range(30):
        greedy.observe(4, 4, 4, 0.004, 0.02)
        sampled.observe(4, 4, 0, 0.004, 0.02)
    warmstart.save(greedy, pair, "model", 0.0)
    warmstart.save(sampled, pair, "model", 1.0)
    warmstart.save(sampled, pair, "lookup", 0.0)
    rec = warmstart.read(warmstart.session_key(pair))
    assert rec["drafters"]["model"]["alpha"]["greedy"]["alpha"] > 0.9
    assert rec["drafters"]["model"]["alpha"]["sampled"]["alpha"] < 0.5
    assert rec["drafters"]["lookup"]["alpha"]["greedy"]["alpha"] < 0.5


def test_calibration_records_alpha_with_its_tested_positions_as_trials(pair):
    cal = {"verify_cost": {"1": 0.01, "5": 0.02}, "sampling": {"temperature": 0.0}, "drafters": {
        "model": {"alpha": 0.79, "alpha_estimate": 0.8, "n_tested": 30, "n_drafted": 48, "draft_cost": 0.002},
        "lookup": {"alpha": None, "alpha_estimate": None, "n_tested": 0, "n_drafted": 0, "draft_cost": None}}}
    layers = {"target": -1, "draft": -1}
    path = warmstart.save_calibration(pair.target, pair.draft, layers, cal)[0]
    a = json.loads(path.read_text())["drafters"]["model"]["alpha"]["greedy"]
    # the estimate the predictions use, over tested positions (α's sample), not the 48 drafted
    assert a["alpha"] == 0.8 and a["trials"] == 30
    # A record written before trials counted tested positions holds the same α: still used.
    rec = json.loads(path.read_text())
    rec["drafters"]["model"]["alpha"]["greedy"]["trials"] = 48
    path.write_text(json.dumps(rec))
    c = KController(8)
    assert warmstart.apply(c, warmstart.read(warmstart.pair_key(pair.target, pair.draft, layers)), "model", 0.0)


def test_another_thread_count_or_file_is_another_record(pair, tmp_path):
    warmstart.save(_trained(), pair, "model", 0.0)
    other = _Session(pair.target.path, pair.draft.path, threads=7)
    assert warmstart.read(warmstart.session_key(other)) is None
    time.sleep(1.1)  # mtime has a one-second grain in the key
    pair.target.path.write_bytes(b"GGUF target, replaced by a new download")
    assert warmstart.read(warmstart.session_key(pair)) is None


@pytest.mark.parametrize("damage", ["not json", "[]", '{"schema": "localspec.controller/0"}', "foreign",
                                    "stale", "negative cost", "alpha above one"])
def test_damaged_records_are_ignored_with_a_note(pair, damage, monkeypatch, capfd):
    path = warmstart.save(_trained(), pair, "model", 0.0)
    rec = json.loads(path.read_text())
    if damage == "foreign":
        rec["key"]["host"] = "another-machine"
    elif damage == "stale":
        rec["saved"] = time.time() - 40 * 86400
    elif damage == "negative cost":
        rec["verify"]["1"] = -0.01
    elif damage == "alpha above one":
        rec["drafters"]["model"]["alpha"]["greedy"]["alpha"] = 1.5
    text = damage if damage in ("not json", "[]") or damage.startswith("{") else json.dumps(rec)
    path.write_text(text)
    monkeypatch.setenv("LOCALSPEC_VERBOSE", "1")
    c = KController(8)
    assert not warmstart.load_into(c, pair, "model", 0.0)
    assert "warm start" in capfd.readouterr().err
    assert c.choose() == 4   # cold: the start-up measuring step
    assert warmstart.save(_trained(), pair, "model", 0.0) == path   # and the next save replaces it
    assert warmstart.read(warmstart.session_key(pair)) is not None


def test_unwritable_cache_is_never_fatal(pair, warm_cache):
    warm_cache.parent.mkdir(parents=True, exist_ok=True)
    warm_cache.write_text("a file where the cache folder should be")
    assert warmstart.save(_trained(), pair, "model", 0.0) is None
    assert not warmstart.load_into(KController(8), pair, "model", 0.0)


def test_turned_off_reads_and_writes_nothing(pair, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_NO_WARM_START", "1")
    assert warmstart.save(_trained(), pair, "model", 0.0) is None
    assert not warmstart.directory().exists() or not list(warmstart.directory().iterdir())


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(machine, "usable_cpus", lambda: 2)


QUIET = machine.Usage(5.0, 1.9, 0.1)
HOGGED = machine.Usage(5.0, 1.3, 1.0)         # a CPU hog on one of the 2 cores
STARVED = machine.Usage(5.0, 0.8, None)       # no /proc/stat: the 2 threads got 40% of their cores


@pytest.mark.parametrize("run", [HOGGED, STARVED], ids=["other work on a core", "low cpu share"])
def test_a_run_on_a_loaded_machine_keeps_its_alpha_but_not_its_timings(pair, two_cpus, run):
    quiet = warmstart.save(_trained(), pair, "model", 0.0, run=QUIET)
    before = json.loads(quiet.read_text())
    slow = KController(8)
    for _ in range(20):
        slow.observe(4, 4, 4, 0.02 * 4, 0.3)    # 10× the quiet run's costs, every draft accepted
    warmstart.save(slow, pair, "model", 0.0, run=run)
    after = json.loads(quiet.read_text())
    assert after["verify"] == before["verify"] and after["measured"] == before["measured"]
    assert after["drafters"]["model"]["draft_cost"] == before["drafters"]["model"]["draft_cost"]
    assert after["drafters"]["model"]["alpha"]["greedy"]["alpha"] > before["drafters"]["model"]["alpha"]["greedy"]["alpha"]
    assert before["measured"] == {"seconds": 5.0, "threads": 2, "cpu_share": 0.95, "other_cores": 0.1}


def test_a_loaded_run_writes_no_record_of_timings_where_none_was(pair, two_cpus):
    path = warmstart.save(_trained(), pair, "model", 0.0, run=HOGGED)
    assert path is None or json.loads(path.read_text())["verify"] == {}
    c = KController(8)
    assert not warmstart.load_into(c, pair, "model", 0.0)
    assert c.choose() == 4    # cold: nothing of that run's timings to start from
    assert warmstart.save(_trained(), pair, "none", 0.0, run=HOGGED) is None   # plain: nothing else to keep


def test_without_a_window_given_other_work_since_load_into_decides(pair, two_cpus, monkeypatch):
    """bench, serve and chat save without a window of their own: the span since the controller's
    `load_into` (or last save) is judged by other work only, as it may hold idle time."""
    c = _trained()
    warmstart.load_into(c, pair, "model", 0.0)
    monkeypatch.setattr(machine, "usage", lambda before, after=None: HOGGED)
    assert warmstart.save(c, pair, "model", 0.0) is None or not warmstart.read(warmstart.session_key(pair))["verify"]
    monkeypatch.setattr(machine, "usage", lambda before, after=None: machine.Usage(60.0, 0.05, 0.1))  # idle
    assert warmstart.save(c, pair, "model", 0.0) is not None
    assert warmstart.read(warmstart.session_key(pair))["verify"]


def _jittery(spread: float) -> KController:
    """A controller whose timings of each size stray about `spread` (a share) from step to step:
    load that came and went within the run, which the machine's counters over the run miss."""
    c = KController(8)
    for i in range(40):
        f = 1 + spread * (1 if i % 2 else -1)
        k = 4 if i % 3 else 0
        c.observe(k, k, k, 0.002 * k * f, (0.010 + 0.003 * k) * f)
    return c


def test_an_erratic_run_saves_its_alpha_but_not_its_timings(pair):
    assert _trained().verify_costs.jitter is None      # too few timings compared to tell
    steady = _jittery(0.02)
    assert steady.verify_costs.jitter < warmstart.JITTER_STEADY
    path = warmstart.save(steady, pair, "model", 0.0, run=QUIET)
    rec = json.loads(path.read_text())
    assert rec["weight"] == 1.0 and rec["verify"] and rec["measured"]["jitter"] < warmstart.JITTER_STEADY
    erratic = _jittery(0.6)
    assert erratic.verify_costs.jitter > warmstart.JITTER_ERRATIC
    warmstart.save(erratic, pair, "model", 0.0, run=QUIET)
    after = json.loads(path.read_text())
    assert after["verify"] == rec["verify"] and after["weight"] == 1.0
    assert after["drafters"]["model"]["draft_cost"] == rec["drafters"]["model"]["draft_cost"]


def test_a_somewhat_erratic_run_is_saved_with_less_weight_and_believed_less(pair):
    c = _jittery(0.12)
    w = warmstart.steadiness(c.verify_costs.jitter)
    assert warmstart.MIN_WEIGHT <= w < 0.9
    rec = json.loads(warmstart.save(c, pair, "model", 0.0, run=QUIET).read_text())
    assert rec["weight"] == pytest.approx(w, abs=1e-3)
    warm, full = KController(8), KController(8)
    warmstart.apply(warm, rec, "model", 0.0)
    warmstart.apply(full, rec | {"weight": 1.0}, "model", 0.0)
    assert warm.record_weight == pytest.approx(w, abs=1e-3) and full.record_weight == pytest.approx(1.0, abs=1e-3)
    assert warm.verify_costs.trust < full.verify_costs.trust        # untimed sizes forgotten sooner
    assert warm.acceptance._w < full.acceptance._w                  # its α is worth fewer trials
    # A run weighing less than half of the record does not overwrite the record's timings.
    before = json.loads(warmstart.save(_jittery(0.02), pair, "model", 0.0, run=QUIET).read_text())
    shaky = _jittery(0.18)
    assert warmstart.MIN_WEIGHT <= warmstart.steadiness(shaky.verify_costs.jitter) < 0.5
    warmstart.save(shaky, pair, "model", 0.0, run=QUIET)
    after = warmstart.read(warmstart.session_key(pair))
    assert after["verify"] == before["verify"] and after["weight"] == 1.0


def test_a_records_weight_halves_every_half_life(pair):
    rec = json.loads(warmstart.save(_jittery(0.02), pair, "model", 0.0, run=QUIET).read_text())
    later = rec["saved"] + warmstart.HALF_LIFE_DAYS * 86400
    assert warmstart.weight(rec, now=later) == pytest.approx(0.5 * rec["weight"])


def test_the_draft_models_catch_up_costs_are_kept(pair):
    """Without them a warm run's first catch-up is split by the prior's slope: half of re-reading
    16 missed tokens was counted as drafting, which doubled the draft cost the record's test saw."""
    c = _trained()
    for n, t in ((1, 0.004), (2, 0.005), (16, 0.020), (8, 0.012)):
        c.first_decode.observe(n, t)
    rec = json.loads(warmstart.save(c, pair, "model", 0.0, run=QUIET).read_text())
    assert rec["drafters"]["model"]["first_decode"]["16"] == pytest.approx(0.020)
    warm = KController(8)
    warmstart.apply(warm, rec, "model", 0.0)
    assert warm.first_decode.predict(16) == pytest.approx(c.first_decode.predict(16))
    warm.observe(0, 0, 0, 0.0, 2 * rec["verify"]["1"])    # today the machine runs at half speed
    assert warm.first_decode.predict(16) == pytest.approx(2 * c.first_decode.predict(16))


def test_a_records_sizes_that_no_run_re_times_are_dropped(pair):
    """Seen on a 128k-vocabulary pair: a record held drafting 1 token 12 ms and 3 tokens 59 ms
    beside 2 tokens 1.7 ms, which every run re-timed (its probes draft 2); the untimed lengths
    were written back run after run, fitted 24 ms a token, and kept the pair written off as
    hopeless. Verify sizes no run re-timed stayed in the file the same way (it merged by size).
    Dropped at once, a run held plain would leave the next a two-point line: each table keeps a
    size no run re-times for KEEP_RUNS saves, then drops it."""
    good = _trained()
    rec = json.loads(warmstart.save(good, pair, "model", 1.0, run=QUIET).read_text())
    model = rec["drafters"]["model"]
    on_file = set(rec["verify"])
    rec["verify"] |= {"2": 0.05, "11": 0.2}                       # a busy moment's sizes
    model["draft_by_n"] = {"1": 0.012, "2": 0.004, "3": 0.059, "7": 0.2}
    model["first_decode"] = {"1": 0.002, "9": 0.07, "40": 0.001}
    warmstart.path_for(rec["key"]).write_text(json.dumps(rec))
    c = KController(8)
    warmstart.apply(c, rec, "model", 1.0)
    assert c.draft_seconds(3)[3] > 0.05                          # the record's shape, believed at first
    verify_1 = rec["verify"]["1"]
    for step in range(c.verify_costs.trust + 8):                 # plain, and a 2-token draft now and then
        if step % 16 == 8:
            c.observe_verify(3, 1.4 * verify_1)
            c.first_decode.observe(4, 0.003)
            c.observe_draft(2, 1, 0.004)
        else:
            c.observe_verify(1, verify_1)
    assert c.draft_seconds(3)[3] == pytest.approx(0.006)          # 2 ms a token, as timed here
    untimed = {"verify": (on_file | {"2", "11"}) - {"1", "3"}, "draft_by_n": {"1", "3", "7"}, "first_decode": {"1", "9", "40"}}
    timed = {"verify": {"1", "3"}, "draft_by_n": {"2"}, "first_decode": {"4"}}
    for save in range(1, warmstart.KEEP_RUNS + 1):
        warmstart.save(c, pair, "model", 1.0, run=QUIET)
        after = warmstart.read(warmstart.session_key(pair))
        for field, sizes in untimed.items():
            table = after if field == "verify" else after["drafters"]["model"]
            kept = sizes if save < warmstart.KEEP_RUNS else set()
            assert set(table[field]) == timed[field] | kept, (field, save)
            assert table[field + "_age"] == {n: save for n in kept}, (field, save)
    assert after["drafters"]["model"]["draft_by_n"]["2"] == pytest.approx(0.004)   # as timed here


def test_a_draft_cost_fit_rests_on_the_lengths_timed_here_once_there_are_two():
    c = KController(8)
    c.warm_start({1: 0.01}, 0.002, draft_by_n={1: 0.002, 2: 0.004, 6: 0.3})   # 6 tokens: a busy moment
    c.observe_draft(2, 2, 0.004)
    assert c.draft_seconds(6)[6] > 0.1            # one length timed: the record's shape at today's level
    c.observe_draft(4, 4, 0.008)
    assert c.draft_seconds(6)[6] == pytest.approx(0.012)


def test_doctor_tells_what_a_record_decides(pair):
    from localspec.loading import record_view

    good = _trained()
    warmstart.save(good, pair, "model", 0.0, run=QUIET)
    shown = record_view.describe(warmstart.session_key(pair))
    assert shown["weight"] == pytest.approx(1.0, abs=1e-3) and shown["age_days"] < 0.01
    assert shown["decisions"]["model"]["greedy"]["k"] > 0 and shown["decisions"]["model"]["greedy"]["speedup"] > 1
    rec = warmstart.read(warmstart.session_key(pair))
    rec["drafters"]["model"]["draft_cost"] *= 30
    rec["drafters"]["model"]["draft_by_n"] = {n: 30 * t for n, t in rec["drafters"]["model"]["draft_by_n"].items()}
    plain = record_view.decision(rec, "model", "greedy")
    assert plain["k"] == 0 and plain["speedup"] < 1 and plain["retest_after"] > 0


def _generate(model_paths, *extra):
    """One `generate --json` run, in this process so that `machine.loaded` can be set (whether the
    machine the tests share is busy must not decide what they see)."""
    from typer.testing import CliRunner

    from localspec.cli.app import app

    args = ["generate", "Tell me about lighthouses.", "--target", str(model_paths[0]), "--draft",
            str(model_paths[1]), "--max-tokens", "16", "--temperature", "0", "--json", *(extra or THREADS)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# Records are kept per thread count, and without --threads each run fits its count to the work on
# the machine at its start: runs that must share a record name one count, whatever else runs.
THREADS = ("--threads", "1")


def _machine_is(monkeypatch, busy: str | None) -> None:
    monkeypatch.setattr(machine, "loaded", lambda run, threads, cpus=None: busy)


@pytest.fixture
def quiet(monkeypatch):
    _machine_is(monkeypatch, None)


def test_generate_on_a_loaded_machine_leaves_no_timings_to_start_from(model_paths, warm_cache, monkeypatch):
    _machine_is(monkeypatch, "other work kept 1.0 of the 2 cores busy")
    assert _generate(model_paths)["warm_start"] is False
    assert _generate(model_paths)["warm_start"] is False
    for f in (warm_cache / "controller").glob("*.json"):
        assert json.loads(f.read_text())["verify"] == {}


def test_generate_starts_warm_from_the_second_run(model_paths, warm_cache, quiet):
    assert _generate(model_paths)["warm_start"] is False
    files = list((warm_cache / "controller").glob("*.json"))
    assert len(files) == 1
    second = _generate(model_paths)
    assert second["warm_start"] is True
    assert _generate(model_paths, *THREADS, "--no-warm-start")["warm_start"] is False


def test_doctor_shows_and_forgets_the_record(model_paths, warm_cache, quiet):
    _generate(model_paths)
    args = ["doctor", "--target", str(model_paths[0]), "--draft", str(model_paths[1]), "--seconds", "0",
            *THREADS, "--json"]
    run = lambda *x: subprocess.run(CLI + args + list(x), capture_output=True, text=True, timeout=300)  # noqa: E731
    shown = json.loads(run().stdout)["warm_start"]
    assert shown["usable"] and "model" in shown["drafters"]
    gone = json.loads(run("--forget").stdout)["warm_start"]
    assert gone["forgotten"] and not gone["exists"]
    assert not list((warm_cache / "controller").glob("*.json"))
