"""`localspec bench`: plain vs speculative decoding on a prompt suite, in one process, interleaved.

Every prompt is run once per variant (plain, one speculative variant per -k value, and optionally
llama-cpp-python's own paths) before the next prompt starts, in alternating order (A B C, C B A, …),
so drift of the machine (thermal, other load) falls on all variants alike. Each run starts from an
empty KV cache: prefill (the prompt minus its last token, into the target and, for a draft model,
into the draft) is timed apart; decoding is timed as wall-clock seconds from the first step to the
last, and tokens/s = generated tokens / those seconds. A short warm-up run per variant comes first
and is not counted.

With `--tree` other than off, the session's speculative variants run twice, interleaved like the
rest: as chains (tree off) and with that tree setting (key `<k>+tree`); the report sets each tree
variant against its chain twin. Under --drafter auto only auto's variants get a tree twin (the
drafters alone stay chains, to judge auto's choice).

Each speculative variant keeps ONE `KController` for the whole suite (all prompts, all repeats), as a
long-running server or chat session would: learned costs and acceptance carry over from prompt to
prompt, and its final state is reported. Plain and speculative runs of a prompt use the same seed
(seed + repeat index); at temperature 0 their outputs are compared token by token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from localspec.loading import controllers, warmstart
from .report import TREE_SUFFIX, group, run_json, version
from localspec.config import MAX_DRAFT, ConfigError, DecodeConfig, SamplingConfig
from localspec.decoding.controller import KController
from localspec.decoding.decoder import Step, generate_steps
from localspec.decoding.stats import tree_label
from localspec.loading.defaults import MAX_PROMPT_BYTES, read_capped, shown
from localspec.engine.grammar import schema_grammar
from localspec.machine import load_1min, usable_cpus

SCHEMA = "localspec.bench/2"   # 2: alpha = accepted / tested positions (was / drafted); draft_efficiency
KEYS = {"category": str, "prompt": str, "max_tokens": int, "system": str, "schema": dict}
COMPARE = ("llama-cpp-python",)
WARMUP_TOKENS = 16
REFERENCE_LOOKUP = 10       # LlamaPromptLookupDecoding's own default num_pred_tokens

Progress = Callable[[int, int, str], None]   # (runs done, runs in all, what runs next)


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    prompt: str
    max_tokens: int | None = None
    """Overrides --max-tokens for this prompt."""
    system: str | None = None
    source: str = ""
    schema: dict | None = None
    """A JSON schema: every run of this prompt is constrained by it (the `json` category)."""
    """"FILE:LINE", for messages."""


def builtin_prompts_file() -> Path:
    return Path(str(resources.files("localspec") / "data" / "bench_prompts.jsonl"))


def _json_type(value: object) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def load_prompts(path: str | Path | None = None) -> list[BenchPrompt]:
    """The suite in a JSONL file (None = the built-in one); a bad line raises a one-line ConfigError
    naming the file and line."""
    file = Path(path).expanduser() if path else builtin_prompts_file()
    try:
        with file.open("rb") as f:
            text = read_capped(f, MAX_PROMPT_BYTES, f"prompts file {file}").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"prompts file not found: {file}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read prompts file {file}: {e}") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{file}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise ConfigError(f"{where}: JSON nested too deeply (a prompt line is one flat object)") from None
        except ValueError as e:   # an integer past Python's 4300-digit limit
            raise ConfigError(f"{where}: invalid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ConfigError(f'{where}: expected an object like {{"category": "chat", "prompt": "..."}}, '
                              f"got {_json_type(obj)}")
        unknown = sorted(set(obj) - set(KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key {shown(unknown[0])} (allowed: {', '.join(KEYS)})")
        if "prompt" not in obj:
            raise ConfigError(f'{where}: missing "prompt"')
        for key, typ in KEYS.items():
            value = obj.get(key)
            if key in obj and (not isinstance(value, typ) or isinstance(value, bool)):
                want = {int: "an integer", dict: "an object"}.get(typ, "a string")
                raise ConfigError(f'{where}: "{key}" must be {want}, got {_json_type(value)}')
        if not obj["prompt"].strip():
            raise ConfigError(f'{where}: "prompt" is empty')
        category = obj.get("category", "custom").strip()
        if not category:
            raise ConfigError(f'{where}: "category" is empty')
        if obj.get("max_tokens", 1) < 1:
            raise ConfigError(f'{where}: "max_tokens" must be >= 1, got {shown(obj["max_tokens"])}')
        prompts.append(BenchPrompt(category, obj["prompt"], obj.get("max_tokens"), obj.get("system"), where,
                                   obj.get("schema")))
    if not prompts:
        raise ConfigError(f"{file}: no prompts (expected one JSON object per line)")
    return prompts


def categories_of(prompts: Sequence[BenchPrompt]) -> list[str]:
    """The suite's categories, in the order they first appear."""
    return list(dict.fromkeys(p.category for p in prompts))


