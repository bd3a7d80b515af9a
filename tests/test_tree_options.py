"""`--tree auto|off|SHAPE`: parsed once, refused in one line with exit 2, reaching every
DecodeConfig and both models' sequences (`ModelConfig.n_seq`); the tree numbers of RunStats,
`generate --json`, the bench report and the chat. Synthetic steps and stand-in sessions: no model
loads here, except one short real `generate --json`."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from localspec.bench import report as bench_report, run as bench
from localspec.cli import options as o
from localspec.cli.app import app
from localspec.config import MAX_BRANCHES, ConfigError, DecodeConfig, SamplingConfig
from localspec.decoding.decoder import Step
from localspec.decoding.stats import RunStats, tree_label

runner = CliRunner()
COMMANDS = ("generate", "chat", "serve", "bench")


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in result.output, err
    return err


def args_for(command: str, tree: str) -> list[str]:
    return [command, "--tree", tree, *(["hi"] if command == "generate" else [])]


# ---- the option -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value, needle", [
    ("x", "--tree must be auto, off or a branching"), ("3,x", "--tree must be"), ("", "--tree must be"),
    ("2,,1", "--tree must be"), ("0", "every branching must be >= 1"), ("2,-1", ">= 1"),
    ("3,3", f"9 branches, at most {MAX_BRANCHES}"),
])
def test_a_bad_tree_is_one_error_line_and_exit_2(command, value, needle):
    assert needle in one_error_line(runner.invoke(app, args_for(command, value)))


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_tree_with_the_one_default(command):
    cmd = typer.main.get_command(app).commands[command]
    (param,) = [p for p in cmd.params if "--tree" in getattr(p, "opts", ())]
    assert param.default == o.TREE_DEFAULT == "auto"


@pytest.mark.parametrize("value, tree, n_seq", [
    ("auto", "auto", MAX_BRANCHES), ("off", "off", 1), ("OFF", "off", 1), ("3,2,1,1", (3, 2, 1, 1), 6),
    ("4", (4,), 4), (" 2, 2 ", (2, 2), 4),
])
def test_resolve_gives_the_tree_and_both_models_its_sequences(value, tree, n_seq):
    opts = o.resolve({}, tree=value)
    assert opts.tree == tree and opts.load.n_seq == n_seq == DecodeConfig(tree=tree).n_seq
    assert tree_label(opts.tree) == ("auto" if value == "auto" else "off" if tree == "off" else
                                     ",".join(map(str, tree)))


def test_a_command_without_trees_loads_one_sequence():
    """doctor resolves without --tree: chains, one sequence per model."""
    opts = o.resolve({})
    assert opts.tree == "off" and opts.load.n_seq == 1


# ---- the setting reaches the session and the decoder ------------------------------------------------


class Loaded(Exception):
    """Raised by a stand-in once it has seen what a command would load or run."""


def test_generate_hands_the_tree_to_decode_config_and_the_load(monkeypatch):
    from localspec.cli import app as cli_app

    seen = {}

    def fake_generate(text, opts, decode, *args, **kwargs):
        seen.update(opts=opts, decode=decode)

    monkeypatch.setattr(cli_app, "_generate", fake_generate)
    result = runner.invoke(app, ["generate", "hi", "--tree", "3,2"])
    assert result.exit_code == 0, result.output
    assert seen["decode"].tree == (3, 2) and seen["opts"].load.n_seq == 6
    runner.invoke(app, ["generate", "hi"])
    assert seen["decode"].tree == "auto" and seen["opts"].load.n_seq == MAX_BRANCHES
    runner.invoke(app, ["generate", "hi", "--tree", "off"])
    assert seen["decode"].tree == "off" and seen["opts"].load.n_seq == 1


class FakeModel:
    recurrent = False
    n_threads = 1

    def __init__(self, cfg):
        self.cfg = cfg

    def set_threads(self, n):
        self.n_threads = n

    def close(self):
        pass


@pytest.mark.parametrize("draft", ["d.gguf", None])
def test_session_loads_both_models_with_the_trees_sequences(monkeypatch, draft):
    from localspec.loading import session as loading

    made = []
    monkeypatch.setattr(loading, "resolve_files", lambda cfg, notice=None: cfg)
    monkeypatch.setattr(loading, "_load", lambda cfg: made.append(cfg) or FakeModel(cfg))
    monkeypatch.setattr(loading.vocab, "check", lambda target, draft: None)
    cfg = loading.LoadConfig(target="t.gguf", draft=draft, drafter="auto" if draft else "lookup", threads=1,
                             n_seq=o.resolve({}, tree="2,2").load.n_seq)
    loading.Session.load(cfg)
    assert [m.path for m in made] == ["t.gguf", *([draft] if draft else [])]
    assert [m.n_seq for m in made] == [4] * len(made)   # lookup trees need the target's sequences too
    with pytest.raises(ConfigError, match="n_seq"):
        loading.LoadConfig(n_seq=0)


def test_bench_runs_with_the_tree_and_loads_its_sequences(monkeypatch):
    from localspec.loading import session as loading

    seen = {}
    monkeypatch.setattr(loading.Session, "load", classmethod(
        lambda cls, cfg, notice=None: seen.update(n_seq=cfg.n_seq) or SimpleNamespace(close=lambda: None)))

    def fake_run(session, suite, options, **kwargs):
        seen["tree"] = options.tree
        raise ConfigError("stand-in")

    monkeypatch.setattr(bench, "run_bench", fake_run)
    one_error_line(runner.invoke(app, ["bench", "--tree", "2,1,1", "--category", "chat"]))
    assert seen == {"n_seq": 2, "tree": (2, 1, 1)}


def test_serve_defaults_carry_the_tree_into_every_request(monkeypatch):
    pytest.importorskip("starlette")
    from localspec.loading import session as loading
    from localspec.serve import api, app as serve_app

    seen = {}
    monkeypatch.setattr(loading.Session, "load", classmethod(
        lambda cls, cfg, notice=None: seen.update(n_seq=cfg.n_seq) or SimpleNamespace(close=lambda: None)))

    def fake_server(session, defaults, **kwargs):
        seen["tree"] = defaults.tree
        raise ConfigError("stand-in")

    monkeypatch.setattr(serve_app, "Server", fake_server)
    one_error_line(runner.invoke(app, ["serve", "--port", "0", "--tree", "4"]))
    assert seen == {"n_seq": 4, "tree": (4,)}
    decode = api._decode({"max_tokens": 5}, api.Defaults(SamplingConfig(), tree=(2, 2)))
    assert decode.tree == (2, 2) and decode.max_tokens == 5
    assert api._decode({}, api.Defaults(SamplingConfig())).tree == "off"


def test_the_chat_decodes_every_reply_with_its_tree():
    pytest.importorskip("textual")
    from tests.test_tui_support import GREEDY, FakeSession, ScriptedChat

    class Recording(ScriptedChat):
        def _stream(self, drafter, prompt, sampling, decode, controller):
            self.decode = decode
            return super()._stream(drafter, prompt, sampling, decode, controller)

    chat = Recording(FakeSession(), sampling=GREEDY, tree=(3, 1))
    chat.reply(chat.prepare("hello"), lambda chunk: None)
    assert chat.decode.tree == (3, 1)


# ---- the numbers ------------------------------------------------------------------------------------


def step(n_drafted: int, n_accepted: int, *, nodes: int = 0, branches: int = 1, trials=()) -> Step:
    return Step(tokens=tuple(range(n_accepted + 1)), from_draft=(True,) * n_accepted + (False,),
                k=n_drafted, n_drafted=n_drafted, n_accepted=n_accepted, t_draft=0.001, t_verify=0.01,
                t_python=0.001, n_nodes=nodes, branches=branches, sibling_trials=tuple(trials))


def tree_steps() -> list[Step]:
    return [
        # a chain: 3 drafted, 2 accepted (rank 0 tried three times, the last rejected)
        step(3, 2, nodes=3, trials=[(0, True), (0, True), (0, False)]),
        # a tree of 7 nodes, 4 branches, depth 3: depth 1's first choice accepted; at depth 2 the first
        # rejected, the second accepted; at depth 3 both rejected (accepted depth 2)
        step(3, 2, nodes=7, branches=4, trials=[(0, True), (0, False), (1, True), (0, False), (1, False)]),
        # a tree of 5 nodes, 2 branches: both siblings rejected at depth 1
        step(4, 0, nodes=5, branches=2, trials=[(0, False), (1, False)]),
        step(0, 0),   # plain
    ]


def test_run_stats_aggregate_the_tree_steps_and_acceptance_by_rank():
    st = RunStats()
    for s in tree_steps():
        st.add(s)
    t = st.tree("3,2,1,1")
    assert t == {"setting": "3,2,1,1", "tree_steps": 2, "mean_nodes": 6.0, "mean_accepted_depth": 1.0,
                 "acceptance_by_rank": [pytest.approx(3 / 7), pytest.approx(1 / 3)]}
    assert st.tree()["tree_steps"] == 2 and "setting" not in st.tree()
    # trees count in α by depth; rows per verify count every node
    assert st.n_nodes == 3 + 7 + 5 and st.host()["target_ms_per_row"] == pytest.approx(1000 * 0.004 / (4 + 15))


def test_a_chain_only_run_has_no_tree_numbers_and_a_chain_without_nodes_counts_its_drafts():
    st = RunStats()
    st.add(step(3, 1))           # a Step that leaves n_nodes at 0: its drafted tokens are its nodes
    st.add(step(0, 0))
    assert st.tree((2,)) == {"setting": "2", "tree_steps": 0, "mean_nodes": None, "mean_accepted_depth": None,
                             "acceptance_by_rank": []}
    assert st.n_nodes == 3


def test_a_rank_never_tried_reads_none():
    st = RunStats()
    st.add(step(2, 0, nodes=4, branches=3, trials=[(2, False)]))
    assert st.acceptance_by_rank() == [None, None, 0.0]


def test_generate_json_has_the_tree_key_and_the_summary_line_names_the_tree():
    from localspec.cli.app import summary_line

    cmd = [sys.executable, "-m", "localspec", "generate", "Name three colours.", "--max-tokens", "8",
           "--temperature", "0", "--drafter", "lookup", "--tree", "2,1", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    t = data["tree"]
    assert list(t) == ["setting", "tree_steps", "mean_nodes", "mean_accepted_depth", "acceptance_by_rank"]
    assert t["setting"] == "2,1" and isinstance(t["tree_steps"], int) and 0 <= t["tree_steps"] <= data["n_steps"]
    assert (t["mean_nodes"] is None) == (t["tree_steps"] == 0)
    assert all(a is None or 0 <= a <= 1 for a in t["acceptance_by_rank"])
    line = summary_line(data)
    assert line.endswith("tree 2,1" + (f" ({t['tree_steps']} of {data['n_steps']} steps)" if t["tree_steps"] else ""))


# ---- bench: tree against chain ----------------------------------------------------------------------


def test_bench_variants_gain_a_tree_twin_beside_the_session_drafters():
    assert [v.key for v in bench.spec_variants("model", [2, None], "off")] == ["2", "auto"]
    twins = bench.spec_variants("model", [2, None], (3, 1))
    assert [(v.key, v.tree, v.chain) for v in twins] == [
        ("2", "off", None), ("2+tree", (3, 1), "2"), ("auto", "off", None), ("auto+tree", (3, 1), "auto")]
    assert [v.name for v in twins][1] == "spec:2+tree"
    # under auto, the drafters alone stay chains: only auto's variant gets a twin
    assert [v.key for v in bench.spec_variants("auto", [None], "auto")] == ["model", "lookup", "auto", "auto+tree"]


def tree_report(chain_seconds: float, tree_seconds: float) -> dict:
    """One prompt run plainly, as chains and as trees (through the real summaries and table)."""
    variants = [bench.Variant("plain", "plain")] + bench.spec_variants("lookup", [None], (2, 1))
    runs = []
    for v in variants:
        if v.kind == "plain":
            steps, seconds = [step(0, 0)] * 12, 0.12
        elif v.chain is None:
            steps, seconds = [step(2, 1, nodes=2, trials=[(0, True), (0, False)])] * 6, chain_seconds
        else:
            steps, seconds = [step(2, 2, nodes=4, branches=2, trials=[(0, False), (1, True), (0, True)])] * 4, tree_seconds
        runs.append(bench.Run(v, 0, 0, 10, [t for s in steps for t in s.tokens], steps, 0.0, seconds, "length"))
    config = {"target": "t.gguf", "draft": None, "drafter": "lookup", "temperature": 0.0, "top_k": 40,
              "top_p": 0.95, "min_p": 0.05, "seed": 1, "max_tokens": 12, "n_prompts": 1, "repeat": 1,
              "threads": 1, "chat": True, "reference_lookup_tokens": None, "tree": "2,1"}
    return {"config": config, "categories": {"chat": bench_report.group(runs, variants, {0}, True)},
            "overall": bench_report.group(runs, variants, {0}, True)}


def test_bench_report_sets_the_trees_against_their_chain():
    r = tree_report(chain_seconds=0.10, tree_seconds=0.08)
    spec = r["overall"]["spec"]
    assert list(spec) == ["auto", "auto+tree"]
    chain, tree = spec["auto"], spec["auto+tree"]
    assert chain["chain"] is None and chain["against_chain"] is None
    assert chain["tree"]["setting"] == "off" and chain["tree"]["tree_steps"] == 0
    assert tree["chain"] == "auto" and tree["tree"] == {
        "setting": "2,1", "tree_steps": 4, "mean_nodes": 4.0, "mean_accepted_depth": 2.0,
        "acceptance_by_rank": [pytest.approx(4 / 8), 1.0]}
    vs = tree["against_chain"]
    assert vs["tokens_per_second"] == pytest.approx((12 / 0.08) / (12 / 0.10))
    assert vs["tokens_per_second_median"] == pytest.approx(1.25)
    assert vs["tokens_per_pass"] == pytest.approx(3.0 / 2.0)
    table = bench_report.format_report(r)
    assert "speculative k=auto (adaptive, one controller across the suite) · tree 2,1" in table
    head, *rows = table.split("tree against chain (auto+tree against auto")[1].splitlines()[1:4]
    assert head.split()[:3] == ["category", "chain", "t/s"]
    overall = [x for x in rows if x.startswith("overall")][0].split()
    assert overall[1:3] == ["120.0", "150.0"] and overall[3] == "1.25×" and "4/4" in overall
    assert "acceptance by sibling rank (0 = first choice): 0.50 1.00" in table


# ---- the chat: a tree row once a step verified one ----------------------------------------------------


def test_the_chat_panel_shows_tree_steps_only_once_a_step_verified_a_tree():
    pytest.importorskip("textual")
    from localspec_tui.chat import LiveStats
    from localspec_tui.widgets import compact, panel_rows

    settings = {"drafter": "auto", "drafter_label": "auto", "k": None, "temperature": 0.0}
    live = LiveStats()
    live.add(step(3, 2, nodes=3))
    labels = lambda view: [label for label, _ in panel_rows(view, settings)[1]]  # noqa: E731
    assert "tree steps" not in labels(live.view()) and "tree" not in compact(live.view(), settings).plain
    live.add(step(3, 2, nodes=7, branches=4))
    view = live.view()
    assert (view["tree_steps"], view["n_steps"], view["tree_now"]) == (1, 2, True)
    rows = dict(panel_rows(view, settings)[1])
    assert rows["tree steps"] == "1/2 ◆"
    live.add(step(0, 0))
    assert dict(panel_rows(live.view(), settings)[1])["tree steps"] == "1/3"
    assert "tree 1/3" in compact(live.view(), settings).plain


def test_the_line_under_a_reply_names_its_tree_steps():
    from localspec.chats.export import stats_line

    base = {"n_tokens": 12, "alpha": 0.75, "k": "auto"}
    assert "tree" not in stats_line(base)
    assert "tree 3/20 steps · k auto" in stats_line(base | {"tree_steps": 3, "n_steps": 20})


def test_a_saved_reply_records_its_tree_steps_only_when_it_had_some():
    pytest.importorskip("textual")
    from localspec_tui.saving import reply_stats

    chat = SimpleNamespace(session=SimpleNamespace(target=SimpleNamespace(path="t.gguf"), draft=None))
    for steps, recorded in (([step(2, 1)], {}), ([step(2, 1), step(2, 2, nodes=5, branches=2)],
                                                  {"tree_steps": 1, "n_steps": 2})):
        run = RunStats()
        for s in steps:
            run.add(s)
        reply = SimpleNamespace(stats=run, seconds=1.0, finish="stop", n_prompt=3, cached=0, continued=False,
                                drafter="auto")
        stats = reply_stats(reply, chat, SamplingConfig(seed=1), None)
        assert {key: stats[key] for key in ("tree_steps", "n_steps") if key in stats} == recorded
