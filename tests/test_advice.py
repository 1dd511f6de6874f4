"""The dashboard's advice rules, one by one, on plain snapshots (no Qt, no engine)."""
from __future__ import annotations

import dataclasses
import types

import pytest

from app.advice import (NO_HARDWARE, advice, configured_threads, effective_threads, energy_missing, filesystem_of,
                        joules_per_token, missing, read_mounts, throttled)
from engine.weight_types import CacheStats
from engine.throttle import ThrottleEvent

MOUNTS = [("/", "ext4"), ("/dev/shm", "tmpfs"), ("/home", "ext4"), ("/home/ann/ram", "tmpfs")]


def cache(hits=90, misses=10, prefetch=0.9, enabled=True, capacity=4) -> CacheStats:
    return CacheStats(capacity, 0, 0, hits, misses, 0, 0, 0.0, hits / max(hits + misses, 1), 0.5, prefetch,
                      enabled, (), ())


def snap(**kw):
    base = dict(num_experts=8, threads=2, params={"threads": None}, expert_cache=cache())
    return types.SimpleNamespace(**(base | kw))


def say(s, **kw) -> list[str]:
    return advice(s, mounts=MOUNTS, physical_cores=2, **kw)


def test_a_healthy_engine_gets_no_advice():
    assert say(snap(), model_path="/home/ann/models/mixtral") == []


def test_low_hit_rate_says_raise_the_expert_cache_size():
    lines = say(snap(expert_cache=cache(hits=50, misses=50, capacity=2)))
    assert len(lines) == 1 and "raise the expert cache size" in lines[0]
    assert "50%" in lines[0] and "2 of 8 experts per layer" in lines[0]
    assert say(snap(expert_cache=cache(hits=5, misses=10))) == []  # too few lookups to judge
    assert say(snap(num_experts=1, expert_cache=cache(hits=10, misses=90))) == []  # dense: no experts to cache


def test_low_prefetch_accuracy_suggests_turning_prefetch_off():
    lines = say(snap(expert_cache=cache(prefetch=0.3)))
    assert len(lines) == 1 and "30%" in lines[0] and "prefetch_window" in lines[0]
    assert say(snap(expert_cache=cache(prefetch=0.3, enabled=False))) == []
    paused = say(snap(expert_cache=dataclasses.replace(cache(prefetch=0.3), prefetch_paused=True)))
    assert len(paused) == 1 and "paused it" in paused[0] and "prefetch_window" in paused[0]
    assert say(snap(expert_cache=cache(prefetch=None))) == []


@pytest.mark.parametrize("path,expected", [("/dev/shm/model", True), ("/home/ann/ram/m", True),
                                           ("/home/ann/models/m", False), ("/dev/shmx/m", False)])
def test_model_on_tmpfs_means_mmap_saves_nothing(path, expected):
    lines = say(snap(), model_path=path)
    assert bool(lines) is expected
    if expected:
        assert "mmap saves nothing: the model is already in RAM" in lines[0] and "tmpfs" in lines[0]


def test_model_path_may_come_with_the_snapshot():
    assert "mmap saves nothing" in say(snap(model_path="/dev/shm/m"))[0]


def test_filesystem_lookup_takes_the_longest_mount_and_reads_proc_mounts(tmp_path):
    assert filesystem_of("/home/ann/ram/x", MOUNTS) == ("/home/ann/ram", "tmpfs")
    assert filesystem_of("/home/ann/x", MOUNTS) == ("/home", "ext4")
    f = tmp_path / "mounts"
    f.write_text("tmpfs /dev/shm tmpfs rw 0 0\n/dev/sda1 /my\\040disk ext4 rw 0 0\n")
    assert read_mounts(str(f)) == [("/dev/shm", "tmpfs"), ("/my disk", "ext4")]
    assert read_mounts(str(tmp_path / "none")) == []
    assert "/" in dict(read_mounts())  # this machine's own table parses


def test_a_fallback_to_cpu_is_reported():
    lines = say(snap(fallbacks=("layer 3 attention: GPU out of memory (needs 1.2 GB, 0.4 GB free)",)))
    assert lines == ["A fallback to the CPU happened: layer 3 attention: GPU out of memory "
                     "(needs 1.2 GB, 0.4 GB free)."]


def test_active_throttling_is_reported_and_a_recovered_one_is_not():
    down = [ThrottleEvent(1.0, 2, 1, 91.0, "hot")]
    lines = say(snap(throttle_events=down))
    assert throttled(snap(throttle_events=down))
    assert len(lines) == 1 and "Thermal throttling is active" in lines[0] and "1 of 2 threads" in lines[0]
    back = down + [ThrottleEvent(5.0, 1, 2, 70.0, "cool")]
    assert say(snap(throttle_events=back)) == [] and not throttled(snap(throttle_events=back))
    assert "Thermal throttling" in say(snap(throttled=True, throttle_events=down))[0]
    # as the engine reports it: the governor's thread count next to the configured one
    now = snap(threads=1, configured_threads=2, throttle_events=down)
    assert "runs on 1 of 2 threads" in say(now)[0]
    assert say(snap(threads=2, configured_threads=2, throttle_events=back)) == []


def test_more_threads_than_physical_cores():
    lines = say(snap(params={"threads": 8}))
    assert lines == ["threads is set to 8 but this machine has 2 physical cores: set threads to 2 "
                     "(threads sharing a core slow each other down)."]
    assert say(snap(params={"threads": 2})) == []


def test_figures_an_engine_does_not_report_read_as_not_available():
    s = snap()
    assert missing(s, "cpu_temp").startswith("not available") and joules_per_token(s) is None
    hw = types.SimpleNamespace(unavailable={"cpu_temp": "not available: no temperature sensors (a VM)"}, gpu=None)
    assert missing(snap(hardware=hw), "cpu_temp") == "not available: no temperature sensors (a VM)"
    assert joules_per_token(snap(energy=types.SimpleNamespace(joules_per_token=0.25))) == 0.25
    assert energy_missing(s) == NO_HARDWARE and "first reply" in energy_missing(snap(energy=None))
    cpu_off = types.SimpleNamespace(unavailable={"cpu_energy": "not available: no RAPL"}, joules_per_token=None)
    assert energy_missing(snap(energy=cpu_off)) == "not available: no RAPL"


def test_advice_reads_a_real_engine_snapshot(tmp_path):
    """The figures of a real engine (hardware, events, energy) go through every rule without error."""
    from conftest import HF_FIXTURES

    from engine.api import Engine
    from engine.convert.convert import convert
    with Engine(convert(HF_FIXTURES / "qwen2_moe", tmp_path / "m", "keep").path, threads=1) as eng:
        s = eng.stats()
        assert advice(s, model_path=tmp_path / "m", mounts=[("/", "ext4")], physical_cores=1) == []
        assert effective_threads(s) == s.threads and configured_threads(s) == s.configured_threads
        assert not throttled(s)
        assert s.hardware.gpu is not None or missing(s, "gpu").startswith("not available")
