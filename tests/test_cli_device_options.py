"""Option values that used to stand for the default (issue 43): `--n-batch 0`, and an empty string
for a device option, a preset or a model file. Each is refused with one `error:` line naming the
option and exit code 2, on `generate` and on `serve`, before any model loads."""

from __future__ import annotations

import pytest

from tests.test_hostile import one_error_line
from tests.test_hostile_cli import run

CASES = [
    (("--n-batch", "0"), "--n-batch"),
    (("--n-batch", "1"), "--n-batch"),
    (("--stable-shapes", ""), "--stable-shapes"),
    (("--flash-attn", ""), "--flash-attn"),
    (("--split-mode", ""), "--split-mode"),
    (("--cache-type-k", ""), "--cache-type-k"),
    (("--cache-type-v", ""), "--cache-type-v"),
    (("--draft-cache-type-k", ""), "--draft-cache-type-k"),
    (("--draft-cache-type-v", "nope"), "--draft-cache-type-v"),
    (("--target", ""), "--target is empty"),
    (("--draft", " "), "--draft is empty"),
    (("--preset", ""), "--preset is empty"),
    (("--drafter", ""), "drafter"),
]


@pytest.mark.parametrize("args, words", CASES, ids=[f"{a[0]}={a[1]!r}" for a, _ in CASES])
def test_generate_refuses_a_value_that_would_mean_the_default(args, words):
    line = one_error_line(run("generate", *args, "--max-tokens", "2", "hi", timeout=60))
    assert words in line, line


@pytest.mark.parametrize("args, words", [c for c in CASES if c[0][0] in ("--n-batch", "--stable-shapes",
                                                                          "--cache-type-k", "--target")])
def test_serve_refuses_them_too(args, words):
    line = one_error_line(run("serve", *args, "--port", "0", timeout=60))
    assert words in line, line


def test_a_preset_values_are_not_replaced_by_a_zero_or_empty_flag(tmp_path):
    from localspec.cli.options import MODEL_OPTIONS, resolve_options
    from localspec.config import ConfigError

    preset = tmp_path / "p.yaml"
    preset.write_text("description: x\ntarget: {repo: owner/name, file: a.gguf}\ndrafter: lookup\n"
                      "sampling: {temperature: 0, top_k: 0, top_p: 1.0, min_p: 0}\nk: auto\nn_ctx: 512\n"
                      "verified: false\n")
    given = {name: None for name in MODEL_OPTIONS}
    for name, value, words in (("n_ctx", 0, "n-ctx"), ("drafter", "", "drafter")):
        with pytest.raises(ConfigError, match=words):
            resolve_options(**{**given, "preset": str(preset), "target": str(tmp_path / "t.gguf"), name: value})


@pytest.mark.parametrize("args, words", [(("--json-schema", ""), "--json-schema is empty"),
                                         (("--json-schema", " "), "--json-schema is empty"),
                                         (("--grammar", ""), "--grammar is empty")])
def test_an_empty_constraint_names_its_option(args, words):
    line = one_error_line(run("generate", *args, "--max-tokens", "2", "hi", timeout=60))
    assert words in line, line
