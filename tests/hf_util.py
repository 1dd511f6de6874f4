"""Reading and rewriting Hugging Face fixture checkpoints in tests (independent of engine/)."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32}


def read_safetensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (dtype, values as float32; raw integers for integer dtypes)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    out = {}
    for name, e in head.items():
        a, b = e["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], _NP[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = (e["dtype"], arr.astype(np.float32) if e["dtype"] != "I32" else arr)
    return out


def read_folder(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for p in sorted(folder.glob("*.safetensors")):
        out.update({k: v for k, (_, v) in read_safetensors(p).items()})
    return out


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Write arrays with an explicit safetensors dtype ('F32', 'F16', 'BF16' (bits), 'I32')."""
    head, blobs, pos = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        data = np.ascontiguousarray(arr.astype(_NP[dtype])).tobytes()
        head[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [pos, pos + len(data)]}
        blobs.append(data)
        pos += len(data)
    body = json.dumps(head).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"".join(blobs))


def copy_fixture(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(folder: Path, **changes) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))
