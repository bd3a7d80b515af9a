"""The thread count: one rule (machine.choose_threads) for generate, chat, serve, bench and doctor,
fitted to the cores other work leaves free, and reported where the run reports itself."""

from __future__ import annotations

import pytest

from localspec import machine


@pytest.mark.parametrize("cpus, other, reserve, threads", [
    (2, 0.0, 0, 2),     # idle: the default, every core up to 4
    (2, None, 0, 2),    # unmeasured: the default
    (2, 1.0, 0, 1),     # a CPU hog on one of the 2 cores: 1 thread, not 2 that wait on each other
    (2, 0.4, 0, 2),     # under half a core busy: still both
    (2, 0.6, 0, 1),
    (2, 2.0, 0, 1),     # never below 1
    (2, 0.0, 1, 1),     # chat and serve leave a core to the screen / the event loop
    (2, 1.0, 1, 1),
    (4, 1.0, 0, 3),
    (4, 0.0, 1, 3),
    (8, 0.0, 0, 4),     # half the logical CPUs on bigger machines...
    (8, 0.0, 1, 4),     # ...where the reserve comes out of the free cores, not the default's
    (16, 4.0, 0, 8),    # a build on 4 of 16 CPUs still leaves the default's 8 free
    (16, 10.0, 0, 6),
])
def test_the_default_fits_the_cores_other_work_leaves_free(cpus, other, reserve, threads):
    plan = machine.choose_threads(None, reserve=reserve, other=other, cpus=cpus)
    assert plan.threads == threads
    assert plan.requested is None and plan.warning is None


def test_an_explicit_count_is_kept_and_warned_about_in_one_line_when_cores_are_taken():
    plan = machine.choose_threads(2, other=1.0, cpus=2)
    assert plan.threads == 2 and plan.requested == 2
    assert "\n" not in plan.warning
    assert "1.0 of the 2 cores" in plan.warning and "--threads 2" in plan.warning and "use 1" in plan.warning
    assert machine.choose_threads(1, other=1.0, cpus=2).warning is None   # it fits the free core
    assert machine.choose_threads(2, other=0.1, cpus=2).warning is None   # nothing else busy
    assert machine.choose_threads(2, reserve=1, other=0.0, cpus=2).warning is None   # only our own screen


def test_the_choice_reports_itself_as_json():
    import json

    plan = machine.choose_threads(None, reserve=1, other=0.123, cpus=2)
    assert json.loads(json.dumps(plan.as_dict())) == {
        "threads": 1, "requested": None, "cpus": 2, "other_cores": 0.1, "reserve": 1}


# ---- the choice applied: Session.load, generate --json, the help ------------------------------------

@pytest.fixture
def machine_with(monkeypatch):
    """A 2-CPU machine on which other work keeps `other` cores busy while the models load."""
    def set_other(other):
        monkeypatch.setattr(machine, "usable_cpus", lambda: 2)
        monkeypatch.setattr(machine, "other_now", lambda since=None: other)
    return set_other


def _llama_threads(model) -> int:
    import llama_cpp

    return llama_cpp.llama_n_threads(model._ctx)


@pytest.mark.parametrize("other, reserve, threads", [(0.0, 0, 2), (1.0, 0, 1), (0.0, 1, 1)],
                         ids=["idle", "one core taken", "chat leaves a core"])
def test_the_session_fits_its_threads_once_the_models_have_loaded(model_paths, machine_with, other, reserve, threads):
    from localspec.loading.session import LoadConfig, Session

    machine_with(other)
    notices = []
    cfg = LoadConfig(target=str(model_paths[0]), draft=str(model_paths[1]), n_ctx=256, reserve_cores=reserve)
    session = Session.load(cfg, notices.append)
    try:
        assert session.target.n_threads == session.draft.n_threads == threads
        assert _llama_threads(session.target) == _llama_threads(session.draft) == threads   # llama.cpp's own
        assert session.threads.as_dict() == {"threads": threads, "requested": None, "cpus": 2,
                                             "other_cores": other, "reserve": reserve}
        assert not [n for n in notices if "threads" in n]
    finally:
        session.close()


def test_an_explicit_count_is_kept_with_one_line_when_other_work_takes_its_cores(model_paths, machine_with):
    from localspec.loading.session import LoadConfig, Session

    machine_with(1.0)
    notices = []
    session = Session.load(LoadConfig(target=str(model_paths[0]), drafter="none", n_ctx=256, threads=2), notices.append)
    try:
        assert session.target.n_threads == _llama_threads(session.target) == 2
        assert notices == [f"localspec: {machine.choose_threads(2, other=1.0, cpus=2).warning}"]
    finally:
        session.close()


def test_generate_json_reports_the_threads_and_the_cores_it_got(model_paths, machine_with):
    import json

    from typer.testing import CliRunner

    from localspec.cli.app import app

    machine_with(1.0)
    r = CliRunner().invoke(app, ["generate", "Hello", "--target", str(model_paths[0]), "--drafter", "none",
                                 "--max-tokens", "4", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["threads"] == 1 and out["thread_choice"]["other_cores"] == 1.0
    assert out["machine"]["threads"] == 1 and out["machine"]["cpu_share"] > 0 and "busy" in out["machine"]


@pytest.mark.parametrize("command, reserve", [("generate", 0), ("bench", 0), ("doctor", 0), ("chat", 1), ("serve", 1)])
def test_each_command_shows_its_real_default(command, reserve):
    """The number in --threads' help is what the command runs with on this machine when nothing
    else does (serve and chat leave a core to their event loop and screen)."""
    from typer.testing import CliRunner

    from localspec.cli import options as cli_options
    from localspec.cli.app import app

    text = " ".join(CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output.split())
    want = machine.choose_threads(None, reserve=reserve, other=0.0).threads
    assert f"CPU threads (default: {want} here" in text
    assert cli_options.threads_default(command) == want