def select_categories(prompts: list[BenchPrompt], categories: Sequence[str] | None) -> list[BenchPrompt]:
    if not categories:
        return prompts
    known = categories_of(prompts)
    for c in categories:
        if c not in known:
            raise ConfigError(f"no prompts in category {shown(c)}; the suite has: {', '.join(known)}")
    return [p for p in prompts if p.category in categories]


def parse_k_sweep(value: str | None) -> list[int | None]:
    """'auto' (None), a number, or a comma list of them ('1,2,4,8', 'auto,4'): one variant each."""
    out: list[int | None] = []
    for item in ("auto" if value is None else value).split(","):
        item = item.strip().lower()
        if item == "auto":
            k = None
        else:
            try:
                k = int(item)
            except ValueError:
                raise ConfigError(f"draft tokens (-k) must be a number, 'auto' or a list like 1,2,4,8; "
                                  f"got {shown(value)}") from None
            if not 1 <= k <= MAX_DRAFT:
                raise ConfigError(f"draft tokens (-k) must be between 1 and {MAX_DRAFT} in a bench (plain "
                                  f"decoding is always measured), got {k}")
        if k not in out:
            out.append(k)
    return out


@dataclass(frozen=True)
class Variant:
    kind: str                  # "plain" | "spec" | "reference"
    key: str                   # plain: "plain"; spec: "auto" or k (with --drafter auto: "model",
                               # "lookup", "auto", or "model:4"...); reference: "plain" or "lookup"
    k: int | None = None       # spec: fixed k (None = adaptive); reference: lookup num_pred_tokens
    drafter: str | None = None  # spec: the drafter; None = the session's
    tree: str | tuple[int, ...] = "off"   # spec: draft trees (`DecodeConfig.tree`)
    chain: str | None = None   # a tree variant: the key of its chain twin (tree off), run beside it

    @property
    def name(self) -> str:
        return self.kind if self.kind == "plain" else f"{self.kind}:{self.key}"


@dataclass
class Run:
    variant: Variant
    prompt: int
    repeat: int
    n_prompt: int
    tokens: list[int]
    steps: list[Step]          # empty for reference runs
    prefill: float
    decode: float
    finish: str | None


@dataclass(frozen=True)
class BenchOptions:
    sampling: SamplingConfig
    ks: tuple[int | None, ...] = (None,)
    max_tokens: int = 128
    repeat: int = 1
    chat: bool = True
    compare: str | None = None
    warmup: bool = True
    warm_start: bool = True
    """Adaptive variants start from what earlier runs on this pair and machine learned (and the
    suite's result is saved for the next run), as `generate` does."""
    tree: str | tuple[int, ...] = "off"
    """--tree: besides its chain, each of the session drafter's variants runs with this tree
    setting (`spec_variants`); the session's models must hold its `DecodeConfig.n_seq`."""
    mask_draft: bool = True
    """Under a grammar (--grammar, a prompt's schema), mask the draft's rows too."""


SINGLES = ("model", "lookup")
"""With --drafter auto the bench also runs each drafter alone, to judge auto's choice against."""


def spec_variants(drafter: str, ks: Sequence[int | None], tree: str | tuple[int, ...] = "off") -> list[Variant]:
    """One chain variant per k (per drafter under auto); with `tree` not off, each of the session
    drafter's (auto's, under auto) followed by its tree twin."""
    if drafter != "auto":
        chains = [Variant("spec", "auto" if k is None else str(k), k) for k in ks]
    else:
        chains = [Variant("spec", d if k is None else f"{d}:{k}", k, d) for k in ks for d in (*SINGLES, "auto")]
    out = []
    for v in chains:
        out.append(v)
        if tree != "off" and v.drafter in (None, "auto"):
            out.append(replace(v, key=v.key + TREE_SUFFIX, tree=tree, chain=v.key))
    return out


