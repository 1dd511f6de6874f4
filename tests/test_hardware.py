"""Hardware layer: RAPL on a fake powercap tree, NVML through a fake pynvml-like module, psutil
temperatures through a fake sensors function; plus the real machine, which must never raise."""
from __future__ import annotations

import errno
import os
import re
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine import hardware as H
from engine import params as P

Temp = namedtuple("Temp", "label current high critical")  # psutil's shwtemp


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def zone(root: Path, dirname: str, name: str = "package-0", energy_uj: int | None = 5_000_000,
         max_range_uj: int = 262_143_328_850, limit_uw: int | None = 15_000_000, max_uw: int = 28_000_000,
         constraints: tuple[str, ...] = ("long_term", "short_term")) -> Path:
    """A powercap zone directory as the kernel lays it out."""
    d = root / dirname
    d.mkdir(parents=True)
    (d / "name").write_text(name + "\n")
    (d / "enabled").write_text("1\n")
    if energy_uj is not None:
        (d / "energy_uj").write_text(f"{energy_uj}\n")
        (d / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    if limit_uw is not None:
        for i, cname in enumerate(constraints):
            (d / f"constraint_{i}_name").write_text(cname + "\n")
            (d / f"constraint_{i}_power_limit_uw").write_text(f"{limit_uw * (1 + i)}\n")
            (d / f"constraint_{i}_max_power_uw").write_text(f"{max_uw}\n")
            (d / f"constraint_{i}_time_window_us").write_text("27983872\n")
    return d


def intel_tree(root: Path) -> Path:
    """intel-rapl (control type), package-0 with core/uncore subzones, and the MMIO twin of
    package-0 (limits only, no energy counter) that sorts first by name."""
    (root / "intel-rapl").mkdir(parents=True)
    (root / "intel-rapl" / "enabled").write_text("1\n")
    pkg = zone(root, "intel-rapl:0")
    zone(root, "intel-rapl:0:0", "core", limit_uw=None)
    zone(root, "intel-rapl:0:1", "uncore", limit_uw=None)
    zone(root, "intel-rapl-mmio:0", "package-0", energy_uj=None)
    return pkg


# --- RAPL --------------------------------------------------------------------------------------
def test_rapl_finds_the_package_zone_by_its_name_file(tmp_path):
    pkg = intel_tree(tmp_path / "intel")
    zones = H.Rapl(tmp_path / "intel").zones()
    assert [(z.path, z.name, z.has_energy, z.limit) for z in zones] == [(pkg, "package-0", True, 0)]
    amd = zone(tmp_path / "amd", "amd-rapl:0", constraints=())  # AMD: energy only, no limits
    zone(tmp_path / "amd", "amd-rapl:1", "package-1", constraints=())
    rapl = H.Rapl(tmp_path / "amd")
    assert [z.path for z in rapl.zones()] == [amd, tmp_path / "amd" / "amd-rapl:1"]
    assert isinstance(rapl.energy_j(), float)
    assert str(rapl.power_limit_w()).startswith("not available: the RAPL package zone has no power limit")


def test_rapl_missing_or_empty_says_why(tmp_path):
    gone = H.Rapl(tmp_path / "nope")
    assert str(gone.power_w()) == f"not available: no {tmp_path / 'nope'} (not Linux, or no powercap driver)"
    zone(tmp_path / "vm", "intel-rapl:0:0", "core")
    for reading in (H.Rapl(tmp_path / "vm").energy_j(), H.Rapl(tmp_path / "vm").power_limit_w()):
        assert isinstance(reading, H.Unavailable) and "no RAPL package zone" in str(reading)


def test_power_is_energy_over_time_across_a_counter_wrap(tmp_path):
    pkg = zone(tmp_path, "intel-rapl:0", energy_uj=1_000_000, max_range_uj=40_000_000)
    clock = Clock()
    rapl = H.Rapl(tmp_path, clock)
    assert str(rapl.power_w()) == "not available: measuring (power needs two readings)"
    clock.t += 2.0
    (pkg / "energy_uj").write_text("31000000\n")
    assert rapl.power_w() == pytest.approx(15.0)  # 30 J in 2 s
    clock.t += 0.05  # too soon: the last figure stands, the baseline stays
    (pkg / "energy_uj").write_text("31500000\n")
    assert rapl.power_w() == pytest.approx(15.0)
    clock.t += 0.95
    (pkg / "energy_uj").write_text("1500000\n")  # wrapped at 40 J: 31.5 -> 40 = 0 -> 1.5, i.e. 10 J
    assert rapl.power_w() == pytest.approx(10.5)  # 10.5 J in 1 s since the last baseline
    assert rapl.energy_j() == pytest.approx(40.5)


def test_energy_counter_readable_only_by_root(tmp_path, monkeypatch):
    zone(tmp_path, "intel-rapl:0")
    real_read = H._read

    def read(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(H, "_read", read)
    reading = H.Rapl(tmp_path).power_w()
    assert isinstance(reading, H.Unavailable) and "readable only by root" in str(reading)


def test_set_power_limit_writes_the_long_term_constraint(tmp_path):
    pkg = zone(tmp_path, "intel-rapl:0", constraints=("short_term", "long_term"))  # long_term is #1 here
    rapl = H.Rapl(tmp_path)
    assert rapl.power_limit_w() == 30.0 and rapl.max_power_w() == 28.0
    assert rapl.set_power_limit(12.5) == 30.0
    assert (pkg / "constraint_1_power_limit_uw").read_text() == "12500000"
    assert (pkg / "constraint_0_power_limit_uw").read_text() == "15000000\n"  # short_term untouched
    assert rapl.power_limit_w() == 12.5
    with pytest.raises(H.PowerLimitRangeError, match=r"power_limit: 40 W is outside .* up to 28 W"):
        rapl.set_power_limit(40)
    assert rapl.power_limit_w() == 12.5


def test_set_power_limit_refused_says_not_permitted(tmp_path, monkeypatch):
    pkg = zone(tmp_path, "intel-rapl:0")

    def refuse(path: Path, text: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(H, "_write", refuse)
    with pytest.raises(H.PowerLimitPermissionError, match="power_limit: not permitted: writing .* refused"):
        H.Rapl(tmp_path).set_power_limit(10)
    assert (pkg / "constraint_0_power_limit_uw").read_text() == "15000000\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files anyway")
def test_set_power_limit_on_a_read_only_file(tmp_path):
    pkg = zone(tmp_path, "intel-rapl:0")
    (pkg / "constraint_0_power_limit_uw").chmod(0o444)
    with pytest.raises(H.PowerLimitPermissionError, match="needs root"):
        H.Rapl(tmp_path).set_power_limit(10)


def test_set_power_limit_without_rapl(tmp_path):
    with pytest.raises(H.PowerLimitError, match="power_limit: not available: no "):
        H.Rapl(tmp_path / "nope").set_power_limit(10)


# --- CPU temperature ---------------------------------------------------------------------------
@pytest.mark.parametrize("chips, want, sensor", [
    ({"coretemp": [Temp("Core 0", 60.0, 100, 100), Temp("Package id 0", 71.0, 100, 100),
                   Temp("Core 1", 74.0, 100, 100)], "nvme": [Temp("Composite", 40.0, 80, 90)]},
     71.0, "coretemp/Package id 0"),
    ({"acpitz": [Temp("", 50.0, None, None)],
      "k10temp": [Temp("Tccd1", 66.0, None, None), Temp("Tctl", 64.5, None, None)]}, 64.5, "k10temp/Tctl"),
    ({"cpu_thermal": [Temp("", 48.3, None, None)]}, 48.3, "cpu_thermal"),
])
def test_cpu_temperature_prefers_the_package_sensor(chips, want, sensor):
    t = H.CpuTemperature(lambda: chips)
    assert t.read() == want and t.sensor == sensor


def test_cpu_temperature_unavailable_reasons():
    assert str(H.CpuTemperature(dict).read()) == \
        "not available: no temperature sensors (a VM, or no hwmon driver loaded)"
    only_disk = H.CpuTemperature(lambda: {"nvme": [Temp("Composite", 40.0, 80, 90)], "iwlwifi_1": []})
    assert str(only_disk.read()) == "not available: no CPU sensor among: iwlwifi_1, nvme"

    def broken() -> dict:
        raise OSError(errno.EIO, "Input/output error")

    assert "reading the temperature sensors failed" in str(H.CpuTemperature(broken).read())


# --- NVML --------------------------------------------------------------------------------------
class FakeNvml:
    """The slice of pynvml (nvidia-ml-py) we call, with its error classes. Each function returns
    its entry in `values` (called if callable); `fail` maps a function name to the error it raises."""
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, fail: dict[str, type] | None = None, count: int = 1):
        self.fail, self.calls = fail or {}, []
        self.limit_mw, self.energy_mj = 170_000, 1_000_000
        self.values = {
            "nvmlInit": None, "nvmlShutdown": None, "nvmlDeviceGetCount": count,
            "nvmlDeviceGetHandleByIndex": "handle", "nvmlDeviceGetName": b"NVIDIA GeForce RTX 3060",
            "nvmlDeviceGetTemperature": 63, "nvmlDeviceGetPowerUsage": 42_500,
            "nvmlDeviceGetEnforcedPowerLimit": lambda: self.limit_mw,
            "nvmlDeviceGetPowerManagementLimit": lambda: self.limit_mw,
            "nvmlDeviceGetPowerManagementLimitConstraints": (100_000, 200_000),
            "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=37, memory=12),
            "nvmlDeviceGetMemoryInfo": SimpleNamespace(used=3 << 30, total=12 << 30, free=9 << 30),
            "nvmlDeviceGetTotalEnergyConsumption": lambda: self.energy_mj,
            "nvmlDeviceSetPowerManagementLimit": None,
        }

    def __getattr__(self, name: str):
        if name not in self.__dict__.get("values", {}):
            raise AttributeError(name)

        def call(*args):
            self.calls.append(name)
            if name in self.fail:
                raise self.fail[name]("fake")
            if name == "nvmlDeviceSetPowerManagementLimit":
                self.limit_mw = args[1]
            v = self.values[name]
            return v() if callable(v) else v
        return call


def test_gpu_snapshot_through_nvml():
    gpu = H.Nvml(FakeNvml(fail={"nvmlDeviceGetPowerUsage": FakeNvml.NVMLError_NotSupported}))
    snap, missing = gpu.snapshot()
    assert snap == H.GpuSnapshot(0, "NVIDIA GeForce RTX 3060", 63.0, None, 170.0, 100.0, 200.0, 37.0,
                                 3 << 30, 12 << 30)
    assert missing == {"gpu_power": "not available: not supported by this GPU"}


@pytest.mark.parametrize("fake, reason", [
    (FakeNvml(fail={"nvmlInit": FakeNvml.NVMLError_LibraryNotFound}),
     "not available: no NVIDIA driver (the NVML library is not installed)"),
    (FakeNvml(count=0), "not available: no NVIDIA GPU"),
])
def test_gpu_unavailable_says_why_and_is_not_retried(fake, reason):
    gpu = H.Nvml(fake)
    assert gpu.snapshot() == (None, {"gpu": reason})
    assert gpu.snapshot() == (None, {"gpu": reason}) and fake.calls.count("nvmlInit") == 1
    assert str(gpu.energy_j()) == reason
    with pytest.raises(H.PowerLimitError, match=re.escape(f"gpu_power_limit: {reason}")):
        gpu.set_power_limit(150)


def test_gpu_power_limit_in_milliwatts_within_the_device_range():
    fake = FakeNvml()
    gpu = H.Nvml(fake)
    assert gpu.set_power_limit(150.5) == 170.0 and fake.limit_mw == 150_500
    with pytest.raises(H.PowerLimitRangeError,
                       match=r"250 W is outside what NVIDIA GeForce RTX 3060 accepts \(100 to 200 W\)"):
        gpu.set_power_limit(250)
    assert fake.limit_mw == 150_500


def test_gpu_power_limit_without_permission():
    fake = FakeNvml(fail={"nvmlDeviceSetPowerManagementLimit": FakeNvml.NVMLError_NoPermission})
    with pytest.raises(H.PowerLimitPermissionError, match="gpu_power_limit: not permitted: .*needs root"):
        H.Nvml(fake).set_power_limit(150)
    assert fake.limit_mw == 170_000


# --- energy per token and the monitor ----------------------------------------------------------
def test_energy_meter_joules_per_token(tmp_path):
    pkg = zone(tmp_path, "intel-rapl:0", energy_uj=0)
    fake, clock = FakeNvml(), Clock()
    meter = H.EnergyMeter(H.Rapl(tmp_path, clock), H.Nvml(fake), clock)
    meter.start()
    (pkg / "energy_uj").write_text("30000000\n")
    fake.energy_mj += 10_000
    clock.t += 3.0
    r = meter.stop(tokens=8)
    assert (r.seconds, r.cpu_j, r.gpu_j, r.joules, r.joules_per_token) == (3.0, 30.0, 10.0, 40.0, 5.0)
    assert r.unavailable == {}
    meter = H.EnergyMeter(H.Rapl(tmp_path / "nope"), H.Nvml(FakeNvml(count=0)))
    meter.start()
    r = meter.stop(tokens=8)
    assert r.joules is None and r.joules_per_token is None
    assert set(r.unavailable) == {"cpu_energy", "gpu_energy"}


def test_monitor_snapshot_and_limits_put_back(tmp_path, monkeypatch):
    pkg = zone(tmp_path, "intel-rapl:0")
    fake, clock = FakeNvml(), Clock()
    sensors = {"coretemp": [Temp("Package id 0", 91.0, 100, 100)]}
    mon = H.HardwareMonitor(4, powercap_root=tmp_path, nvml=fake, sensors=lambda: sensors, clock=clock)
    clock.t += 1.0
    (pkg / "energy_uj").write_text("17000000\n")
    snap = mon.snapshot()
    assert (snap.cpu_temp_c, snap.cpu_temp_sensor, snap.cpu_power_w) == (91.0, "coretemp/Package id 0", 12.0)
    assert (snap.cpu_power_limit_w, snap.cpu_power_limit_max_w, snap.gpu.power_w) == (15.0, 28.0, 42.5)
    assert snap.rss_bytes > 0 and snap.unavailable == {} and snap.limits == {}
    assert mon.governor.update() == 3  # 91 °C > 85 °C

    limits = mon.apply_limits(P.validate({"power_limit": "10", "gpu_power_limit": 120}))
    assert limits == {"power_limit": "10 W (was 15 W)", "gpu_power_limit": "120 W (was 170 W)"}
    assert (pkg / "constraint_0_power_limit_uw").read_text() == "10000000" and fake.limit_mw == 120_000
    mon.apply_limits({"power_limit": 11, "gpu_power_limit": None})  # None: put the original back
    assert fake.limit_mw == 170_000 and mon.snapshot().limits == {"power_limit": "11 W (was 10 W)"}

    def refuse(path: Path, text: str) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(H, "_write", refuse)
    out = mon.apply_limits({"power_limit": 9, "gpu_power_limit": 500})  # never raises
    assert out["power_limit"].startswith("power_limit: not permitted")
    assert out["gpu_power_limit"].startswith("gpu_power_limit: 500 W is outside")
    monkeypatch.undo()
    mon.close()  # the first value we replaced comes back
    assert (pkg / "constraint_0_power_limit_uw").read_text() == "15000000" and "nvmlShutdown" in fake.calls


def test_power_params_are_declared_once():
    assert P.check("power_limit", "auto") is None and P.check("gpu_power_limit", "125.5") == 125.5
    assert P.defaults("engine").items() >= {"power_limit": None, "gpu_power_limit": None, "affinity": False,
                                            "throttle_high_c": 85.0, "throttle_low_c": 75.0}.items()
    assert P.check("affinity", "yes") is True
    with pytest.raises(ValueError, match="power_limit: 0.0 is out of range"):
        P.check("power_limit", 0)


# --- the real machine --------------------------------------------------------------------------
def test_real_machine_readers_report_instead_of_failing():
    """Whatever this machine has (here: no RAPL, no sensors, no NVIDIA driver), nothing raises."""
    mon = H.HardwareMonitor(2)
    try:
        snap = mon.snapshot()
        assert snap.rss_bytes > 0 and 0.0 <= snap.cpu_percent <= 100.0
        assert all(v.startswith("not available: ") for v in snap.unavailable.values())
        assert (snap.cpu_temp_c is None) == ("cpu_temp" in snap.unavailable)
        assert (snap.cpu_power_w is None) == ("cpu_power" in snap.unavailable)
        assert (snap.gpu is None) == ("gpu" in snap.unavailable)
        meter = mon.energy_meter()
        meter.start()
        assert meter.stop(1).tokens == 1
        if snap.cpu_power_limit_w is None:
            out = mon.apply_limits({"power_limit": 10.0})
            assert out["power_limit"].startswith("power_limit: not available")
    finally:
        mon.close()
