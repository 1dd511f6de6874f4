"""Tensor files: 64-byte alignment, zero-copy mapping, and a precise error for each bad header."""
import json
import struct

import numpy as np
import pytest

from engine import errors, quant, tensorfile


@pytest.fixture
def sample(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "blk.0.attn_q.weight": (rng.standard_normal((8, 64)).astype(np.float32), "q4_1"),
        "blk.0.attn_norm.weight": (rng.standard_normal(7).astype(np.float32), "f32"),
        "token_embd.weight": (rng.standard_normal((5, 32)).astype(np.float32), "q8_0"),
        "output.weight": (rng.standard_normal((3, 5)).astype(np.float32), "f16"),
    }
    path = tmp_path / "t.bin"
    size, sha = tensorfile.write_tensor_file(path, tensors, {"note": "x"})
    return path, tensors, size, sha


def test_round_trip_aligned_and_zero_copy(sample):
    path, tensors, size, sha = sample
    assert path.stat().st_size == size and len(sha) == 64
    with tensorfile.TensorFile(path) as f:
        assert f.names() == list(tensors) and f.meta == {"note": "x"}
        for name, (x, qname) in tensors.items():
            info = f.infos[name]
            assert info.offset % 64 == 0 and info.qtype.name == qname
            a = f.tensor(name)
            assert not a.flags.owndata and not a.flags.writeable  # a view of the mapping
            expected = quant.dequantize(quant.quantize(x, qname), qname)
            assert np.array_equal(f.dequantize(name), expected)


def test_views_share_the_mapping(sample):
    path, *_ = sample
    f = tensorfile.TensorFile(path)
    a, b = f.tensor("blk.0.attn_q.weight"), f.tensor("blk.0.attn_q.weight")
    assert np.shares_memory(a, b)  # both views point into the same mmap, nothing copied
    base = np.frombuffer(f._mmap, np.uint8)
    assert np.shares_memory(a, base)
    assert (a.ctypes.data - base.ctypes.data) % 64 == 0


def _resident_pages(a: np.ndarray) -> int:
    """Pages of a's range that are in this process's page tables (/proc/self/pagemap)."""
    import mmap
    import os
    page = mmap.PAGESIZE
    first, last = a.ctypes.data // page, (a.ctypes.data + a.nbytes - 1) // page
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        raw = os.pread(fd, 8 * (last - first + 1), 8 * first)
    finally:
        os.close(fd)
    return sum(int.from_bytes(raw[i:i + 8], "little") >> 63 for i in range(0, len(raw), 8))


def test_release_drops_the_pages_and_keeps_the_bytes(tmp_path):
    """A repacked matrix's source pages leave the resident set (its copy holds the bytes now);
    the mapped view still reads the same values."""
    import os
    import sys
    x = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)  # 512 KB: whole pages
    path = tmp_path / "big.bin"
    tensorfile.write_tensor_file(path, {"w": (x, "f32")}, {})
    with tensorfile.TensorFile(path) as f:
        a = f.tensor("w")
        before = a.copy()  # touches every page
        if not sys.platform.startswith("linux") or not os.access("/proc/self/pagemap", os.R_OK):
            pytest.skip("no /proc/self/pagemap to count resident pages")
        assert _resident_pages(a) >= a.nbytes // 4096 - 1
        f.release("w")
        assert _resident_pages(a) <= 2  # at most the partial pages at the ends
        assert np.array_equal(a, before)


def _patch_header(path, edit):
    raw = bytearray(path.read_bytes())
    magic, version, hlen = struct.unpack_from("<4sIQ", raw)
    doc = json.loads(raw[16:16 + hlen])
    edit(doc)
    body = json.dumps(doc, separators=(",", ":")).encode()
    assert len(body) <= hlen, "test edit must not grow the header"
    raw[16:16 + hlen] = body.ljust(hlen, b" ")
    path.write_bytes(bytes(raw))


def test_bad_magic(sample):
    path, *_ = sample
    raw = bytearray(path.read_bytes())
    raw[:4] = b"GGUF"
    path.write_bytes(bytes(raw))
    with pytest.raises(errors.BadHeaderError, match="magic"):
        tensorfile.TensorFile(path)


def test_newer_version(sample):
    path, *_ = sample
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 4, 99)
    path.write_bytes(bytes(raw))
    with pytest.raises(errors.NewerFormatError, match="version 99 is newer"):
        tensorfile.TensorFile(path)


def test_truncated(sample):
    path, *_ = sample
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(errors.SizeMismatchError, match="truncated"):
        tensorfile.TensorFile(path)


def test_too_short_for_a_header(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"CLB")
    with pytest.raises(errors.BadHeaderError, match="too short"):
        tensorfile.TensorFile(p)


def test_header_lies_about_size(sample):
    path, *_ = sample
    _patch_header(path, lambda d: d["tensors"]["blk.0.attn_q.weight"].update(nbytes=12))
    with pytest.raises(errors.BadHeaderError, match="needs 320 bytes, header says 12"):
        tensorfile.TensorFile(path)


def test_unknown_quant_type(sample):
    path, *_ = sample
    _patch_header(path, lambda d: d["tensors"]["output.weight"].update(type_id=77, type="q9"))
    with pytest.raises(errors.UnknownQuantTypeError, match="unknown quant type 77"):
        tensorfile.TensorFile(path)


def test_misaligned_and_overlapping(sample):
    path, *_ = sample
    orig = path.read_bytes()
    _patch_header(path, lambda d: d["tensors"]["output.weight"].update(offset=d["tensors"]["output.weight"]["offset"] + 4))
    with pytest.raises(errors.BadHeaderError, match="not a 64-byte aligned"):
        tensorfile.TensorFile(path)
    path.write_bytes(orig)

    def overlap(d):
        t = d["tensors"]
        t["output.weight"]["offset"] = t["token_embd.weight"]["offset"]
    _patch_header(path, overlap)
    with pytest.raises(errors.BadHeaderError, match="overlap"):
        tensorfile.TensorFile(path)


def test_garbage_json(sample):
    path, *_ = sample
    raw = bytearray(path.read_bytes())
    raw[16:20] = b"\xff\xfe{{"
    path.write_bytes(bytes(raw))
    with pytest.raises(errors.BadHeaderError, match="bad header"):
        tensorfile.TensorFile(path)


def test_writer_streams_rows_in_chunks(tmp_path):
    x = np.random.default_rng(1).standard_normal((10, 64)).astype(np.float32)
    plan = [tensorfile.TensorPlan("w", quant.get("q8_0"), (10, 64))]
    w = tensorfile.TensorFileWriter(tmp_path / "c.bin", plan)
    stored = quant.quantize(x, "q8_0")
    for a in range(0, 10, 3):
        w.write("w", stored[a:a + 3])
    w.close()
    with tensorfile.TensorFile(tmp_path / "c.bin") as f:
        assert np.array_equal(f.tensor("w"), stored)
