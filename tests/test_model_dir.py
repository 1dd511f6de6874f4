"""Opening a model directory names precisely what is wrong with it."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import HF_FIXTURES

from engine import errors
from engine.convert.convert import convert
from engine.model_dir import open_model_dir, sha256_file


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return convert(HF_FIXTURES / "qwen2_moe", tmp_path_factory.mktemp("m") / "model", "int8").path


@pytest.fixture
def model(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "model")


def _set_manifest(model, rel):
    p = model / "manifest.json"
    doc = json.loads(p.read_text())
    doc["files"][rel] = {"size": (model / rel).stat().st_size, "sha256": sha256_file(model / rel)}
    p.write_text(json.dumps(doc))


def test_valid_model_opens_and_verifies(model):
    m = open_model_dir(model, verify=True)
    assert m.config.architecture == "qwen2_moe" and m.config.num_experts == 4
    assert m.split_experts and m.chat_template.startswith("{%") or m.chat_template


def test_missing_file(model):
    (model / "experts" / "layer_1_expert_2.bin").unlink()
    with pytest.raises(errors.MissingFileError, match=r"layer_1_expert_2.bin: missing"):
        open_model_dir(model)


def test_missing_directory(tmp_path):
    with pytest.raises(errors.MissingFileError, match="model directory not found"):
        open_model_dir(tmp_path / "nope")


def test_size_mismatch(model):
    p = model / "router" / "layer_0.bin"
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(errors.SizeMismatchError, match=r"layer_0.bin: size \d+ bytes, manifest.json says \d+"):
        open_model_dir(model)


def test_checksum_mismatch_only_when_verifying(model):
    p = model / "experts" / "layer_0_shared.bin"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF
    p.write_bytes(bytes(raw))
    open_model_dir(model)  # sizes still agree: the cheap check passes
    with pytest.raises(errors.ChecksumMismatchError, match="layer_0_shared.bin: sha256 does not match"):
        open_model_dir(model, verify=True)


def test_bad_header(model):
    p = model / "attention" / "layer_1.bin"
    raw = bytearray(p.read_bytes())
    raw[0:4] = b"XXXX"
    p.write_bytes(bytes(raw))
    with pytest.raises(errors.BadHeaderError, match=r"layer_1.bin: bad header: magic b'XXXX'"):
        open_model_dir(model)


def test_unknown_quant_type(model):
    p = model / "experts" / "layer_0_expert_1.bin"
    raw = p.read_bytes()
    patched = raw.replace(b'"type":"q8_0x8","type_id":1008', b'"type":"q8_1x8","type_id":1009', 1)  # (repacked)
    assert patched != raw
    p.write_bytes(patched)
    with pytest.raises(errors.UnknownQuantTypeError, match="unknown quant type 1009;"):
        open_model_dir(model)


def test_newer_format_version(model):
    p = model / "config.json"
    doc = json.loads(p.read_text())
    doc["format_version"] = 7
    p.write_text(json.dumps(doc))
    with pytest.raises(errors.NewerFormatError, match="format version 7 is newer than this Colibri reads"):
        open_model_dir(model)


def test_not_a_colibri_folder(tmp_path):
    shutil.copytree(HF_FIXTURES / "llama", tmp_path / "hf")
    (tmp_path / "hf" / "manifest.json").write_text("{}")
    with pytest.raises(errors.BadHeaderError, match="is this a Colibri model directory"):
        open_model_dir(tmp_path / "hf")


def test_config_contradicts_tensors(model):
    p = model / "config.json"
    doc = json.loads(p.read_text())
    doc["model"]["num_kv_heads"] = 1
    p.write_text(json.dumps(doc))
    _set_manifest(model, "config.json")
    with pytest.raises(errors.BadHeaderError, match=r"'blk.0.attn_k.weight' has shape \[32, 64\], config.json implies \[16, 64\]"):
        open_model_dir(model)


def test_manifest_missing_or_corrupt(model):
    (model / "manifest.json").write_text("{broken")
    with pytest.raises(errors.BadHeaderError, match="manifest.json is not valid JSON"):
        open_model_dir(model)
    (model / "manifest.json").unlink()
    with pytest.raises(errors.MissingFileError, match="missing manifest.json"):
        open_model_dir(model)
