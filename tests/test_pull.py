"""`pull`, `model_status` and the `models` / `pull` commands, without the real network.

A fake Hugging Face cache is built under tmp_path (HF_HUB_CACHE), and real downloads go to a tiny
hub stand-in served by http.server on 127.0.0.1 (HF_ENDPOINT).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from localspec.loading import hub
from localspec.cli.presets import register
from localspec.config import ConfigError
from localspec.loading.presets import load_preset

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PAIR = """\
description: "test pair"
target: {repo: owner/target-GGUF, file: target.gguf}
draft: {repo: owner/draft-GGUF, file: draft.gguf}
drafter: model
sampling: {temperature: 0.7, top_k: 40, top_p: 0.9, min_p: 0.05}
k: auto
n_ctx: 4096
verified: false
"""


def put_in_cache(cache: Path, repo: str, file: str, data: bytes) -> Path:
    """Lay a file out the way huggingface_hub stores it: refs/main -> snapshots/<commit>/file."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    path = root / "snapshots" / COMMIT / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "hf-cache"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    return path


@pytest.fixture
def preset_file(tmp_path):
    path = tmp_path / "pair.yaml"
    path.write_text(PAIR)
    return path


@pytest.fixture
def fake_hub(monkeypatch, cache):
    """A minimal hub: HEAD/GET /{repo}/resolve/main/{file} for the files in `files`."""
    files = {"owner/target-GGUF/target.gguf": b"GGUF target bytes", "owner/draft-GGUF/draft.gguf": b"GGUF draft"}
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            requests.append((self.command, self.path))
            key = self.path.split("?")[0].lstrip("/").replace("/resolve/main/", "/")
            data = files.get(key)
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield files, requests
    server.shutdown()
    server.server_close()


