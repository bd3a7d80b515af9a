"""`localspec bench`: the --json report has exactly the fields docs/bench-schema.md documents, with
their types; bad prompt files, categories and -k values fail in one line with exit 2.

The two real runs use the embedded default models with 2 prompts × 8 tokens and one thread each,
so the file takes seconds even while other work shares the CPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.bench import run as bench, report as bench_report
from localspec.bench.report import format_report
from localspec.cli.app import app
from localspec.config import ConfigError
from localspec.decoding.decoder import Step

SCHEMA_DOC = Path(__file__).resolve().parent.parent / "docs" / "bench-schema.md"
TWO_PROMPTS = (
    '{"category": "edit", "prompt": "Rename x to count in: def f(x):\\n    return x + x"}\n'
    "\n"
    '{"category": "chat", "prompt": "Say hello.", "max_tokens": 6}\n'
)
TINY = ["--max-tokens", "8", "--temperature", "0", "--seed", "3", "--n-ctx", "512", "--threads", "1", "--json"]

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["bench", *args])


# ---- the schema, read from the document -----------------------------------------------------------

WILDCARDS = {
    "<stats>": r"(?:overall|categories\.[^.]+)\.(?:plain|spec\.[^.]+)",
    "<group>": r"(?:overall|categories\.[^.]+)",
    "<category>": r"[^.]+",
    "<k>": r"[^.]+",
    "<ref>": r"(?:plain|lookup)",
    "<source>": r"(?:model|lookup|mixed|plain)",
}


def documented() -> dict[str, tuple[re.Pattern, str]]:
    """{documented path: (regex over report paths, type)} from the tables of docs/bench-schema.md."""
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+?) \|", SCHEMA_DOC.read_text(encoding="utf-8"), re.M)
    assert len(rows) > 80, "schema tables not found"
    out = {}
    for path, typ in rows:
        rx = re.escape(path).replace(r"\[\]", r"\[\d+\]")
        for name, sub in WILDCARDS.items():
            rx = rx.replace(re.escape(name), sub)
        out[path] = (re.compile(rx + r"\Z"), typ.strip())
    return out


def flatten(obj, path: str = "", element: bool = False):
    """(path, value) for every object, array and leaf (array elements by their fields only); a
    controller snapshot is one opaque object."""
    if path and not element:
        yield path, obj
    if isinstance(obj, dict) and not re.fullmatch(r"controllers\.[^.]+", path):
        for key, value in obj.items():
            yield from flatten(value, f"{path}.{key}" if path else key)
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        for i, value in enumerate(obj):
            yield from flatten(value, f"{path}[{i}]", element=True)


def type_ok(value, spec: str) -> bool:
    for alt in spec.split(" or "):
        alt = alt.strip()
        if alt.startswith("array of "):
            if isinstance(value, list) and all(type_ok(x, alt[len("array of "):]) for x in value):
                return True
        elif {
            "string": isinstance(value, str),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "boolean": isinstance(value, bool),
            "object": isinstance(value, dict),
            "array": isinstance(value, list),
            "null": value is None,
        }[alt]:
            return True
    return False


def check_schema(report: dict) -> set[str]:
    """Every field of the report is documented with a matching type; returns the documented paths seen."""
    doc = documented()
    seen = set()
    for path, value in flatten(report):
        hits = [p for p, (rx, _) in doc.items() if rx.match(path)]
        assert hits, f"undocumented field {path}"
        for p in hits:
            assert type_ok(value, doc[p][1]), f"{path} = {value!r} is not {doc[p][1]} (documented as {p})"
        seen.update(hits)
    return seen


# ---- two real runs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(model_paths, tmp_path_factory):
    """(model drafter with -k 2,auto and trees 2, lookup drafter with -k 3, chains only and --compare,
    the default auto with the default trees) on a 2-prompt file."""
    f = tmp_path_factory.mktemp("bench") / "two.jsonl"
    f.write_text(TWO_PROMPTS, encoding="utf-8")
    out = []
    for extra in (["--drafter", "model", "-k", "2,auto", "--tree", "2"],
                  ["--drafter", "lookup", "--target", str(model_paths[0]), "-k", "3", "--compare", "llama-cpp-python",
                   "--tree", "off"],
                  []):
        result = invoke("--prompts", str(f), *TINY, *extra)
        assert result.exit_code == 0, result.output
        out.append(json.loads(result.stdout))
    return out


def test_json_report_has_every_documented_field_with_its_type(reports):
    seen = set()
    for report in reports:
        seen |= check_schema(report)
    missing = set(documented()) - seen
    assert not missing, f"documented but never produced: {sorted(missing)}"


def test_model_drafter_report_contents(reports):
    r = reports[0]
    c = r["config"]
    assert r["schema"] == bench.SCHEMA
    assert c["drafter"] == "model" and c["draft"] and c["chat"] is True and c["compare"] is None
    assert c["k"] == [2, "auto"] and c["categories"] == ["edit", "chat"] and c["seed"] == 3 and c["tree"] == "2"
    keys = ["2", "2+tree", "auto", "auto+tree"]   # each k as chains, and with trees beside it
    assert list(r["categories"]) == ["edit", "chat"] and list(r["overall"]["spec"]) == keys
    assert r["overall"]["reference"] is None and set(r["controllers"]) == set(keys)
    # Interleaved: every prompt runs every variant before the next prompt, order alternating.
    order = ["plain", *(f"spec:{key}" for key in keys)]
    assert [(x["prompt"], x["variant"]) for x in r["runs"]] == [(0, v) for v in order] + [(1, v) for v in order[::-1]]
    assert all(x["n_tokens"] <= (8 if x["prompt"] == 0 else 6) for x in r["runs"])  # a line's max_tokens wins
    for key, s in r["overall"]["spec"].items():
        p = r["overall"]["plain"]
        assert s["speedup"] == pytest.approx(s["tokens_per_second"] / p["tokens_per_second"])
        assert sum(s["time_split"].values()) == pytest.approx(s["decode_seconds"], rel=1e-6)
        assert s["n_runs"] == 2 and s["n_tokens"] > 0
        assert 0 <= s["draft_efficiency"] <= s["alpha"] <= 1 and s["greedy_match"] is not None
        assert s["alpha"] == pytest.approx(s["n_accepted"] / s["n_tested"])
        assert s["draft_efficiency"] == pytest.approx(s["n_accepted"] / s["n_drafted"])
        assert s["bound"] is None or s["bound"]["speedup"] > 0
        assert s["tree"]["setting"] == ("2" if key.endswith("+tree") else "off")
        assert (s["chain"], s["against_chain"] is None) == ((key[:-5], False) if key.endswith("+tree") else (None, True))
    assert r["overall"]["spec"]["2"]["bound"]["k"] == 2 or r["overall"]["spec"]["2"]["bound"] is None
    table = format_report(r)
    for word in ("edit", "chat", "overall", "speculative k=2", "speculative k=auto", "bound", "draft eff",
                 "speculative k=2 · tree 2", "tree against chain (2+tree against 2", "tree against chain (auto+tree"):
        assert word in table


def test_compare_report_contents(reports):
    r = reports[1]
    assert r["config"]["drafter"] == "lookup" and r["config"]["draft"] is None
    assert r["config"]["reference_lookup_tokens"] == 3 and r["config"]["tree"] == "off"
    assert list(r["overall"]["spec"]) == ["3"] and "tree against chain" not in format_report(r)
    ref = r["overall"]["reference"]
    assert ref["plain"]["lookup_tokens"] is None and ref["lookup"]["lookup_tokens"] == 3
    assert ref["plain"]["n_runs"] == 2 and ref["plain"]["n_tokens"] > 0
    assert set(ref["lookup"]["localspec_speedup"]) == {"plain", "3"}
    assert len(r["runs"]) == 2 * 4
    assert "llama-cpp-python" in format_report(r)


def test_auto_runs_each_drafter_alone_beside_it(reports):
    r = reports[2]
    assert r["config"]["drafter"] == "auto" and r["config"]["k"] == ["auto"] and r["config"]["tree"] == "auto"
    spec = r["overall"]["spec"]
    # the default --tree auto: auto's variant runs as chains and with trees; the drafters alone as chains
    assert list(spec) == ["model", "lookup", "auto", "auto+tree"] and set(r["controllers"]) == set(spec)
    assert [x["variant"] for x in r["runs"] if x["prompt"] == 0] == [
        "plain", "spec:model", "spec:lookup", "spec:auto", "spec:auto+tree"]
    for key, s in spec.items():
        assert sum(d["steps"] for d in s["drafters"].values()) == s["n_steps"]
        assert sum(d["share"] for d in s["drafters"].values()) == pytest.approx(1.0)
        assert sum(s["accepted_from"].values()) == s["n_accepted"]
    assert set(spec["model"]["drafters"]) <= {"model", "plain"}
    assert set(spec["lookup"]["drafters"]) <= {"lookup", "plain"}
    assert set(spec["auto"]["accepted_from"]) <= {"model", "lookup"}
    table = format_report(r)
    assert "auto against each drafter alone" in table and "× best single" in table


# ---- bad input: one line, exit 2, before any model loads ----------------------------------------------


def assert_clean_failure(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in result.output, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(
    "line, why",
    [
        ('{"category": "chat", "prompt": "ok"', "invalid JSON"),
        ('{"category": "chat"}', 'missing "prompt"'),
        ('{"prompt": 42}', '"prompt" must be a string'),
        ('{"prompt": "hi", "max_tokens": "ten"}', '"max_tokens" must be an integer'),
        ('{"prompt": "hi", "max_tokens": true}', '"max_tokens" must be an integer'),
        ('{"prompt": "hi", "max_tokens": 0}', '"max_tokens" must be >= 1'),
        ('{"prompt": "hi", "category": ["a"]}', '"category" must be a string'),
        ('{"prompt": "   "}', '"prompt" is empty'),
        ('{"prompt": "hi", "max_token": 5}', "unknown key 'max_token'"),
        ('["hi"]', "expected an object"),
    ],
)
def test_bad_prompt_line_names_file_and_line(tmp_path, line, why):
    f = tmp_path / "suite.jsonl"
    f.write_text('{"category": "chat", "prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    assert_clean_failure(invoke("--prompts", str(f)), f"{f}:2:", why)


def test_missing_or_empty_prompts_file(tmp_path):
    assert_clean_failure(invoke("--prompts", str(tmp_path / "nope.jsonl")), "not found", "nope.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    assert_clean_failure(invoke("--prompts", str(empty)), "no prompts")


def test_unknown_category_lists_the_known_ones():
    err = assert_clean_failure(invoke("--category", "poetry"), "'poetry'")
    for c in ("code-edit", "grounded", "chat", "creative"):
        assert c in err


@pytest.mark.parametrize("args, needle", [
    (["-k", "1,x"], "draft tokens"), (["-k", "0"], "between 1 and 64"), (["-k", "2,,4"], "draft tokens"),
    (["--compare", "vllm"], "--compare"), (["--repeat", "0"], "repeat"), (["--max-tokens", "0"], "max-tokens"),
])
def test_bad_options_exit_2(args, needle):
    assert_clean_failure(invoke(*args), needle)


# ---- units ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, ks", [
    (None, [None]), ("auto", [None]), ("AUTO", [None]), ("4", [4]), ("1,2,4", [1, 2, 4]),
    (" 1, 2 ,8 ", [1, 2, 8]), ("auto,4", [None, 4]), ("2,2,auto,auto", [2, None]),
])
def test_k_sweep_parsing(text, ks):
    assert bench.parse_k_sweep(text) == ks


@pytest.mark.parametrize("text", ["", "x", "1,,2", "0", "-1", "1.5", "2,auto,z"])
def test_k_sweep_rejects(text):
    with pytest.raises(ConfigError):
        bench.parse_k_sweep(text)


def test_builtin_suite_has_five_categories_of_several_prompts():
    prompts = bench.load_prompts()
    by = {}
    for p in prompts:
        by.setdefault(p.category, []).append(p)
    assert list(by) == ["code-edit", "grounded", "chat", "creative", "json"]
    assert all(len(v) >= 3 for v in by.values())
    assert all(p.schema is not None for p in by["json"]) and not any(p.schema for p in prompts if p.category != "json")
    assert bench.select_categories(prompts, ["chat"]) == by["chat"]


def _step(k: int, n_acc: int, t_draft: float, t_verify: float) -> Step:
    return Step(tokens=tuple(range(n_acc + 1)), from_draft=(True,) * n_acc + (False,), k=k, n_drafted=k,
                      n_accepted=n_acc, t_draft=t_draft, t_verify=t_verify, t_python=0.0)


def _run(kind: str, steps, decode: float, prompt: int = 0) -> bench.Run:
    v = bench.Variant(kind, "plain" if kind == "plain" else "2", None if kind == "plain" else 2)
    return bench.Run(v, prompt, 0, 10, [t for s in steps for t in s.tokens], steps, 0.0, decode, "length")


def test_bound_uses_measured_costs_and_acceptance_by_position():
    plain = [_run("plain", [_step(0, 0, 0.0, 0.010)] * 4, 0.04)]
    # Bursty acceptance: half the steps accept both drafts, half reject the first. α = 4 accepted /
    # 6 tested positions (a rejection at position 1 leaves position 2 untested); accepted / drafted
    # would be 4 / 8.
    spec = [_run("spec", [_step(2, 2, 0.002, 0.012), _step(2, 0, 0.002, 0.012)] * 2, 0.056)]
    b = bench_report._bound(spec, plain, 2, 12)
    cost = (2 * 0.001 + 0.012) / 0.010
    assert b["k"] == 2 and b["alpha"] == pytest.approx(2 / 3)
    assert b["expected_tokens"] == pytest.approx(1 + 0.5 + 0.5)  # survival 0.5 at positions 1 and 2
    assert b["speedup"] == pytest.approx(2.0 / cost)
    assert b["speedup_iid"] == pytest.approx(19 / 9 / cost)  # (1 - (2/3)^3) / (1 - 2/3)
    assert b["t_verify_ms"] == pytest.approx(12.0) and b["t_draft_ms"] == pytest.approx(1.0)
    assert bench_report._bound(spec, [], 2, 12) is None
    # Adaptive: only batch sizes that were measured count (here b = 3, so k <= 2).
    assert bench_report._bound(spec, plain, None, 12)["k"] in (1, 2)


def test_median_speedup_ignores_one_disturbed_run():
    plain = [_run("plain", [_step(0, 0, 0, 0.01)] * 10, d, prompt=i) for i, d in enumerate((0.1, 0.1, 1.0))]
    spec = [_run("spec", [_step(0, 0, 0, 0.01)] * 10, 0.05, prompt=i) for i in range(3)]
    assert bench_report._median_speedup(spec, plain) == pytest.approx(2.0)


def _synthetic_auto_report(seconds: dict[str, float]) -> dict:
    """A report of one prompt run plainly and by model, lookup and auto (10 tokens each, in the
    given decode seconds), through the real summaries and table."""
    variants = [bench.Variant("plain", "plain")] + bench.spec_variants("auto", [None])
    runs = []
    for v in variants:
        steps = [_step(0, 0, 0.0, 0.01)] * 10 if v.kind == "plain" else [_step(1, 1, 0.01, 0.02)] * 5
        runs.append(bench.Run(v, 0, 0, 10, [t for s in steps for t in s.tokens], steps, 0.0,
                              seconds[v.key], "length"))
    config = {"target": "t.gguf", "draft": "d.gguf", "drafter": "auto", "temperature": 0.0, "top_k": 40,
              "top_p": 0.95, "min_p": 0.05, "seed": 1, "max_tokens": 10, "n_prompts": 1, "repeat": 1,
              "threads": 1, "chat": True, "reference_lookup_tokens": None}
    return {"config": config, "categories": {"chat": bench_report.group(runs, variants, {0}, True)},
            "overall": bench_report.group(runs, variants, {0}, True)}


def test_summary_says_plainly_when_speculation_lost():
    # The busy-machine run of issue 20: every speculative variant slower than plain, auto the best.
    table = format_report(_synthetic_auto_report({"plain": 1.0, "model": 2.0, "lookup": 3.0, "auto": 1.9}))
    head, *rows = table.split("auto against each drafter alone (auto)")[1].strip().splitlines()[:3]
    columns = re.split(r"\s{2,}", head.strip())
    assert columns[5:7] == ["× best single", "× plain"]
    overall = re.split(r"\s{2,}", rows[1].strip())
    assert overall[0] == "overall" and overall[5:7] == ["1.05×", "0.53×"]   # a "win" over the singles only
    assert "speculation lost: model 0.50× plain, lookup 0.33× plain, auto 0.53× plain" in table


def test_summary_says_nothing_of_a_loss_when_speculation_won():
    table = format_report(_synthetic_auto_report({"plain": 1.0, "model": 0.5, "lookup": 0.8, "auto": 0.4}))
    assert "speculation lost" not in table
    # the lead, right under the header: the best variant first, then the others
    assert table.splitlines()[3] == "best: auto 2.50× plain decoding (overall tokens/s); then model 2.00×, lookup 1.25×"
    assert max(len(line) for line in table.splitlines()) <= 120
    overall = [r for r in table.split("auto against each drafter alone")[1].splitlines() if r.startswith("overall")]
    assert re.split(r"\s{2,}", overall[0])[5:7] == ["1.25×", "2.50×"]


# ---- --constraints: JSON extraction five ways -----------------------------------------------------

def test_constraints_runs_the_json_prompts_five_ways(tmp_path):
    f = tmp_path / "one.jsonl"
    f.write_text('{"category": "json", "prompt": "Give {\\"ok\\": true} as JSON.", "max_tokens": 12, '
                 '"schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}\n')
    result = invoke("--constraints", "--prompts", str(f), "--no-warmup", *TINY)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    ways = report["ways"]
    assert list(ways) == ["plain", "spec", "plain+schema", "spec+schema, draft masked", "spec+schema, draft unmasked"]
    assert all(w["runs"] == 1 and w["tokens"] > 0 for w in ways.values())
    assert ways["plain+schema"]["valid_json"] == 1 and ways["spec+schema, draft masked"]["valid_json"] == 1
    assert ways["spec+schema, draft masked"]["vs_plain"] > 0


def test_constraints_without_a_schema_is_one_line(tmp_path):
    f = tmp_path / "two.jsonl"
    f.write_text(TWO_PROMPTS)
    assert_clean_failure(invoke("--constraints", "--prompts", str(f), *TINY), "needs prompts with a JSON schema")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "schema": [1]}\n')
    assert_clean_failure(invoke("--prompts", str(bad), *TINY), '"schema" must be an object')
