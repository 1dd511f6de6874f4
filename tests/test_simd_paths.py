"""The dot-product path is measured per CPU and cached (engine.kernels.isa): the cache is
written and reused, measured again when the key changes, a wrong path is excluded, the override
wins, and stats() names what runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import HF_FIXTURES

from engine.kernels import isa, isa_run, simd, table

VNNI = {"avx2": True, "avxvnni": True}  # a CPU with all three paths and no AVX-512 (AVX-VNNI: Alder Lake)
WIDE = {"avx2": True, "avx512f": True, "avx512vl": True, "avx512vnni": True}  # AVX-512 VNNI, no AVX-VNNI (Zen 4)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path))
    monkeypatch.setenv("COLIBRI_SIMD_BENCH", "1")
    return tmp_path


def runner_of(times: dict[str, dict]):
    calls = []

    def run(path: str) -> dict:
        calls.append(path)
        return times[path]
    return run, calls


def test_the_paths_a_cpu_can_execute():
    assert isa.executable(WIDE) == ("vnni", "avx2", "generic")
    assert isa.executable({"avx2": True, "avxvnni": True}) == ("vnni", "avx2", "generic")
    assert isa.executable({"avx2": True}) == ("avx2", "generic")
    assert isa.executable({}) == ("generic",)


def test_the_measurement_is_cached_and_reused_until_the_key_changes(home):
    run, calls = runner_of({"vnni": {"q4_0": 2.0, "q4_k": 2.0}, "avx2": {"q4_0": 1.0, "q4_k": 1.5},
                            "generic": {"q4_0": 9.0, "q4_k": 9.0}})
    assert isa.decide("v1", VNNI, runner=run)[:2] == ("avx2", "measured")  # the fastest, not the newest
    assert calls == ["vnni", "avx2", "generic"]
    data = json.loads((home / isa.CACHE_NAME).read_text())
    assert data["key"] == isa.cache_key("v1", VNNI) and data["choice"] == "avx2"
    assert isa.cpu_model() in data["key"] and "avxvnni" in data["key"]
    assert isa.decide("v1", VNNI, runner=run)[:2] == ("avx2", "measured") and len(calls) == 3  # reused
    isa.decide("v2", VNNI, runner=run)  # the kernels changed: measured again
    assert len(calls) == 6
    isa.decide("v2", {"avx2": True}, runner=run)  # another CPU (features): measured again
    assert calls[6:] == ["avx2", "generic"]


def test_a_close_second_keeps_the_first_path():
    assert isa.choose({"vnni": {"a": 1.04}, "avx2": {"a": 1.0}}) == "vnni"
    assert isa.choose({"vnni": {"a": 1.06}, "avx2": {"a": 1.0}}) == "avx2"
    assert isa.choose({"vnni": {}, "avx2": {"a": None}}) == "generic"


def test_every_case_weighs_the_same_whatever_its_size():
    """A prefill case takes 64 decodes' time: summed raw it alone would decide; as ratios to the
    best entry, a path twice as fast at decode and 10% slower at prefill wins."""
    times = {"vnni": {"q4_0": 2.0, "q4_0@64": 100.0}, "avx2": {"q4_0": 1.0, "q4_0@64": 110.0}}
    assert isa.choose(times) == "avx2"
    assert isa.choose({"avx2/vnni": {"a": 1.0}, "avx512/vnni": {"a": 0.5}, "avx2/generic": {"a": 9.0}}) == "avx512/vnni"
    assert isa.choose({"avx2/vnni": {}, "avx2/generic": {"a": None}}) == "avx2/generic"


def test_with_avx512_each_path_is_measured_under_both_targets(home, monkeypatch):
    """Whether AVX-512 pays is measured, not read off the vendor: the vendor's default goes first
    (kept when within 5%), the measured target is what engine.kernels applies at the next start."""
    monkeypatch.setattr(isa, "vendor_target", lambda: "avx2")  # an Intel CPU
    assert isa.candidates(WIDE) == ("avx2/avx2", "avx512/vnni", "avx2/generic")
    both = dict(WIDE, avxvnni=True)  # Sapphire Rapids: AVX-VNNI as well
    assert isa.candidates(both) == ("avx2/vnni", "avx2/avx2", "avx512/vnni", "avx2/generic")
    assert isa.candidates({"avx2": True, "avx512f": True}) == ("avx2/avx2", "avx512/avx2", "avx2/generic")  # Skylake-X
    monkeypatch.setattr(isa, "vendor_target", lambda: "avx512")  # an AMD CPU
    assert isa.candidates(WIDE) == ("avx512/vnni", "avx2/avx2", "avx2/generic")
    assert isa.candidates(VNNI) == ("vnni", "avx2", "generic")  # no AVX-512: nothing to choose
    monkeypatch.setenv("COLIBRI_USER_TARGET", "1")  # the user set numba's target: theirs
    assert isa.candidates(WIDE) == ("vnni", "avx2", "generic")
    monkeypatch.setenv("COLIBRI_USER_TARGET", "0")
    run, calls = runner_of({"avx512/vnni": {"q4_k@64": 1.0}, "avx2/avx2": {"q4_k@64": 1.8},
                            "avx2/generic": {"q4_k@64": 9.0}})
    monkeypatch.setattr(isa, "host_features", lambda: WIDE)
    assert isa.decide("v1", WIDE, runner=run)[:2] == ("vnni", "measured")
    assert calls == list(isa.candidates(WIDE)) and isa.measured_target("v1") == "avx512"
    assert isa.measured_target("v2") is None  # other kernels: not measured yet


def test_run_child_hands_the_target_to_a_fresh_process(monkeypatch):
    """"avx512/vnni" runs its child with COLIBRI_SIMD=avx512 and without this process's
    AVX-512-less numba target (which the child would otherwise take as the user's)."""
    seen = {}

    def run(args, env, **kw):
        seen.update(env)
        return __import__("subprocess").CompletedProcess(args, 0, '{"q4_0": 1.0}\n', "")
    monkeypatch.setattr(isa.subprocess, "run", run)  # (NUMBA_CPU_FEATURES is not set here: a process with numba
    # loaded re-reads numba's variables when they change, and would compile later kernels for that target)
    assert isa.run_child("avx512/vnni") == {"q4_0": 1.0}
    assert seen["COLIBRI_SIMD"] == "avx512" and seen["COLIBRI_DOT"] == "vnni" and "NUMBA_CPU_FEATURES" not in seen
    seen.clear()
    isa.run_child("avx2")  # no AVX-512 to choose: the child runs under this process's target
    assert seen["COLIBRI_DOT"] == "avx2" and seen.get("COLIBRI_SIMD") == __import__("os").environ.get("COLIBRI_SIMD")


def test_a_wrong_or_failed_path_is_excluded(home):
    run, _ = runner_of({"vnni": {"q4_0": 0.5, "q4_k": None}, "avx2": {}, "generic": {"q4_0": 3.0, "q4_k": 3.0}})
    path, how, data = isa.decide("v1", VNNI, runner=run)  # vnni fastest but wrong on q4_k; avx2 crashed
    assert (path, how) == ("generic", "measured") and data["times"]["vnni"]["q4_k"] is None


def test_the_child_excludes_a_kernel_that_disagrees_with_its_twin(monkeypatch):
    import numba
    right = table.resolve
    wrong = {"q4_0"}

    def resolve(name):
        f = right(name)
        return (lambda w, fmt, x: f(w, fmt, x) * (1.01 if fmt in wrong else 1.0)) if "reference" in name else f
    monkeypatch.setattr(table, "resolve", resolve)
    monkeypatch.setattr(isa, "FORMATS", ("q4_0", "q8_0"))
    threads = numba.get_num_threads()
    try:
        out = isa_run._child(simd.DOT)  # this process's path, in process (the kernels are compiled already)
    finally:
        numba.set_num_threads(threads)
    assert out["q4_0"] is None and out["q8_0"] > 0


def test_the_override_wins_over_the_measurement(home):
    run, calls = runner_of({"vnni": {"q4_0": 1.0}, "avx2": {"q4_0": 2.0}, "generic": {"q4_0": 3.0}})
    assert isa.decide("v1", VNNI, runner=run)[0] == "vnni"
    assert isa.decide("v1", VNNI, "generic", runner=run)[:2] == ("generic", "override")
    with pytest.raises(ValueError, match="simd_path vnni: this CPU .* runs only avx2, generic"):
        isa.decide("v1", {"avx2": True}, "vnni", runner=run)
    with pytest.raises(ValueError, match="simd_path 'sse'"):
        isa.decide("v1", VNNI, "sse", runner=run)


def test_without_a_measurement_simd_py_picks(home, monkeypatch):
    monkeypatch.setenv("COLIBRI_SIMD_BENCH", "0")
    run, calls = runner_of({})
    assert isa.decide("v1", VNNI, runner=run) == (None, "default", {}) and calls == []


def test_stats_names_the_path_and_the_kernel_per_format(tmp_path):
    from engine.api import Engine
    from engine.convert.convert import convert
    eng = Engine(convert(HF_FIXTURES / "llama", tmp_path / "m", "int4").path)
    snap = eng.stats()
    assert snap.simd_path == f"{simd.DOT} ({isa.SOURCE}, {512 if simd.WIDE else 256}-bit)"
    assert snap.kernels and all(v == table.describe(k) for k, v in snap.kernels.items())
    assert np.all([k in table.ALL for k in snap.kernels])


def test_the_dashboard_shows_what_runs_in_one_line():
    from types import SimpleNamespace

    from ui.dashboard_text import kernels_line as _kernels_line
    snap = SimpleNamespace(simd_path="vnni (measured)", kernels={"q4_k": "kquants (vnni)", "f32": "cpu (float)"})
    assert _kernels_line(snap) == " · kernels vnni (measured): q4_k kquants, f32 cpu"
    assert _kernels_line(SimpleNamespace()) == ""  # a remote endpoint's stats: nothing to show
    snap.route = "layered (a prompt of 12 tokens)"  # the route of the last step through the decoder loop
    assert _kernels_line(snap).endswith(" · route layered (a prompt of 12 tokens)")


def test_a_first_start_measures_in_the_background_once(home, monkeypatch):
    """Without a cached choice, the measurement is a detached low-priority process (a first start
    is not held up by numba compiling every path); a second one is not started while it runs."""
    started = []

    class Popen:
        def __init__(self, args, **kw):
            started.append((args, kw))
    monkeypatch.setattr(isa.subprocess, "Popen", Popen)
    assert isa.measure_in_background("v1") and len(started) == 1
    args, kw = started[0]
    assert kw["start_new_session"] and kw["env"]["COLIBRI_SIMD_BENCH"] == "0" and "os.nice(10)" in args[2]
    lock = isa.cache_path().with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(str(__import__("os").getpid()))  # a live measurer holds the lock
    assert not isa.measure_in_background("v1") and len(started) == 1
    lock.write_text("999999999")  # a dead one does not
    assert isa.measure_in_background("v1") and len(started) == 2