def test_cached_files_are_found_without_network(cache, preset_file, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = put_in_cache(cache, "owner/target-GGUF", "target.gguf", b"x" * 10)
    draft = put_in_cache(cache, "owner/draft-GGUF", "draft.gguf", b"y" * 3)
    said = []
    assert hub.pull(str(preset_file), notice=said.append) == [target, draft]
    assert all("already downloaded" in line for line in said)
    status = hub.model_status(load_preset(preset_file))
    assert [(s.role, s.present, s.path, s.size_bytes) for s in status] == [
        ("target", True, target, 10),
        ("draft", True, draft, 3),
    ]


def test_offline_and_not_cached_says_what_and_how(cache, preset_file, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as info:
        hub.pull(str(preset_file), notice=lambda _: None)
    message = str(info.value)
    assert "\n" not in message
    assert "offline" in message and "owner/target-GGUF/target.gguf" in message
    assert "owner/draft-GGUF/draft.gguf" in message  # every missing file, in one message
    assert "download owner/target-GGUF target.gguf`" in message  # the command to run elsewhere
    assert str(cache) in message and "--target / --draft PATH" in message
    assert "https://huggingface.co/owner/target-GGUF/resolve/main/target.gguf" in message


def test_model_status_when_missing(cache, preset_file):
    status = hub.model_status(load_preset(preset_file))
    assert [(s.present, s.path, s.size_bytes) for s in status] == [(False, None, None)] * 2


def test_embedded_models_need_no_download(cache):
    said = []
    assert hub.pull("smollm2-135m-self", notice=said.append) == []
    assert len(said) == 2 and all("built into localspec" in line for line in said)
    assert all(s.present and s.path is None for s in hub.model_status(load_preset("smollm2-135m-self")))


def test_repo_without_file_is_refused(cache):
    with pytest.raises(ConfigError, match="name the GGUF too"):
        hub.pull("owner/target-GGUF")


def test_download_from_local_hub(fake_hub, cache, preset_file):
    files, requests = fake_hub
    said = []
    paths = hub.pull(str(preset_file), progress=False, notice=said.append)
    assert [p.read_bytes() for p in paths] == [
        files["owner/target-GGUF/target.gguf"],
        files["owner/draft-GGUF/draft.gguf"],
    ]
    assert all(str(p).startswith(str(cache)) for p in paths)
    assert any("downloading" in line and "17 B" in line for line in said)
    assert hub.cached_file("owner/draft-GGUF", "draft.gguf") == paths[1]
    # A second pull finds both in the cache and asks the hub nothing.
    before = len(requests)
    assert hub.pull(str(preset_file), notice=said.append) == paths
    assert len(requests) == before


def test_download_single_repo_file(fake_hub, cache):
    (path,) = hub.pull("owner/draft-GGUF", "draft.gguf", progress=False, notice=lambda _: None)
    assert path.read_bytes() == b"GGUF draft"


def test_missing_file_on_hub(fake_hub, cache):
    with pytest.raises(ConfigError, match="not found in repo owner/draft-GGUF"):
        hub.pull("owner/draft-GGUF", "nope.gguf", progress=False, notice=lambda _: None)


def test_unreachable_hub_gives_manual_steps(cache, monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", refuse)
    with pytest.raises(ConfigError) as info:
        hub.pull("owner/draft-GGUF", "draft.gguf", notice=lambda _: None)
    message = str(info.value)
    assert "ConnectionError" in message and "To place it by hand" in message and "\n" not in message


def test_unreachable_hub_names_every_missing_file(cache, preset_file, monkeypatch):
    # Offline without HF_HUB_OFFLINE: the hub's address refuses connections (a port just closed
    # on this machine), so the library's own connection error comes, as with no network at all.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with pytest.raises(ConfigError) as info:
        hub.pull(str(preset_file), progress=False, notice=lambda _: None)
    message = str(info.value)
    assert "\n" not in message and "To place them by hand" in message
    assert "target owner/target-GGUF/target.gguf" in message and "draft owner/draft-GGUF/draft.gguf" in message
    assert "models--owner--target-GGUF, models--owner--draft-GGUF" in message

    # A file already in the cache is not named again.
    put_in_cache(cache, "owner/target-GGUF", "target.gguf", b"x")
    with pytest.raises(ConfigError) as info:
        hub.pull(str(preset_file), progress=False, notice=lambda _: None)
    assert "would download draft owner/draft-GGUF/draft.gguf." in str(info.value)
    assert "target.gguf" not in str(info.value)


# ---------------------------------------------------------------- CLI


def cli_app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_models_table_and_json(cache):
    put_in_cache(cache, "lmstudio-community/SmolLM2-1.7B-Instruct-GGUF", "SmolLM2-1.7B-Instruct-Q8_0.gguf", b"z" * 2000)
    put_in_cache(cache, "lmstudio-community/Qwen2.5-7B-Instruct-GGUF", "Qwen2.5-7B-Instruct-Q4_K_M.gguf", b"q" * 3000)
    put_in_cache(cache, "lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF", "Qwen2.5-0.5B-Instruct-Q8_0.gguf", b"d" * 500)
    runner = CliRunner()
    result = runner.invoke(cli_app(), ["models"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    head = ["PRESET", "DRAFTER", "TARGET", "DRAFT", "DOWNLOADED", "SIZE", "VERIFIED"]
    assert lines[0].split() == head
    cells = {line.split()[0]: line.split() for line in lines[1:] if line.strip() and line[0].islower()}
    columns = lambda name: dict(zip(head[4:], cells[name][-3:]))  # noqa: E731  (built-in names hold spaces)
    assert columns("smollm2-135m-self") == {"DOWNLOADED": "built-in", "SIZE": "-", "VERIFIED": "yes"}
    assert cells["smollm2-1.7b-instruct"][-5:] == ["only", "target", "2.0", "kB", "yes"]
    assert cells["qwen2.5-7b-instruct"][-4:] == ["yes", "3.5", "kB", "yes"]   # both files, summed
    assert columns("llama3.1-8b-instruct") == {"DOWNLOADED": "no", "SIZE": "-", "VERIFIED": "yes"}
    # Every column is explained under the table, VERIFIED included.
    legend = {line.split(":")[0]: line for line in lines if line.startswith(("SIZE:", "VERIFIED:"))}
    assert set(legend) == {"SIZE", "VERIFIED"} and "checked against the hub" in legend["VERIFIED"]

    result = runner.invoke(cli_app(), ["models", "--json"])
    assert result.exit_code == 0, result.output
    data = {p["name"]: p for p in json.loads(result.output)}
    assert data["smollm2-1.7b-instruct"]["target"]["size_bytes"] == 2000
    assert data["smollm2-1.7b-instruct"]["draft"]["present"] is False
    assert data["smollm2-135m-lookup"]["draft"] is None
    assert data["smollm2-135m-self"]["k"] == "auto"


def test_pull_command_errors_are_one_line(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runner = CliRunner()
    result = runner.invoke(cli_app(), ["pull", "qwen2.5-7b-instruct"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Qwen2.5-7B-Instruct-Q4_K_M.gguf" in errors[0]
    assert "Traceback" not in result.output

    result = runner.invoke(cli_app(), ["pull", "no-such-preset"])
    assert result.exit_code == 2 and "error: unknown preset 'no-such-preset'" in result.output


def test_pull_command_downloads(fake_hub, cache):
    result = CliRunner().invoke(cli_app(), ["pull", "owner/target-GGUF", "target.gguf", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "ready: " + str(hub.cached_file("owner/target-GGUF", "target.gguf")) in result.output
