"""A weight file cut short while the engine runs gives an error naming it (not SIGBUS); an empty
prompt gives a clear error (as llama-cli: BOS only for a model that adds one)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import HF_FIXTURES

from engine.api import Engine
from engine.convert.convert import convert

CHILD = textwrap.dedent("""
    import os, sys
    from engine import kernels
    kernels.setup()
    from engine.api import Engine
    from engine.errors import SizeMismatchError
    eng = Engine(sys.argv[1])
    list(eng.generate("one two three", temperature=0, max_tokens=2))
    victim = eng.weights.files[-1].path  # a layer's file, mapped since loading
    os.truncate(victim, os.path.getsize(victim) // 2)
    try:
        list(eng.generate("four five six", temperature=0, max_tokens=2))
    except SizeMismatchError as e:
        print("ERROR", e)
    else:
        print("NO ERROR")
""")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return convert(HF_FIXTURES / "llama", tmp_path_factory.mktemp("dense") / "m", "keep").path


def test_a_weight_file_truncated_between_calls_is_an_error_naming_it(dense, tmp_path):
    # in a child: were the check missing, the second generate() would die of SIGBUS
    model = shutil.copytree(dense, tmp_path / "m")  # the module's copy stays whole
    r = subprocess.run([sys.executable, "-c", CHILD, str(model)], capture_output=True, text=True, timeout=300,
                       env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip().splitlines()[-1]
    assert out.startswith("ERROR") and str(model) in out and "shrank" in out, out


def test_an_empty_prompt_is_a_clear_error_or_starts_from_bos(dense):
    eng = Engine(dense)
    assert eng.tokenize("") == ([eng.codec.bos_id] if eng.codec.add_bos else [])
    eng.codec.add_bos = False
    with pytest.raises(ValueError, match="prompt is empty"):
        eng.generate(eng.detokenize([]))
    eng.codec.add_bos, eng.codec.bos_id = True, 1
    steps = list(eng.generate("", temperature=0, max_tokens=2))  # from BOS, as llama-cli
    assert steps[-1].finish_reason in ("length", "stop") and eng.tokens[0] == 1