def _run_local(session, v: Variant, prompt: list[int], sampling: SamplingConfig, max_tokens: int,
               controller: KController | None, i: int = -1, r: int = 0, mask_draft: bool = True) -> Run:
    target = session.target
    drafter = session.make_drafter(v.drafter) if v.kind == "spec" else None
    decode = DecodeConfig(max_tokens=max_tokens, k=v.k if v.kind == "spec" else 0,
                          k_max=controllers.k_max_for(v.k), tree=v.tree, mask_draft=mask_draft)
    target.reset()
    t0 = time.perf_counter()
    target.sync(prompt[:-1])
    if drafter is not None and session.draft is not None and drafter.name in ("model", "auto"):
        session.draft.reset()
        session.draft.sync(prompt[:-1])
    t1 = time.perf_counter()
    steps = list(generate_steps(target, drafter, prompt, sampling, decode, controller))
    t2 = time.perf_counter()
    tokens = [t for s in steps for t in s.tokens]
    return Run(v, i, r, len(prompt), tokens, steps, t1 - t0, t2 - t1, steps[-1].finish if steps else None)


def _run_reference(ref, v: Variant, prompt: list[int], sampling: SamplingConfig, max_tokens: int,
                   i: int = -1, r: int = 0) -> Run:
    tokens, prefill, decode = ref.generate(prompt, max_tokens, temperature=sampling.temperature,
                                           top_k=sampling.top_k, top_p=sampling.top_p,
                                           min_p=sampling.min_p, seed=sampling.seed)
    return Run(v, i, r, len(prompt), tokens, [], prefill, decode,
               "length" if len(tokens) >= max_tokens else "stop")


