"""A model folder is untrusted input: its links, paths, header lengths and config values become
named errors instead of reads outside the folder, huge allocations or a crash."""
from __future__ import annotations

import json
import os
import shutil
import struct

import gguf
import pytest
from conftest import HF_FIXTURES, TESTS
from gguf import GGUFValueType as V

from engine import errors
from engine.convert.convert import convert
from engine.model_dir import open_model_dir, sha256_file

TINY = TESTS / "fixtures" / "llamacpp_presets" / "tiny-q4_0.gguf"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return convert(HF_FIXTURES / "qwen2_moe", tmp_path_factory.mktemp("m") / "model", "int8").path


@pytest.fixture
def model(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "model")


def _edit_json(path, edit):
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("target", ["/dev/zero", "private"])
def test_a_template_linked_out_of_the_folder_is_never_read(model, tmp_path, target):
    if target == "private":
        target = tmp_path / "secret.txt"
        target.write_text("my private notes")
    (model / "chat_template.jinja").unlink()
    os.symlink(target, model / "chat_template.jinja")
    with pytest.raises(errors.ModelFormatError, match=r"chat_template.jinja.*outside the model folder"):
        _ = open_model_dir(model).chat_template


def test_a_template_the_manifest_does_not_list_is_not_read(model):
    _edit_json(model / "manifest.json", lambda d: d["files"].pop("chat_template.jinja"))
    with pytest.raises(errors.ModelFormatError, match=r"chat_template.jinja: not listed in manifest.json"):
        _ = open_model_dir(model).chat_template


@pytest.mark.parametrize("rel", ["../outside.bin", "/etc/hostname", "experts/../../outside.bin"])
def test_manifest_paths_stay_inside_the_folder(model, tmp_path, rel):
    (tmp_path / "outside.bin").write_bytes(b"x" * 10)
    _edit_json(model / "manifest.json", lambda d: d["files"].update({rel: {"size": 10, "sha256": "0"}}))
    with pytest.raises(errors.BadHeaderError, match=r"manifest.json: path .* is outside the model folder"):
        open_model_dir(model)


def test_hf_index_paths_stay_inside_the_folder(tmp_path):
    folder = shutil.copytree(HF_FIXTURES / "llama", tmp_path / "hf")
    shard = next(folder.glob("*.safetensors"))
    shutil.copy(shard, tmp_path / "outside.safetensors")
    from engine.convert.safetensors_file import read_safetensors_header
    names = read_safetensors_header(shard)[0]
    shard.unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: "../outside.safetensors" for n in names}}))
    with pytest.raises(errors.SourceFormatError, match=r"index.json: shard '../outside.safetensors' is outside"):
        convert(folder, tmp_path / "out")


def test_a_tensor_header_length_is_bounded_by_a_limit_not_the_file(model):
    p = model / "router" / "layer_0.bin"
    raw = bytearray(p.read_bytes())
    struct.pack_into("<Q", raw, 8, 1 << 30)
    with open(p, "r+b") as f:
        f.write(raw)
        f.truncate((1 << 30) + 4096)  # sparse: no disk used
    _edit_json(model / "manifest.json", lambda d: d["files"]["router/layer_0.bin"].update(size=p.stat().st_size))
    with pytest.raises(errors.BadHeaderError, match=r"header length 1073741824 is over the \d+-byte limit"):
        open_model_dir(model)


@pytest.mark.parametrize("key,value,match", [
    ("hidden_size", "64", r"'hidden_size' = '64' is not an integer"),
    ("num_layers", -1, r"'num_layers' = -1 is out of range"),
    ("vocab_size", 2 ** 40, r"'vocab_size' = 1099511627776 is out of range"),
    ("rms_norm_eps", "tiny", r"'rms_norm_eps' = 'tiny' is not a number"),
    ("rope_theta", float("inf"), r"'rope_theta' = inf is not a finite number"),
    ("tie_word_embeddings", "yes", r"'tie_word_embeddings' = 'yes' is not true or false"),
    ("top_k", 9, r"'top_k' = 9 is more than num_experts = 4"),
    ("layer_types", ["attention"], r"'layer_types' has 1 entries for 2 layers"),
    ("qk_norm", "sideways", r"'qk_norm' = 'sideways' is not one of"),
])
def test_config_values_are_checked_by_type_and_range(model, key, value, match):
    _edit_json(model / "config.json", lambda d: d["model"].update({key: value}))
    with pytest.raises(errors.ModelFormatError, match=match):
        open_model_dir(model)


def test_a_uint64_alignment_of_zero_is_a_named_error(tmp_path):
    from gguf_fixtures import convert_hf
    plan = convert_hf(HF_FIXTURES / "llama", qtypes=gguf.GGMLQuantizationType.F32)
    plan.set_key("general.alignment", 0, V.UINT64)
    plan.write(tmp_path / "bad.gguf")
    with pytest.raises(errors.SourceFormatError, match=r"'general.alignment' = 0 is not a power of two"):
        convert(tmp_path / "bad.gguf", tmp_path / "out")


def test_a_gguf_is_not_opened_as_a_folder_made_from_another_source(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path / "home"))
    from app.cli_chat import resolve_model
    from app.paths import models_dir
    squatter = convert(HF_FIXTURES / "llama", models_dir() / TINY.stem, "f16").path
    got = resolve_model(str(TINY))
    assert got != squatter
    assert sha256_file(got / "config.json") != sha256_file(squatter / "config.json")
    assert resolve_model(str(TINY)) == got  # the second time: found, not converted again
    assert capsys.readouterr().err.count("converting") == 1
