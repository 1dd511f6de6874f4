"""The models already on the disk: fake homes laid out as LM Studio, Ollama, the Hugging Face cache and
Downloads keep them, holding llama.cpp-made GGUFs (and a truncated one), found read-only."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from app import disk_models
from app.paths import models_dir

FIX = Path(__file__).parent / "fixtures"
TINY = FIX / "llamacpp_presets" / "tiny-q4_0.gguf"  # dense llama, Q4_0
MOE = FIX / "llamacpp_presets" / "tiny-moe-mxfp4_moe.gguf"  # llama with 4 experts, 2 used
GPT_OSS = FIX / "arch_llamacpp" / "gpt_oss-f16.gguf"
LFM2 = FIX / "arch_llamacpp" / "lfm2_moe-f16.gguf"
QWEN = FIX / "arch_llamacpp" / "qwen3_5_moe-f16.gguf"


def fake_home(tmp_path: Path, monkeypatch) -> Path:
    """A home as a user of LM Studio (its folder moved once), Ollama and huggingface_hub has it."""
    home = tmp_path / "home"
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "OLLAMA_MODELS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path / "colibri"))
    down = home / "Downloads"
    down.mkdir(parents=True)
    shutil.copy(TINY, down / "tiny-q4_0.gguf")
    (down / "broken.gguf").write_bytes(TINY.read_bytes()[:3000])  # a download cut short
    for i in (1, 2):  # a split GGUF: listed once, through its first part
        shutil.copy(TINY, down / f"big-0000{i}-of-00002.gguf")
    xdg = home / "Téléchargements"  # a French desktop's download folder, named in user-dirs.dirs
    xdg.mkdir()
    shutil.copy(QWEN, xdg / "qwen3_5_moe-f16.gguf")
    (home / ".config").mkdir()
    (home / ".config" / "user-dirs.dirs").write_text('XDG_DESKTOP_DIR="$HOME/Bureau"\n'
                                                     'XDG_DOWNLOAD_DIR="$HOME/Téléchargements"\n')
    lms = home / ".lmstudio" / "models" / "lmstudio-community" / "gpt-oss-GGUF"
    lms.mkdir(parents=True)
    shutil.copy(GPT_OSS, lms / "gpt_oss-f16.gguf")
    os.symlink(lms / "gpt_oss-f16.gguf", down / "link-to-gpt_oss.gguf")  # the same file twice: listed once
    moved = tmp_path / "disk2" / "lms-models" / "LiquidAI" / "LFM2-GGUF"  # the folder the user moved to
    moved.mkdir(parents=True)
    shutil.copy(LFM2, moved / "lfm2_moe-f16.gguf")
    (home / ".lmstudio" / "settings.json").write_text(json.dumps(
        {"downloadsFolder": str(tmp_path / "disk2" / "lms-models"), "developer": {"showExperimental": False}}))
    ollama = home / ".ollama" / "models"
    digest = hashlib.sha256(MOE.read_bytes()).hexdigest()
    (ollama / "blobs").mkdir(parents=True)
    shutil.copy(MOE, ollama / "blobs" / f"sha256-{digest}")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tinymoe"
    manifest.mkdir(parents=True)
    (manifest / "latest").write_text(json.dumps({  # as `ollama pull` writes it
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "0" * 64, "size": 485},
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
                    "size": MOE.stat().st_size},
                   {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64,
                    "size": 12}]}))
    hub = home / ".cache" / "huggingface" / "hub" / "models--unsloth--tiny-GGUF"
    blob = hub / "blobs" / hashlib.sha256(TINY.read_bytes()).hexdigest()
    blob.parent.mkdir(parents=True)
    shutil.copy(TINY, blob)
    snap = hub / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    os.symlink(Path("../../blobs") / blob.name, snap / "tiny-Q4_0.gguf")  # huggingface_hub's relative link
    return home


def _tree(root: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime) for p in sorted(root.rglob("*"))}


def test_finds_each_app_s_models_with_their_facts(tmp_path, monkeypatch):
    fake_home(tmp_path, monkeypatch)
    found = {m.name: m for m in disk_models.find_models()}
    assert set(found) == {"tiny-q4_0.gguf", "broken.gguf", "big-00001-of-00002.gguf", "qwen3_5_moe-f16.gguf",
                          "lmstudio-community/gpt-oss-GGUF/gpt_oss-f16.gguf", "LiquidAI/LFM2-GGUF/lfm2_moe-f16.gguf",
                          "tinymoe:latest", "unsloth/tiny-GGUF/tiny-Q4_0.gguf"}
    where = {name: m.where for name, m in found.items()}
    assert where["tinymoe:latest"] == "Ollama" and where["unsloth/tiny-GGUF/tiny-Q4_0.gguf"] == "Hugging Face"
    assert where["LiquidAI/LFM2-GGUF/lfm2_moe-f16.gguf"] == where["lmstudio-community/gpt-oss-GGUF/gpt_oss-f16.gguf"] \
        == "LM Studio"
    assert where["qwen3_5_moe-f16.gguf"] == where["tiny-q4_0.gguf"] == "Downloads"
    moe, tiny, oss = found["tinymoe:latest"], found["tiny-q4_0.gguf"], found["lmstudio-community/gpt-oss-GGUF/gpt_oss-f16.gguf"]
    assert (moe.architecture, moe.quantization, moe.experts, moe.experts_used) == ("llama", "MXFP4_MOE", 4, 2)
    assert (tiny.architecture, tiny.quantization, tiny.experts, tiny.size) == ("llama", "Q4_0", 0, TINY.stat().st_size)
    assert (oss.architecture, oss.quantization, oss.experts, oss.experts_used) == ("gpt-oss", "F16", 4, 2)
    for m in found.values():
        if m.name != "broken.gguf":
            assert m.error == "" and m.need_bytes > 0, m
    # the fewest experts cached: a MoE model needs less than its whole size, a dense one at least its weights
    assert moe.need_bytes < moe.size + 4096 * 1024 and tiny.need_bytes > 0.9 * tiny.size


def test_a_bad_file_is_listed_with_its_error_and_a_split_once(tmp_path, monkeypatch):
    fake_home(tmp_path, monkeypatch)
    found = {m.name: m for m in disk_models.find_models()}
    bad = found["broken.gguf"]
    assert bad.size == 3000 and bad.architecture == "" and "bytes" in bad.error
    big = found["big-00001-of-00002.gguf"]
    assert big.parts == 2 and big.size == 2 * TINY.stat().st_size and big.error == ""
    (tmp_path / "home" / "Downloads" / "big-00002-of-00002.gguf").unlink()
    big = next(m for m in disk_models.find_models() if m.name == "big-00001-of-00002.gguf")
    assert "big-00002-of-00002.gguf is missing" in big.error


def test_nothing_is_written_where_models_are_found(tmp_path, monkeypatch):
    home = fake_home(tmp_path, monkeypatch)
    before = _tree(tmp_path / "home"), _tree(tmp_path / "disk2")
    disk_models.find_models()
    assert (_tree(home), _tree(tmp_path / "disk2")) == before


def test_the_hub_cache_follows_hf_hub_cache_and_hf_home(tmp_path, monkeypatch):
    home = fake_home(tmp_path, monkeypatch)
    hub = home / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert not any(m.where == "Hugging Face" for m in disk_models.find_models())
    (tmp_path / "hf").mkdir()
    hub.rename(tmp_path / "hf" / "hub")
    assert [m.name for m in disk_models.find_models() if m.where == "Hugging Face"] == \
        ["unsloth/tiny-GGUF/tiny-Q4_0.gguf"]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    (tmp_path / "hf" / "hub").rename(tmp_path / "elsewhere")
    assert [m.where for m in disk_models.find_models()].count("Hugging Face") == 1


def test_copies_bytes_is_nothing_for_a_gguf_the_worker_opens_in_place(tmp_path, monkeypatch):
    fake_home(tmp_path, monkeypatch)
    tiny = next(m for m in disk_models.find_models() if m.name == "tiny-q4_0.gguf")
    assert disk_models.copies_bytes(tiny) == disk_models.copies_bytes(tiny.path) == 0
    from app.convert_worker import ConvertWorker
    from engine.convert.convert import in_place_refusal
    assert not ConvertWorker().copy_gguf and in_place_refusal("gguf", "keep", True, None) is None


def converted(name: str = "tiny") -> Path:
    from engine.convert.convert import convert
    return convert(TINY, models_dir() / name, "keep").path


def test_delete_only_inside_the_library(tmp_path, monkeypatch):
    home = fake_home(tmp_path, monkeypatch)
    model = converted()
    mine = disk_models.installed()
    assert [m.path for m in mine] == [model] and mine[0].disk_bytes == disk_models.disk_bytes(model) > TINY.stat().st_size // 2
    for outside in (home / "Downloads", models_dir(), models_dir() / ".." / "models" / "..", tmp_path):
        with pytest.raises(ValueError, match="not a model in your library"):
            disk_models.delete_installed(outside)
    os.symlink(home / ".lmstudio", models_dir() / "linked")
    with pytest.raises(ValueError, match="nothing was deleted"):
        disk_models.delete_installed(models_dir() / "linked")
    assert (home / ".lmstudio" / "settings.json").exists()
    disk_models.delete_installed(model)
    assert not model.exists() and disk_models.installed() == []