def run_bench(session, prompts: list[BenchPrompt], opts: BenchOptions, *, prompts_file: str | None = None,
              progress: Progress | None = None, notice: Callable[[str], None] | None = None) -> dict:
    """Run the suite on a loaded `Session` and return the report (see docs/bench-schema.md)."""
    if session.drafter_kind == "none":
        raise ConfigError("bench compares plain with speculative decoding; --drafter none leaves nothing to compare")
    if opts.compare is not None and opts.compare not in COMPARE:
        raise ConfigError(f"--compare must be one of: {', '.join(COMPARE)}; got {shown(opts.compare)}")
    notice = notice or (lambda m: None)
    load_start = load_1min()
    cpus = usable_cpus()
    if load_start is not None and load_start >= cpus:
        notice(f"localspec: load average {load_start:.1f} on {cpus} CPUs: other work is running, so timings "
               "will be noisy (and llama.cpp threads slow down badly when they outnumber the free cores)")
    target = session.target
    chat = session.chat_or_raw(opts.chat, notice)
    encoded = []
    for p in prompts:
        toks = session.prompt_tokens(p.prompt, chat, p.system)
        session.check_fits(toks, f"prompt {p.source}")
        encoded.append(toks)
    base_seed = opts.sampling.seed if opts.sampling.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    variants = [Variant("plain", "plain")] + spec_variants(session.drafter_kind, opts.ks, opts.tree)
    grammars = {i: schema_grammar(p.schema) for i, p in enumerate(prompts) if p.schema is not None}
    if grammars and opts.compare:
        raise ConfigError("--compare times llama-cpp-python without a grammar; leave out the json category "
                          "(prompts with a schema) or --compare")

    def controller(v: Variant, warmed: dict[str, bool] | None = None) -> KController:
        # The variant's drafter is made anew for each run (`_run_local`); this one only tells
        # the controller whose it is.
        drafter = session.make_drafter(v.drafter)
        c, warm = controllers.make(session, drafter, opts.sampling.temperature, v.k, warm=opts.warm_start)
        if warmed is not None:
            warmed[v.key] = warm
        return c

    warmed: dict[str, bool] = {}
    by_variant = {v.key: controller(v, warmed) for v in variants if v.kind == "spec"}
    refs: dict[str, object] = {}
    lookup_n = max((k for k in opts.ks if k is not None), default=REFERENCE_LOOKUP)
    try:
        if opts.compare:
            from localspec.engine.reference import ReferenceModel

            for key, n in (("plain", None), ("lookup", lookup_n)):
                notice(f"localspec: loading llama-cpp-python's Llama ({key}) for --compare…")
                refs[key] = ReferenceModel(target.path, n_ctx=target.n_ctx, threads=target.n_threads,
                                           gpu_layers=target.cfg.n_gpu_layers, lookup_tokens=n)
                variants.append(Variant("reference", key, n))
        total = (len(variants) if opts.warmup else 0) + opts.repeat * len(prompts) * len(variants)
        done = 0

        def one(v, i, r, sampling, max_tokens, controller):
            nonlocal done
            if progress:
                what = "warm-up" if i < 0 else f"{prompts[i].category} #{i + 1}"
                progress(done, total, f"{what} · {v.name}")
            if i >= 0 and i in grammars:   # a JSON-extraction prompt: under its schema
                sampling = replace(sampling, grammar=grammars[i], grammar_name="schema")
            if v.kind == "reference":
                run = _run_reference(refs[v.key], v, encoded[max(i, 0)], sampling, max_tokens, i, r)
            else:
                run = _run_local(session, v, encoded[max(i, 0)], sampling, max_tokens, controller, i, r, opts.mask_draft)
            done += 1
            return run

        if opts.warmup:  # not counted; controllers of its own, so the suite's start as a run would
            warm = replace(opts.sampling, seed=base_seed)
            for v in variants:
                one(v, -1, 0, warm, min(WARMUP_TOKENS, opts.max_tokens), controller(v))
        runs: list[Run] = []
        for r in range(opts.repeat):
            sampling = replace(opts.sampling, seed=(base_seed + r) % 2**31)
            for i, p in enumerate(prompts):
                order = variants if (r * len(prompts) + i) % 2 == 0 else variants[::-1]
                for v in order:
                    runs.append(one(v, i, r, sampling, p.max_tokens or opts.max_tokens, by_variant.get(v.key)))
        if progress:
            progress(done, total, "done")
        if opts.warm_start:
            saved = set()
            # the adaptive variants (a tree variant in its chain's place: the commands run with
            # trees); auto's record is the model's (one of them)
            twins = {v.chain: v for v in variants if v.chain}
            for v in (twins.get(v.key, v) for v in variants if not v.chain):
                name = v.drafter or session.drafter_kind
                if v.kind == "spec" and v.k is None and warmstart.record_name(name) not in saved:
                    saved.add(warmstart.record_name(name))
                    warmstart.save(by_variant[v.key], session, name, opts.sampling.temperature)
    finally:
        for ref in refs.values():
            ref.close()

    categories = categories_of(prompts)
    lookup_used = lookup_n if opts.compare else None
    return {
        "schema": SCHEMA,
        "config": {
            **session.describe(),
            "chat": chat,
            **replace(opts.sampling, seed=base_seed).record(),
            "max_tokens": opts.max_tokens,
            "repeat": opts.repeat,
            "k": ["auto" if k is None else k for k in opts.ks],
            "tree": tree_label(opts.tree),
            "k_max": controllers.k_max_for(None),   # the adaptive variants'; a fixed k above it raises its own
            "n_ctx": target.n_ctx,
            "threads": target.n_threads,
            "prompts_file": prompts_file,
            "n_prompts": len(prompts),
            "categories": categories,
            "compare": opts.compare,
            "reference_lookup_tokens": lookup_used,
            "warmup": opts.warmup,
            "order": "interleaved, alternating",
            "controller_scope": "suite",
            "warm_start": warmed,
            "load_average": None if load_start is None else [load_start, load_1min()],
            "localspec_version": version("localspec"),
            "llama_cpp_python_version": version("llama-cpp-python"),
        },
        "categories": {c: group(runs, variants, {i for i, p in enumerate(prompts) if p.category == c},
                                 opts.sampling.greedy) for c in categories},
        "overall": group(runs, variants, set(range(len(prompts))), opts.sampling.greedy),
        "controllers": {key: c.snapshot() for key, c in by_variant.items()},
        "runs": [run_json(run, prompts) for run in runs],
    }
