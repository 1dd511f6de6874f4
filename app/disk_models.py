"""The models already on the disk: GGUFs in Downloads, LM Studio, Ollama and the Hugging Face cache.

A newcomer has models from other apps; the wizard lists them instead of opening empty. Everything
here only reads (another app's folders are never written): a GGUF's header alone is parsed, and a
bad file is listed with its error. Colibri's own converted models are listed too, with their disk
size and a Delete that refuses anything outside the user's library. No Qt here.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.model_library import installed_models
from app.model_info import CONTEXT
from app.paths import models_dir

SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")
OLLAMA_MODEL = "application/vnd.ollama.image.model"


@dataclass(frozen=True)
class FoundModel:
    path: Path  # the file to open (a split GGUF's first part)
    where: str  # "Downloads", "LM Studio", "Ollama", "Hugging Face"
    name: str
    size: int  # bytes, all parts
    parts: int = 1
    architecture: str = ""
    quantization: str = ""
    experts: int = 0  # routed experts per layer (0: dense)
    experts_used: int = 0  # picked per token
    need_bytes: int = 0  # memory to run it with the fewest experts cached (0: unknown)
    error: str = ""  # why it cannot be read or run ("" when it can)


@dataclass(frozen=True)
class InstalledModel:
    path: Path
    disk_bytes: int

    @property
    def name(self) -> str:
        return self.path.name


# --- where users keep models ------------------------------------------------------------------

def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def download_dirs() -> list[Path]:
    """~/Downloads and the XDG download folder (user-dirs.dirs), which a localized desktop renames."""
    home = _home()
    dirs = [home / "Downloads"]
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "user-dirs.dirs"
    try:
        for line in config.read_text().splitlines():
            m = re.match(r'\s*XDG_DOWNLOAD_DIR\s*=\s*"(.*)"', line)
            if m:
                dirs.append(Path(m.group(1).replace("$HOME", str(home))))
    except OSError:
        pass
    return dirs


def lmstudio_dirs() -> list[Path]:
    """LM Studio's models folder: the default under its home, the older cache one, and the folder the
    user moved it to (`downloadsFolder` in its settings.json)."""
    home = _home()
    lms = home / ".lmstudio"
    try:  # a relocated LM Studio home is named by this pointer file
        lms = Path((home / ".lmstudio-home-pointer").read_text().strip()) or lms
    except OSError:
        pass
    dirs = [lms / "models", home / ".cache" / "lm-studio" / "models"]
    for settings in (lms / "settings.json", home / ".cache" / "lm-studio" / "settings.json"):
        try:
            moved = json.loads(settings.read_text()).get("downloadsFolder")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(moved, str) and moved:
            dirs.append(Path(moved).expanduser())
    return dirs


def ollama_dirs() -> list[Path]:
    home = _home()
    dirs = [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]  # the Linux service's
    return ([Path(os.environ["OLLAMA_MODELS"])] if os.environ.get("OLLAMA_MODELS") else []) + dirs


def hf_hub_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME") or _home() / ".cache") / "huggingface" / "hub"


def _ggufs(root: Path, depth: int) -> Iterator[Path]:
    """*.gguf files under `root`, at most `depth` folders down (a Downloads folder can be large)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.name.startswith("."):
            continue
        try:
            if e.name.lower().endswith(".gguf") and e.is_file():
                yield Path(e.path)
            elif depth > 0 and e.is_dir(follow_symlinks=False):
                yield from _ggufs(Path(e.path), depth - 1)
        except OSError:
            continue


def _ollama(root: Path) -> Iterator[tuple[Path, str]]:
    """(blob, "model:tag") for each manifest whose model layer is there: Ollama names its GGUFs by digest."""
    manifests = root / "manifests"
    for tag in sorted(manifests.glob("*/*/*/*")):
        try:
            doc = json.loads(tag.read_text())
            digest = next(la["digest"] for la in doc["layers"] if la.get("mediaType") == OLLAMA_MODEL)
        except (OSError, ValueError, KeyError, TypeError, StopIteration):
            continue
        blob = root / "blobs" / str(digest).replace(":", "-")
        host, ns, model = tag.parts[-4:-1]
        name = f"{model}:{tag.name}" if (host, ns) == ("registry.ollama.ai", "library") else \
            f"{ns}/{model}:{tag.name}" if host == "registry.ollama.ai" else f"{host}/{ns}/{model}:{tag.name}"
        if blob.is_file():
            yield blob, name


def _candidates() -> Iterator[tuple[Path, str, str]]:
    """(file, where, display name), in the order they are listed: an app's own folders before Downloads,
    so a file linked from both is named as its app names it."""
    for d in lmstudio_dirs():
        for p in _ggufs(d, 3):
            rel = p.relative_to(d).parts
            yield p, "LM Studio", "/".join(rel[:-1][-2:] + (p.name,))
    for d in ollama_dirs():
        for blob, name in _ollama(d):
            yield blob, "Ollama", name
    for repo in sorted(hf_hub_dir().glob("models--*")):
        for p in _ggufs(repo / "snapshots", 3):
            yield p, "Hugging Face", repo.name.removeprefix("models--").replace("--", "/") + "/" + p.name
    for d in download_dirs():
        for p in _ggufs(d, 2):
            yield p, "Downloads", p.name


