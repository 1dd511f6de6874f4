"""colibri-cli as a user runs it: one-shot prompts, an interactive chat over stdin, and errors."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import HF_FIXTURES


def run(*args: str, stdin: str | None = None, home=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if home is not None:
        env["COLIBRI_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "app.cli_chat", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A user data folder shared by these tests: the default model is converted once into it."""
    return tmp_path_factory.mktemp("home")


def test_default_model_first_run_then_cached(home):
    r = run("--prompt", "What is the capital of Japan?", "--temperature", "0", "--max_tokens", "20", home=home)
    assert r.returncode == 0, r.stderr
    assert "Tokyo" in r.stdout
    assert "converting the default model" in r.stderr and "135M-parameter demo" in r.stderr
    assert "decode" in r.stderr and "tok/s" in r.stderr
    assert (home / "data" / "models" / "SmolLM2-135M-Instruct" / "manifest.json").exists()
    again = run("--prompt", "Say hi", "--max_tokens", "5", "--seed", "1", home=home)
    assert again.returncode == 0 and "converting" not in again.stderr


def test_interactive_chat_remembers_the_conversation(home):
    script = "My name is Ada.\nWhat is my name?\n/stats\n/exit\n"
    r = run("--temperature", "0", "--max_tokens", "30", "--system", "You are terse.", stdin=script, home=home)
    assert r.returncode == 0, r.stderr
    replies = [line for line in r.stdout.split("> ") if line.strip()]
    assert len(replies) == 2
    turns = re.findall(r"\((\d+) new, (\d+) reused\)", r.stderr)
    assert len(turns) == 2 and int(turns[0][1]) == 0
    assert int(turns[1][1]) > int(turns[0][0])  # the second turn reused the whole first exchange
    assert "StatsSnapshot" in r.stderr


def test_a_gguf_file_is_converted_once(home, default_gguf):
    r = run("--model", str(default_gguf), "--prompt", "Hi", "--max_tokens", "3", home=home)
    assert r.returncode == 0, r.stderr
    assert (home / "data" / "models" / default_gguf.stem / "config.json").exists()


def test_errors_are_one_line(home, tmp_path):
    r = run("--temperature", "9", "--prompt", "x", home=home)
    assert r.returncode == 1 and "temperature: 9.0 is out of range (0 to 5)" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("--model", str(tmp_path / "missing"), "--prompt", "x", home=home)
    assert r.returncode == 1 and "model directory not found" in r.stderr
    r = run("--model", str(HF_FIXTURES / "llama"), "--prompt", "x", home=home)  # an unconverted HF folder
    assert r.returncode == 1 and "colibri-cli: error:" in r.stderr
    r = run("--prompt", "word " * 300, "--context_length", "64", home=home)
    assert r.returncode == 1 and "the context holds 64" in r.stderr


def test_raw_continuation(home):
    r = run("--raw", "--prompt", "def fibonacci(n):", "--temperature", "0", "--max_tokens", "12", home=home)
    assert r.returncode == 0 and r.stdout.strip()


def test_help_lists_every_parameter():
    from engine.params import PARAMS
    r = run("--help")
    assert r.returncode == 0, r.stderr
    assert all(f"--{name}" in r.stdout for name in PARAMS)


STUB_ENGINE = """
import sys, types
def stop(*args, **kwargs):
    from engine.kernels import isa, simd
    print("path", simd.DOT, isa.SOURCE, "target", __import__("engine.kernels").kernels.SIMD)
    raise SystemExit(0)
sys.modules["engine.api"] = types.SimpleNamespace(Engine=stop)
import app.cli_chat
app.cli_chat.main(sys.argv[1:])
"""


@pytest.mark.parametrize("flags,want", [(["--simd_path", "generic"], "path generic override"),
                                        (["--simd", "avx512"], "target avx512")])
def test_kernel_flags_reach_the_kernels_at_import(tmp_path, flags, want):
    """--simd and --simd_path are read when the kernels are first imported: the CLI puts them in
    the environment before that, so this run (not the next) compiles for them. The engine is a
    stub that reports what the kernels chose; nothing is compiled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLIBRI_SIMD", "COLIBRI_DOT", "NUMBA_CPU"))}
    env.update(COLIBRI_HOME=str(tmp_path), COLIBRI_SIMD_BENCH="0")  # no background dot-path measurement
    r = subprocess.run([sys.executable, "-c", STUB_ENGINE, "--model", str(tmp_path), *flags, "--prompt", "hi"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert want in r.stdout, r.stdout
