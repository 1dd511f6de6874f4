"""The struct header reader gives what gguf.GGUFReader gives (the peer), and reads no tensor data."""
from pathlib import Path

import gguf
import pytest
from conftest import TESTS

from engine.convert.gguf_file import GGUFModel
from engine.convert.gguf_header import read_header
from engine.errors import SourceFormatError

PRESETS = sorted((TESTS / "fixtures" / "llamacpp_presets").glob("*.gguf"))


@pytest.mark.parametrize("path", PRESETS[:4] + PRESETS[-2:], ids=lambda p: p.stem)
def test_the_header_equals_gguf_readers(path):
    seen = []
    h = read_header(path, seen.append)
    r = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert h.fields == fields and {k: type(v) for k, v in h.fields.items()} == {k: type(v) for k, v in fields.items()}
    assert [(t.name, t.shape, t.tensor_type, t.data_offset) for t in h.tensors] == \
        [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in r.tensors]
    assert seen[-1] == 1.0 and h.version == 3


def test_the_default_model_header_and_progress(default_gguf):
    seen = []
    h = read_header(default_gguf, seen.append)
    assert len(h.fields["tokenizer.ggml.tokens"]) == 49152 and len(h.tensors) == 272
    assert len(seen) > 3 and seen == sorted(seen) and seen[-1] == 1.0  # it moves, and ends at 1
    assert GGUFModel(Path(default_gguf)).fields == h.fields


def test_a_truncated_header_names_the_byte(tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(PRESETS[0].read_bytes()[:300])
    with pytest.raises(SourceFormatError, match=r"cut.gguf: GGUF (header is truncated|string of \d+ bytes)"):
        read_header(bad)
