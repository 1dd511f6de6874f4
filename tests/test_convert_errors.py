"""Bad input: each case gets its own specific message, and no output folder is left behind."""
from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest
from conftest import HF_FIXTURES
from hf_util import copy_fixture, edit_config, read_safetensors, write_safetensors

from engine import errors
from engine.convert import convert as convert_mod
from engine.convert.convert import convert


@pytest.fixture
def llama(tmp_path):
    return copy_fixture(HF_FIXTURES / "llama", tmp_path / "src")


def nothing_left(tmp_path, name="out"):
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith((name, f".{name}"))]
    return leftovers == []


def rewrite(folder, edit):
    path = folder / "model.safetensors"
    tensors = read_safetensors(path)
    edit(tensors)
    write_safetensors(path, tensors)


def test_truncated_safetensors(tmp_path, llama):
    p = llama / "model.safetensors"
    p.write_bytes(p.read_bytes()[:-1000])
    with pytest.raises(errors.SourceFormatError, match="truncated"):
        convert(llama, tmp_path / "out")
    assert nothing_left(tmp_path)


def test_header_lies_about_offsets(tmp_path, llama):
    p = llama / "model.safetensors"
    raw = bytearray(p.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8:8 + n])
    head["model.norm.weight"]["data_offsets"][1] += 4
    body = json.dumps(head, separators=(",", ":")).encode().ljust(n)
    assert len(body) == n
    raw[8:8 + n] = body
    p.write_bytes(bytes(raw))
    with pytest.raises(errors.SourceFormatError, match=r"'model.norm.weight' is F32\[64\] = 256 bytes but its header offsets"):
        convert(llama, tmp_path / "out")


def test_header_length_past_end(tmp_path, llama):
    p = llama / "model.safetensors"
    p.write_bytes((10**9).to_bytes(8, "little") + p.read_bytes()[8:200])
    with pytest.raises(errors.SourceFormatError, match="header claims 1000000000 bytes"):
        convert(llama, tmp_path / "out")


def test_wrong_dtype(tmp_path, llama):
    rewrite(llama, lambda t: t.__setitem__("model.norm.weight", ("I32", np.arange(64, dtype=np.int32))))
    with pytest.raises(errors.SourceFormatError, match="'model.norm.weight' has dtype I32"):
        convert(llama, tmp_path / "out")


def test_shape_contradicts_config(tmp_path, llama):
    edit_config(llama, num_key_value_heads=1)
    with pytest.raises(errors.ConfigError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape \[32, 64\] "
                                                 r"but the config implies \[16, 64\]"):
        convert(llama, tmp_path / "out")
    assert nothing_left(tmp_path)


