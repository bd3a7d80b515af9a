"""A model path that is not a GGUF file gets one line saying what it is instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.config import ModelConfig
from localspec.engine import EngineError, Model, check_gguf
from localspec.engine.gguf import GGUFFormatError, TruncatedHeader, read_info


def _fifo(tmp: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    os.mkfifo(tmp / "pipe.gguf")
    return tmp / "pipe.gguf"


def _loop(tmp: Path) -> Path:
    (tmp / "a.gguf").symlink_to(tmp / "b.gguf")
    (tmp / "b.gguf").symlink_to(tmp / "a.gguf")
    return tmp / "a.gguf"


def _dangling(tmp: Path) -> Path:
    (tmp / "link.gguf").symlink_to(tmp / "gone.gguf")
    return tmp / "link.gguf"


def _device(tmp: Path) -> Path:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    return Path("/dev/zero")


def _write(content: bytes):
    def make(tmp: Path) -> Path:
        (tmp / "m.gguf").write_bytes(content)
        return tmp / "m.gguf"
    return make


PATHS = {
    "missing": (lambda tmp: tmp / "nothing.gguf", "model file not found: "),
    "folder": (lambda tmp: tmp, "is a folder"),
    "fifo": (_fifo, "is a FIFO \\(a named pipe\\), not a model file"),
    "dev-zero": (_device, "/dev/zero is a character device, not a model file"),
    "symlink-loop": (_loop, "is a symlink loop"),
    "dangling-symlink": (_dangling, "model file not found: .* \\(a symlink to a missing file\\)"),
    "empty": (_write(b""), "not a GGUF file: .* \\(it is empty\\)"),
    "text": (_write(b"hello, not a model"), "not a GGUF file"),
}


@pytest.mark.parametrize("case", PATHS)
def test_a_path_that_is_no_gguf_file_says_what_it_is(tmp_path, case):
    make, message = PATHS[case]
    with pytest.raises(EngineError, match=message):
        check_gguf(make(tmp_path))


@pytest.mark.parametrize("case", ["fifo", "dev-zero", "symlink-loop"])
def test_generate_says_it_in_one_line(tmp_path, case):
    make, message = PATHS[case]
    done = subprocess.run([sys.executable, "-m", "localspec", "generate", "hi", "--target", str(make(tmp_path))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert re.search(message, lines[0]), lines[0]


# Cut inside the header: in its first 24 bytes, its metadata (keys, then the vocabulary), its list
# of tensors (a None cut: 100 bytes before the tensor data).
CUTS = {"first-bytes": (20, "first 24 bytes"), "keys": (5_000, "metadata"), "vocabulary": (600_000, "metadata"),
        "tensor-list": (None, "list of tensors")}


@pytest.mark.parametrize("where", CUTS)
def test_a_truncated_header_is_called_truncated(model_paths, tmp_path, where):
    import gguf

    cut, part = CUTS[where]
    cut = cut or gguf.GGUFReader(model_paths[1]).data_offset - 100
    path = tmp_path / "cut.gguf"
    with open(model_paths[1], "rb") as f:
        path.write_bytes(f.read(cut))
    with pytest.raises(TruncatedHeader, match=f"truncated GGUF header: the file ends at byte {cut:,}, inside its {part}"):
        read_info(path)
    with pytest.raises(EngineError) as e:  # what generate, chat and serve say
        Model(ModelConfig(str(path), n_ctx=64, n_threads=1))
    assert "truncated GGUF header" in str(e.value), e.value
    assert "unpack" not in str(e.value) and "corrupt" not in str(e.value), e.value


def test_a_corrupt_header_is_still_called_corrupt(model_paths, tmp_path):
    data = bytearray(Path(model_paths[1]).read_bytes()[:2_000_000])
    data[24:32] = (2**40).to_bytes(8, "little")  # the first key's length: more than the file holds
    (tmp_path / "bad.gguf").write_bytes(data)
    with pytest.raises(GGUFFormatError, match="a string at byte 24 claims") as e:
        read_info(tmp_path / "bad.gguf")
    assert not isinstance(e.value, TruncatedHeader)