# --- what each file is ------------------------------------------------------------------------

def _split_parts(path: Path) -> list[Path] | None:
    m = SPLIT.match(path.name)
    if not m:
        return None
    count = int(m["count"])
    return [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _tensor_bytes(header) -> tuple[int, int]:
    """(dense, routed experts) bytes of a header's tensors."""
    import gguf
    dense = experts = 0
    for t in header.tensors:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.tensor_type)]
        n = math.prod(t.shape) // block * size
        experts += n if "_exps." in t.name else 0
        dense += 0 if "_exps." in t.name else n
    return dense, experts


def _quantization(fields: dict, header) -> str:
    import gguf
    try:
        return gguf.LlamaFileType(int(fields["general.file_type"])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError, TypeError):
        types: dict[str, int] = {}
        for t in header.tensors:
            if len(t.shape) > 1:
                name = gguf.GGMLQuantizationType(t.tensor_type).name
                types[name] = types.get(name, 0) + 1
        return max(types, key=types.__getitem__) if types else ""


def _need_bytes(path: Path, dense: int, experts: int) -> int:
    """The wizard's "memory from": resident weights, top-k experts of each layer and a 4,096-token KV
    cache (app.model_info's estimate; the engine's own plan needs the converted model)."""
    from engine.convert.gguf_file import GGUFModel
    from engine.kvcache import model_cache_bytes
    g = GGUFModel(path)
    try:
        cfg = g.config()
    finally:
        g.close()
    used = experts * cfg.top_k // cfg.num_experts if cfg.is_moe else experts
    return dense + used + model_cache_bytes(cfg, min(CONTEXT, cfg.max_position_embeddings))


def describe(path: Path, where: str, name: str) -> FoundModel:
    """What one GGUF is, from its header; any problem is the entry's error, never an exception."""
    from engine.convert.gguf_file import check_layout
    from engine.convert.gguf_header import read_header
    parts = _split_parts(path) or [path]
    try:
        size = sum(p.stat().st_size for p in parts)
    except OSError:
        missing = next(p for p in parts if not p.exists())
        return FoundModel(path, where, name, 0, len(parts), error=f"{missing.name} is missing")
    try:
        headers = []
        for p in parts:
            check_layout(p)  # every count bounded by the file before anything is read
            headers.append(read_header(p))
        fields = headers[0].fields
        arch = str(fields.get("general.architecture", ""))
        dense = experts = 0
        for h in headers:
            d, e = _tensor_bytes(h)
            dense, experts = dense + d, experts + e
        found = FoundModel(path, where, name, size, len(parts), arch, _quantization(fields, headers[0]),
                           int(fields.get(f"{arch}.expert_count") or 0),
                           int(fields.get(f"{arch}.expert_used_count") or 0))
    except Exception as e:  # noqa: BLE001 - a bad file is listed with its error
        return FoundModel(path, where, name, size, len(parts), error=_short(e, path))
    try:
        return _with(found, need_bytes=_need_bytes(path, dense, experts))
    except Exception as e:  # noqa: BLE001 - readable, but Colibri cannot run it: say why
        return _with(found, error=_short(e, path))


def _with(found: FoundModel, **changes) -> FoundModel:
    from dataclasses import replace
    return replace(found, **changes)


def _short(e: Exception, path: Path) -> str:
    """The error without the path the row shows already."""
    return str(e).replace(f"{path}: ", "").split("; supported:")[0] or type(e).__name__


def find_models() -> list[FoundModel]:
    """Every GGUF where users keep them, once each (a file reached twice, a split GGUF's other parts)."""
    seen: set[str] = set()
    found = []
    for path, where, name in _candidates():
        parts = _split_parts(path)
        if parts and path != parts[0] and parts[0].exists():
            continue  # listed through its first part
        key = os.path.realpath(path)
        if key in seen:
            continue
        seen.add(key)
        found.append(describe(path, where, name))
    return found


# --- what opening one costs, and Colibri's own models -----------------------------------------

def copies_bytes(source: FoundModel | Path) -> int:
    """Bytes a conversion with the source's own types writes: 0 where a GGUF opens in place (the
    conversion worker's default: the model folder holds an index into the file), the whole size
    where it is split in parts, which are copied."""
    path = source.path if isinstance(source, FoundModel) else Path(source)
    if path.is_file() and not _split_parts(path):
        return 0
    return source.size if isinstance(source, FoundModel) else \
        sum(p.stat().st_size for p in (_split_parts(path) or [path]))


def free_memory() -> int:
    """Memory this process may use now, as the engine's plan measures it."""
    from engine.sysmem import room
    return room()[0]


def disk_bytes(folder: Path) -> int:
    """Bytes the folder's files take (links not followed: a link into a GGUF costs nothing)."""
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue
    return total


def installed() -> list[InstalledModel]:
    return [InstalledModel(p, disk_bytes(p)) for p in installed_models()]


def delete_installed(path: str | Path) -> None:
    """Delete a converted model: only a folder directly in the user's library, never a link or a source."""
    path, library = Path(path), models_dir().resolve()
    if path.is_symlink() or path.resolve().parent != library or path.name.startswith(".") or not path.is_dir():
        raise ValueError(f"{path}: not a model in your library ({library}); nothing was deleted")
    shutil.rmtree(path)