def test_missing_shard(tmp_path):
    src = copy_fixture(HF_FIXTURES / "mixtral", tmp_path / "src")
    (src / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(errors.SourceFormatError, match="model-00002-of-00003.safetensors: shard listed in "
                                                       "model.safetensors.index.json is missing"):
        convert(src, tmp_path / "out")


def test_unknown_architecture(tmp_path, llama):
    edit_config(llama, architectures=["GPT2LMHeadModel"])
    with pytest.raises(errors.UnsupportedArchitectureError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        convert(llama, tmp_path / "out")


def test_missing_and_unexpected_tensors(tmp_path, llama):
    rewrite(llama, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    with pytest.raises(errors.MissingTensorError, match="'blk.1.attn_v.weight'.*model.layers.1.self_attn.v_proj.weight"):
        convert(llama, tmp_path / "out")
    other = copy_fixture(HF_FIXTURES / "llama", tmp_path / "src2")
    rewrite(other, lambda t: t.__setitem__("model.layers.0.mlp.extra.weight", ("F32", np.zeros((2, 2)))))
    with pytest.raises(errors.UnexpectedTensorError, match="model.layers.0.mlp.extra.weight"):
        convert(other, tmp_path / "out")
    assert nothing_left(tmp_path)


def test_pickle_checkpoints_are_refused(tmp_path, llama):
    (llama / "model.safetensors").rename(llama / "pytorch_model.bin")
    with pytest.raises(errors.SourceFormatError, match="pytorch_model.bin are pickle files"):
        convert(llama, tmp_path / "out")


def test_no_config_and_bad_tokenizer(tmp_path, llama):
    (llama / "tokenizer.json").write_text("{not json")
    with pytest.raises(errors.SourceFormatError, match="not a valid tokenizer.json"):
        convert(llama, tmp_path / "out")
    (llama / "config.json").unlink()
    with pytest.raises(errors.SourceFormatError, match="no config.json"):
        convert(llama, tmp_path / "out")
    with pytest.raises(errors.SourceFormatError, match="no such file or folder"):
        convert(tmp_path / "nowhere", tmp_path / "out")


def test_template_that_does_not_parse(tmp_path, llama):
    p = llama / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }"
    p.write_text(json.dumps(cfg))
    with pytest.raises(errors.ConfigError, match="chat template does not parse"):
        convert(llama, tmp_path / "out")


def test_existing_output_is_refused_unless_forced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(errors.OutputExistsError, match="not empty.*--force"):
        convert(HF_FIXTURES / "llama", out)
    assert (out / "keep.txt").read_text() == "precious"
    convert(HF_FIXTURES / "llama", out, force=True)
    assert not (out / "keep.txt").exists() and (out / "manifest.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary or old folder left


def test_empty_output_folder_is_fine(tmp_path):
    (tmp_path / "out").mkdir()
    convert(HF_FIXTURES / "llama", tmp_path / "out")
    assert (tmp_path / "out" / "config.json").exists()


@pytest.mark.parametrize("how", ["event", "callable"])
def test_cancel_midway_leaves_nothing(tmp_path, how):
    event, seen = threading.Event(), []

    def progress(p):
        seen.append(p.tensor)
        if len(seen) == 5:
            event.set()
    cancel = event if how == "event" else event.is_set
    with pytest.raises(errors.ConversionCancelled):
        convert(HF_FIXTURES / "mixtral", tmp_path / "out", progress=progress, cancel=cancel)
    assert len(seen) == 5
    assert nothing_left(tmp_path)


def test_interrupt_leaves_nothing(tmp_path):
    def progress(p):
        if p.done_bytes > p.total_bytes / 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        convert(HF_FIXTURES / "qwen2_moe", tmp_path / "out", progress=progress)
    assert nothing_left(tmp_path)


def test_not_enough_disk_space(tmp_path, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(convert_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=100_000))
    with pytest.raises(errors.DiskSpaceError, match="not enough free disk space: the model needs"):
        convert(HF_FIXTURES / "llama", tmp_path / "out")
    assert nothing_left(tmp_path)


def test_an_output_folder_whose_parents_do_not_exist_yet_is_written(tmp_path):
    """colibri-convert --output_path models/new/smol: the free-space check looks at the nearest
    folder that exists, and the parents are made (the check used to fail on the missing parent)."""
    convert(HF_FIXTURES / "llama", tmp_path / "models" / "new" / "out")
    assert (tmp_path / "models" / "new" / "out" / "config.json").is_file()


def test_disk_full_while_writing(tmp_path, monkeypatch):
    import errno

    from engine import tensorfile
    calls = []
    real_put = tensorfile.TensorFileWriter._put

    def failing_put(self, data):
        calls.append(1)
        if len(calls) > 20:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real_put(self, data)
    monkeypatch.setattr(tensorfile.TensorFileWriter, "_put", failing_put)
    with pytest.raises(errors.ConversionError, match="No space left on device.*nothing was written"):
        convert(HF_FIXTURES / "mixtral", tmp_path / "out")
    assert nothing_left(tmp_path)


def test_stale_partial_of_a_killed_run_is_cleaned(tmp_path):
    stale = tmp_path / ".out.partial-999999999"
    stale.mkdir()
    convert(HF_FIXTURES / "llama", tmp_path / "out")
    assert not stale.exists()


def test_tokenizer_larger_than_the_embedding_table(tmp_path, llama):
    edit_config(llama, vocab_size=100)
    with pytest.raises(errors.ConfigError, match="tokenizer has 384 tokens but the model's embedding table only 100"):
        convert(llama, tmp_path / "out")
