"""Reading and rewriting Hugging Face fixture checkpoints in tests."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

from engine.convert.safetensors_file import read_tensors

_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U8": np.uint8}


def read_safetensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (dtype, values as float32; raw integers for integer dtypes), through the engine's
    one safetensors reader (engine.convert.safetensors_file, itself held to the `safetensors`
    package in test_convert_hf)."""
    return {name: (dt, arr if dt.startswith(("I", "U", "BOOL")) else arr.astype(np.float32))
            for name, (dt, arr) in read_tensors(path).items()}


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
