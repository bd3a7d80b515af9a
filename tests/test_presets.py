"""Preset files: every shipped one validates; broken ones fail with one line naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.loading import presets
from localspec.config import ConfigError
from localspec.loading.hub import resolve_model
from localspec.loading.presets import ModelRef, load_preset, list_presets, preset_dir

GOOD = """\
description: "test pair"
target: {repo: owner/target-GGUF, file: target-Q4_K_M.gguf}
draft: {repo: owner/draft-GGUF, file: draft-Q8_0.gguf}
drafter: model
sampling: {temperature: 0.7, top_k: 40, top_p: 0.9, min_p: 0.05}
k: auto
n_ctx: 4096
note: "advice"
verified: false
"""


def write(tmp_path: Path, text: str, name: str = "custom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_preset(path)
    message = str(info.value)
    assert "\n" not in message, message
    assert str(path) in message
    return message


def test_shipped_presets_all_validate():
    found = list_presets()
    names = {p.name for p in found}
    assert {"smollm2-135m-self", "smollm2-135m-lookup"} <= names
    assert len(found) >= 8
    assert preset_dir().name in ("models", "_models")
    for p in found:
        assert p.path.stem == p.name and p.description and "\n" not in p.description
        assert (p.draft is not None) == (p.drafter in ("auto", "model"))
        for _, ref in p.models():
            assert ref.embedded or (ref.repo and ref.file.endswith(".gguf"))
        p.sampling()  # the suggested settings pass SamplingConfig's own checks


def test_default_preset_is_the_embedded_pair():
    p = load_preset("smollm2-135m-self")
    assert p.target == ModelRef(embedded="smollm2-135m-f32")
    assert p.draft == ModelRef(embedded="smollm2-135m-q4_1")
    assert (p.drafter, p.k, p.n_ctx) == ("auto", None, 4096)
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    lookup = load_preset("smollm2-135m-lookup")
    assert lookup.drafter == "lookup" and lookup.draft is None
    assert lookup.target == p.target


def test_load_by_path(tmp_path):
    p = load_preset(write(tmp_path, GOOD))
    assert p.name == "custom" and p.k is None and p.verified is False
    assert p.draft == ModelRef(repo="owner/draft-GGUF", file="draft-Q8_0.gguf")
    assert load_preset(write(tmp_path, GOOD.replace("k: auto", "k: 5"))).k == 5


def test_draft_and_note_may_be_left_out_for_lookup(tmp_path):
    text = GOOD.replace("drafter: model", "drafter: lookup")
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("draft:", "note:")))
    p = load_preset(write(tmp_path, text))
    assert p.draft is None and p.note == ""


def test_unknown_preset_name_lists_available():
    with pytest.raises(ConfigError) as info:
        load_preset("no-such-preset")
    assert "no-such-preset" in str(info.value) and "smollm2-135m-self" in str(info.value)


def test_bad_yaml(tmp_path):
    message = error_of(write(tmp_path, "description: [unclosed\ntarget: x\n"))
    assert "invalid YAML" in message and "line" in message


def test_not_a_mapping(tmp_path):
    assert "mapping" in error_of(write(tmp_path, "- just\n- a list\n"))


@pytest.mark.parametrize("field", ["description", "target", "drafter", "sampling", "k", "n_ctx", "verified"])
def test_missing_field(tmp_path, field):
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith(field + ":"))
    message = error_of(write(tmp_path, text))
    assert f"{field}: missing field" in message


def test_missing_sampling_field(tmp_path):
    message = error_of(write(tmp_path, GOOD.replace("min_p: 0.05", "")))
    assert "sampling.min_p: missing field" in message


@pytest.mark.parametrize(
    "old, new, field",
    [
        ('description: "test pair"', "description: 3", "description"),
        ("n_ctx: 4096", "n_ctx: lots", "n_ctx"),
        ("n_ctx: 4096", "n_ctx: 4096.5", "n_ctx"),
        ("verified: false", "verified: maybe", "verified"),
        ("temperature: 0.7", "temperature: hot", "sampling.temperature"),
        ("temperature: 0.7", "temperature: -1", "sampling.temperature"),
        ("top_k: 40", "top_k: 4.5", "sampling.top_k"),
        ("top_p: 0.9", "top_p: 1.5", "sampling.top_p"),
        ("min_p: 0.05", "min_p: true", "sampling.min_p"),
        ("target: {repo: owner/target-GGUF, file: target-Q4_K_M.gguf}", "target: owner/target", "target"),
        ("target: {repo: owner/target-GGUF, file: target-Q4_K_M.gguf}", "target: null", "target"),
        ("repo: owner/target-GGUF", "repo: no-slash", "target.repo"),
        ("file: target-Q4_K_M.gguf", "file: model.bin", "target.file"),
        ("draft: {repo: owner/draft-GGUF, file: draft-Q8_0.gguf}", "draft: {embedded: nope}", "draft.embedded"),
        ('note: "advice"', "note: [a, b]", "note"),
        ("sampling: {temperature: 0.7, top_k: 40, top_p: 0.9, min_p: 0.05}", "sampling: [0.7, 40]", "sampling"),
    ],
)
def test_wrong_type_or_value(tmp_path, old, new, field):
    assert old in GOOD
    message = error_of(write(tmp_path, GOOD.replace(old, new)))
    assert f": {field}:" in message


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("note:", "colour: blue\nnote:", "colour"),
        ("min_p: 0.05", "min_p: 0.05, typical_p: 0.9", "sampling.typical_p"),
        ("file: draft-Q8_0.gguf", "file: draft-Q8_0.gguf, revision: main", "draft.revision"),
    ],
)
def test_unknown_field(tmp_path, old, new, field):
    message = error_of(write(tmp_path, GOOD.replace(old, new)))
    assert f"{field}: unknown field" in message


@pytest.mark.parametrize("drafter", ["eagle", "Model", "3", "null"])
def test_bad_drafter(tmp_path, drafter):
    message = error_of(write(tmp_path, GOOD.replace("drafter: model", f"drafter: {drafter}")))
    assert "drafter:" in message and "model, lookup, none" in message


def test_drafter_and_draft_must_agree(tmp_path):
    assert "draft:" in error_of(write(tmp_path, GOOD.replace("drafter: model", "drafter: lookup")))
    no_draft = GOOD.replace("draft: {repo: owner/draft-GGUF, file: draft-Q8_0.gguf}", "draft: null")
    assert "draft:" in error_of(write(tmp_path, no_draft))


@pytest.mark.parametrize("k", ["-1", "1.5", "fast", "true", "null", "[3]"])
def test_bad_k(tmp_path, k):
    message = error_of(write(tmp_path, GOOD.replace("k: auto", f"k: {k}")))
    assert ": k: must be 'auto' or an integer >= 0" in message


def test_missing_file_path(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_preset(tmp_path / "absent.yaml")


def test_resolve_embedded_uses_defaults(monkeypatch, tmp_path):
    from localspec.loading import defaults

    calls = []
    monkeypatch.setattr(defaults, "default_draft_path", lambda notice: tmp_path / "draft.gguf")
    target = tmp_path / "target.gguf"
    monkeypatch.setattr(defaults, "default_target_path", lambda notice: calls.append(notice) or target)
    assert resolve_model(ModelRef(embedded="smollm2-135m-q4_1")) == tmp_path / "draft.gguf"
    assert resolve_model(ModelRef(embedded="smollm2-135m-f32"), notice=len) == tmp_path / "target.gguf"
    assert calls == [len]


def test_resolve_hub_model_not_downloaded(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    ref = ModelRef(repo="owner/x-GGUF", file="x.gguf")
    with pytest.raises(ConfigError, match=r"not downloaded; run `localspec pull qwen`"):
        resolve_model(ref, preset="qwen")
    with pytest.raises(ConfigError, match=r"run `localspec pull owner/x-GGUF x.gguf`"):
        resolve_model(ref)


def test_preset_dir_prefers_installed_copy(monkeypatch, tmp_path):
    fake_pkg = tmp_path / "localspec"
    (fake_pkg / "_models").mkdir(parents=True)
    monkeypatch.setattr(presets, "__file__", str(fake_pkg / "loading" / "presets.py"))
    assert preset_dir() == (fake_pkg / "_models").resolve()


def test_a_preset_sets_the_device_options_and_a_flag_overrides_them(tmp_path):
    from localspec.cli.device_options import placements

    text = GOOD + "gpu: {flash_attn: on, cache_type_k: q8_0, cache_type_v: q8_0, n_batch: 1024, tensor_split: [3, 1]}\n"
    p = load_preset(write(tmp_path, text))
    # YAML reads a bare `on` as true: it is flash attention on
    assert p.gpu == {"flash_attn": "on", "cache_type_k": "q8_0", "cache_type_v": "q8_0", "n_batch": 1024,
                     "tensor_split": "3,1"}
    got = placements({}, p.gpu)
    assert (got["target_placement"].flash_attn, got["target_placement"].cache_type_v, got["n_batch"]) == ("on", "q8_0", 1024)
    assert got["target_placement"].tensor_split == (3.0, 1.0) and got["draft_placement"].flash_attn == "on"
    assert got["draft_placement"].cache_type_k == "f16"   # the draft's own types are separate
    flagged = placements({"cache_type_k": "q4_0", "n_batch": 256}, p.gpu)
    assert (flagged["target_placement"].cache_type_k, flagged["n_batch"]) == ("q4_0", 256)
    assert load_preset(write(tmp_path, GOOD)).gpu == {}


@pytest.mark.parametrize("gpu, says", [
    ("{flash_attn: maybe}", "flash_attn must be one of auto, on, off"),
    ("{cache_type_v: q8_0, flash_attn: off}", "needs flash attention"),
    ("{n_batch: 8}", "gpu.n_batch: must be an integer >= 65"),
    ("{rpc: 'a:1'}", "gpu.rpc: unknown field"),
    ("[on]", "gpu: must be a mapping"),
])
def test_bad_device_settings_name_the_field(tmp_path, gpu, says):
    message = error_of(write(tmp_path, GOOD + f"gpu: {gpu}\n"))
    assert says in message
