"""Hardware sensors and power controls; each missing one is a reason, never a crash.

CPU load, RSS and temperature come from psutil; CPU package energy and power limit from Linux RAPL
(/sys/class/powercap); GPU figures and power limit from NVML (nvidia-ml-py). Each source is
injectable at its boundary, so tests run on fake trees. A missing reading gives "not available:
<reason>" in `HardwareSnapshot.unavailable`. `HardwareMonitor` is the one object an Engine owns.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engine.errors import ColibriError
from engine.throttle import Affinity, ThermalGovernor

log = logging.getLogger("colibri.hardware")
POWERCAP = Path("/sys/class/powercap")


@dataclass(frozen=True)
class Unavailable:
    """Why a reading is missing; str() is the line the dashboard shows."""
    reason: str

    def __str__(self) -> str:
        return f"not available: {self.reason}"


class PowerLimitError(ColibriError):
    """A power limit cannot be applied (no such control, unsupported, or refused)."""


class PowerLimitRangeError(PowerLimitError, ValueError):
    """The limit is outside what the device accepts."""


class PowerLimitPermissionError(PowerLimitError):
    """Setting the limit needs privileges this process does not have."""


# --- records -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuSnapshot:
    """One NVIDIA GPU at one moment; a field NVML cannot give is None (reason in `unavailable`)."""
    index: int
    name: str
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    power_limit_min_w: float | None
    power_limit_max_w: float | None
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None


@dataclass(frozen=True)
class HardwareSnapshot:
    """Every hardware figure of the dashboard at one moment, as plain values."""
    time: float  # wall clock
    cpu_percent: float  # whole machine, since the previous snapshot
    rss_bytes: int
    cpu_temp_c: float | None
    cpu_temp_sensor: str | None  # "coretemp/Package id 0", "k10temp/Tctl", ...
    cpu_power_w: float | None  # package power averaged since the previous snapshot
    cpu_power_limit_w: float | None
    cpu_power_limit_max_w: float | None
    gpu: GpuSnapshot | None
    unavailable: dict[str, str] = field(default_factory=dict)  # source -> "not available: <reason>"
    limits: dict[str, str] = field(default_factory=dict)  # power_limit / gpu_power_limit -> outcome


@dataclass(frozen=True)
class EnergyReading:
    """Energy of one generation: CPU package (RAPL) and GPU (NVML), where each is readable."""
    seconds: float
    tokens: int
    cpu_j: float | None
    gpu_j: float | None
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def joules(self) -> float | None:
        parts = [j for j in (self.cpu_j, self.gpu_j) if j is not None]
        return sum(parts) if parts else None

    @property
    def joules_per_token(self) -> float | None:
        j = self.joules
        return None if j is None or self.tokens <= 0 else j / self.tokens


# --- sysfs -------------------------------------------------------------------------------------
def _read(path: Path) -> str:
    return path.read_text().strip()


def _write(path: Path, text: str) -> None:
    """The one place a sysfs file is written."""
    with open(path, "w") as f:
        f.write(text)


def _os_reason(e: OSError, path: Path) -> str:
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied on {path} (needs root)"
    if e.errno == errno.EROFS:
        return f"{path} is on a read-only file system (a container?)"
    if e.errno == errno.ENOENT:
        return f"{path} does not exist"
    return f"{path}: {e.strerror or e}"


_PACKAGE = re.compile(r"package(-\d+)?")


@dataclass(frozen=True)
class RaplZone:
    path: Path
    name: str  # "package-0"
    has_energy: bool
    limit: int | None  # the constraint index of the long-term limit (else 0); None without one


class Rapl:
    """CPU package energy, power and power limit through Linux RAPL (powercap sysfs): zones found by
    their `name` file ("package-N"), wrapping counters unwrapped into one running total."""
    MIN_INTERVAL_S = 0.1  # RAPL updates about every millisecond: shorter deltas are noise

    def __init__(self, root: Path | str = POWERCAP, clock: Callable[[], float] = time.monotonic):
        self.root, self._clock = Path(root), clock
        self._zones: list[RaplZone] | Unavailable | None = None
        self._lock = threading.Lock()
        self._raw: dict[Path, int] = {}
        self._total_j = 0.0
        self._power_at: tuple[float, float] | None = None  # (time, total J) of the last power sample
        self._power: float | None = None

    def zones(self) -> list[RaplZone] | Unavailable:
        if self._zones is None:
            self._zones = self._find_zones()
        return self._zones

    def _find_zones(self) -> list[RaplZone] | Unavailable:
        if not self.root.is_dir():
            return Unavailable(f"no {self.root} (not Linux, or no powercap driver)")
        try:
            entries = sorted(self.root.iterdir())
        except OSError as e:
            return Unavailable(_os_reason(e, self.root))
        found: dict[str, RaplZone] = {}
        for d in entries:
            try:
                name = _read(d / "name")
            except OSError:
                continue  # the control-type directory (intel-rapl) has no name
            if not _PACKAGE.fullmatch(name):
                continue  # core, uncore, dram, psys
            zone = RaplZone(d, name, (d / "energy_uj").exists(), _long_term_constraint(d))
            prev = found.get(name)  # intel-rapl-mmio:0 repeats package-0 without an energy counter
            if prev is None or (zone.has_energy and not prev.has_energy):
                found[name] = zone
        if not found:
            return Unavailable(f"no RAPL package zone under {self.root} (a VM, or no RAPL driver loaded)")
        return sorted(found.values(), key=lambda z: int(z.name.rpartition("-")[2] or 0))

    def energy_j(self) -> float | Unavailable:
        """Joules used by the CPU package(s) since the first reading, across counter wraps."""
        zones = self.zones()
        if isinstance(zones, Unavailable):
            return zones
        zones = [z for z in zones if z.has_energy]
        if not zones:
            return Unavailable("the RAPL package zone has no energy counter")
        with self._lock:
            for z in zones:
                path = z.path / "energy_uj"
                try:
                    raw = int(_read(path))
                except PermissionError:
                    return Unavailable(f"{path} is readable only by root (Linux 5.10 and later)")
                except (OSError, ValueError) as e:
                    return Unavailable(_os_reason(e, path) if isinstance(e, OSError) else f"{path}: {e}")
                last = self._raw.get(z.path)
                if last is not None:
                    delta = raw - last
                    if delta < 0:  # the counter wrapped
                        delta += _int_or(z.path / "max_energy_range_uj", 0)
                    self._total_j += max(delta, 0) / 1e6
                self._raw[z.path] = raw
            return self._total_j

    def power_w(self) -> float | Unavailable:
        """Package power averaged since the previous call (calls closer than 0.1 s reuse it)."""
        e = self.energy_j()
        if isinstance(e, Unavailable):
            return e
        now = self._clock()
        with self._lock:
            if self._power_at is None or now - self._power_at[0] >= self.MIN_INTERVAL_S:
                if self._power_at is not None:
                    self._power = (e - self._power_at[1]) / (now - self._power_at[0])
                self._power_at = (now, e)
            return Unavailable("measuring (power needs two readings)") if self._power is None else self._power

    def _limit_zones(self) -> list[RaplZone] | Unavailable:
        zones = self.zones()
        if isinstance(zones, Unavailable):
            return zones
        zones = [z for z in zones if z.limit is not None]
        return zones or Unavailable("the RAPL package zone has no power limit (constraint_*_power_limit_uw)")

    def power_limit_w(self) -> float | Unavailable:
        """The long-term power limit of package 0."""
        zones = self._limit_zones()
        if isinstance(zones, Unavailable):
            return zones
        path = zones[0].path / f"constraint_{zones[0].limit}_power_limit_uw"
        try:
            return int(_read(path)) / 1e6
        except OSError as e:
            return Unavailable(_os_reason(e, path))

    def max_power_w(self) -> float | None:
        """The package's own ceiling (constraint_N_max_power_uw), when it reports one."""
        zones = self._limit_zones()
        if isinstance(zones, Unavailable):
            return None
        uw = _int_or(zones[0].path / f"constraint_{zones[0].limit}_max_power_uw", 0)
        return uw / 1e6 if uw > 0 else None

    def set_power_limit(self, watts: float) -> float:
        """Set the long-term limit of every package (watts each); the previous limit of package 0."""
        zones = self._limit_zones()
        if isinstance(zones, Unavailable):
            raise PowerLimitError(f"power_limit: {zones}")
        hi = self.max_power_w()
        if watts <= 0 or (hi is not None and watts > hi):
            raise PowerLimitRangeError(f"power_limit: {watts:g} W is outside what the CPU package accepts "
                                       f"(above 0 up to {hi:g} W)")
        previous = self.power_limit_w()
        if isinstance(previous, Unavailable):
            raise PowerLimitError(f"power_limit: {previous}")
        for z in zones:
            path = z.path / f"constraint_{z.limit}_power_limit_uw"
            try:
                _write(path, str(round(watts * 1e6)))
            except PermissionError:
                why = ("the firmware has locked the RAPL limit" if os.geteuid() == 0
                       else "setting a CPU power limit needs root")
                raise PowerLimitPermissionError(f"power_limit: not permitted: writing {path} was refused "
                                                f"({why})") from None
            except OSError as e:
                raise PowerLimitError(f"power_limit: {_os_reason(e, path)}") from None
            if _int_or(z.path / "enabled", 1) == 0:
                log.warning("power_limit: %s is disabled (enabled = 0): the limit is stored but not enforced",
                            z.path)
        return previous


def _long_term_constraint(zone: Path) -> int | None:
    found = sorted(int(m.group(1)) for p in zone.glob("constraint_*_power_limit_uw")
                   if (m := re.fullmatch(r"constraint_(\d+)_power_limit_uw", p.name)))
    for i in found:
        try:
            if _read(zone / f"constraint_{i}_name") == "long_term":
                return i
        except OSError:
            pass
    return found[0] if found else None


def _int_or(path: Path, default: int) -> int:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return default


# --- CPU temperature (psutil) ------------------------------------------------------------------
_CPU_CHIPS = ("coretemp", "k10temp", "zenpower", "x86_pkg_temp", "cpu_thermal", "cpu-thermal",
              "soc_thermal", "acpitz")  # best first; acpitz is a board zone, the last resort
_PACKAGE_LABELS = ("Package id", "Tdie", "Tctl")


class CpuTemperature:
    """The CPU package temperature from psutil's sensors (`sensors` is injectable for tests)."""

    def __init__(self, sensors: Callable[[], Mapping[str, list]] | None = None):
        self._sensors = sensors
        self.sensor: str | None = None  # chip/label of the last reading

    def read(self) -> float | Unavailable:
        fn = self._sensors or getattr(psutil, "sensors_temperatures", None)
        if fn is None:
            return Unavailable("psutil reads no temperatures on this OS")
        try:
            chips = fn()
        except OSError as e:
            return Unavailable(f"reading the temperature sensors failed ({e})")
        if not chips:
            return Unavailable("no temperature sensors (a VM, or no hwmon driver loaded)")
        for chip in _CPU_CHIPS:
            entries = [s for s in chips.get(chip, ()) if s.current is not None]
            if not entries:
                continue
            for prefix in _PACKAGE_LABELS:
                hits = [s for s in entries if s.label.startswith(prefix)]
                if hits:
                    best = max(hits, key=lambda s: s.current)
                    self.sensor = f"{chip}/{best.label}"
                    return float(best.current)
            best = max(entries, key=lambda s: s.current)
            self.sensor = f"{chip}/{best.label}" if best.label else chip
            return float(best.current)
        return Unavailable(f"no CPU sensor among: {', '.join(sorted(chips))}")


# --- NVIDIA GPU (NVML) -------------------------------------------------------------------------
_NVML_REASONS = (
    ("NVMLError_LibraryNotFound", "no NVIDIA driver (the NVML library is not installed)"),
    ("NVMLError_DriverNotLoaded", "the NVIDIA driver is not loaded"),
    ("NVMLError_NoPermission", "not permitted (NVML: insufficient permissions, needs root)"),
    ("NVMLError_NotSupported", "not supported by this GPU"),
    ("NVMLError_GpuIsLost", "the GPU has fallen off the bus"),
)


class Nvml:
    """One NVIDIA GPU through NVML (`module`: pynvml unless a test injects one alike), initialised
    on first use; a failure is kept and reported, not retried on every snapshot."""

    def __init__(self, module: Any = None, index: int = 0):
        self._nv, self.index = module, index
        self._handle: Any = None
        self._failed: Unavailable | None = None
        self._initialised = False
        self.name = ""
        self._lock = threading.Lock()

    def reason(self, e: Exception) -> str:
        for cls, text in _NVML_REASONS:
            if isinstance(e, getattr(self._nv, cls, ())):
                return text
        return f"NVML error: {e}"

    def handle(self) -> Any:
        """The device handle, or an Unavailable saying why there is none."""
        with self._lock:
            if self._handle is None and self._failed is None:
                self._open()
            return self._failed or self._handle

    def _open(self) -> None:
        if self._nv is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError:
                self._failed = Unavailable("nvidia-ml-py is not installed")
                return
            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
            self._initialised = True
            count = nv.nvmlDeviceGetCount()
            if count <= self.index:
                self._failed = Unavailable("no NVIDIA GPU" if count == 0 else
                                           f"no GPU {self.index} ({count} found)")
                return
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.index)
            name = nv.nvmlDeviceGetName(self._handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except nv.NVMLError as e:
            self._failed = Unavailable(self.reason(e))

    def _get(self, missing: dict[str, str], key: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(self._handle, *args)
        except self._nv.NVMLError as e:
            missing[key] = str(Unavailable(self.reason(e)))
            return None

    def snapshot(self) -> tuple[GpuSnapshot | None, dict[str, str]]:
        """The GPU's figures and, per missing one, why."""
        h = self.handle()
        if isinstance(h, Unavailable):
            return None, {"gpu": str(h)}
        nv, missing = self._nv, {}
        temp = self._get(missing, "gpu_temp", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        power = self._get(missing, "gpu_power", nv.nvmlDeviceGetPowerUsage)
        limit = self._get(missing, "gpu_power_limit", nv.nvmlDeviceGetEnforcedPowerLimit)
        bounds = self._get(missing, "gpu_power_limit_range", nv.nvmlDeviceGetPowerManagementLimitConstraints)
        util = self._get(missing, "gpu_util", nv.nvmlDeviceGetUtilizationRates)
        mem = self._get(missing, "gpu_memory", nv.nvmlDeviceGetMemoryInfo)
        lo, hi = bounds if bounds is not None else (None, None)
        return GpuSnapshot(
            self.index, self.name, None if temp is None else float(temp), _watts(power), _watts(limit),
            _watts(lo), _watts(hi), None if util is None else float(util.gpu),
            None if mem is None else int(mem.used), None if mem is None else int(mem.total)), missing

    def energy_j(self) -> float | Unavailable:
        """Joules the GPU used since the driver loaded (Volta and later)."""
        h = self.handle()
        if isinstance(h, Unavailable):
            return h
        try:
            return self._nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000
        except self._nv.NVMLError as e:
            return Unavailable(f"GPU energy counter: {self.reason(e)}")

    def set_power_limit(self, watts: float) -> float:
        """Set the GPU power limit within the device's range; the previous limit in watts."""
        h = self.handle()
        if isinstance(h, Unavailable):
            raise PowerLimitError(f"gpu_power_limit: {h}")
        nv, mw = self._nv, round(watts * 1000)
        try:
            lo, hi = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
            previous = nv.nvmlDeviceGetPowerManagementLimit(h)
        except nv.NVMLError as e:
            raise PowerLimitError(f"gpu_power_limit: {Unavailable(self.reason(e))}") from None
        if not lo <= mw <= hi:
            raise PowerLimitRangeError(f"gpu_power_limit: {watts:g} W is outside what "
                                       f"{self.name or 'the GPU'} accepts ({lo / 1000:g} to {hi / 1000:g} W)")
        try:
            nv.nvmlDeviceSetPowerManagementLimit(h, mw)
        except nv.NVMLError as e:
            if isinstance(e, getattr(nv, "NVMLError_NoPermission", ())):
                raise PowerLimitPermissionError("gpu_power_limit: not permitted: setting a GPU power limit "
                                                "needs root (NVML: insufficient permissions)") from None
            raise PowerLimitError(f"gpu_power_limit: {self.reason(e)}") from None
        return previous / 1000

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                try:
                    self._nv.nvmlShutdown()
                except self._nv.NVMLError as e:
                    log.debug("nvmlShutdown: %s", e)
            self._initialised, self._handle = False, None
            self._failed = Unavailable("closed")


def _watts(mw: float | None) -> float | None:
    return None if mw is None else mw / 1000


# --- energy per generation ---------------------------------------------------------------------
class EnergyMeter:
    """Energy spent between start() and stop(tokens), for joules per generated token."""

    def __init__(self, rapl: Rapl, gpu: Nvml, clock: Callable[[], float] = time.monotonic):
        self.rapl, self.gpu, self._clock = rapl, gpu, clock
        self._start: tuple[float, float | Unavailable, float | Unavailable] | None = None

    def start(self) -> None:
        self._start = (self._clock(), self.rapl.energy_j(), self.gpu.energy_j())

    def stop(self, tokens: int) -> EnergyReading:
        if self._start is None:
            raise RuntimeError("EnergyMeter.stop() before start()")
        t0, cpu0, gpu0 = self._start
        cpu1, gpu1 = self.rapl.energy_j(), self.gpu.energy_j()
        missing: dict[str, str] = {}

        def delta(key: str, a: float | Unavailable, b: float | Unavailable) -> float | None:
            bad = next((x for x in (b, a) if isinstance(x, Unavailable)), None)
            if bad is not None:
                missing[key] = str(bad)
                return None
            return b - a

        reading = EnergyReading(self._clock() - t0, tokens, delta("cpu_energy", cpu0, cpu1),
                                delta("gpu_energy", gpu0, gpu1), missing)
        self._start = None
        return reading


# --- what an Engine owns -----------------------------------------------------------------------
class HardwareMonitor:
    """Sensors, power limits, thread pinning and the thermal governor behind a few calls:
    snapshot(), apply_limits(params), `governor.update()` before each forward step, energy_meter()
    around a generation, close() to put back every limit this process changed."""

    def __init__(self, threads: int, high_c: float = 85.0, low_c: float = 75.0, *,
                 powercap_root: Path | str = POWERCAP, nvml: Any = None,
                 sensors: Callable[[], Mapping[str, list]] | None = None, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, affinity: Affinity | None = None):
        self.rapl = Rapl(powercap_root, clock)
        self._clock = clock
        self.gpu = Nvml(nvml)
        self.cpu_temp = CpuTemperature(sensors)
        self.affinity = affinity or Affinity()
        self.governor = ThermalGovernor(threads, high_c, low_c, interval_s, temperature=self._temp_c,
                                        clock=clock)
        self.limits: dict[str, str] = {}
        self._original: dict[str, float] = {}  # limits as they were before we changed them
        self._process = psutil.Process()
        psutil.cpu_percent(None)  # the first call only starts the interval
        self.rapl.power_w()  # likewise: the next reading gives watts
        temp = self.cpu_temp.read()
        if isinstance(temp, Unavailable):
            log.info("CPU temperature %s: thermal throttling is off", temp)

    def _temp_c(self) -> float | None:
        t = self.cpu_temp.read()
        return None if isinstance(t, Unavailable) else t

    def snapshot(self) -> HardwareSnapshot:
        missing: dict[str, str] = {}

        def value(key: str, v: Any) -> Any:
            if isinstance(v, Unavailable):
                missing[key] = str(v)
                return None
            return v

        temp = value("cpu_temp", self.cpu_temp.read())
        power = value("cpu_power", self.rapl.power_w())
        limit = value("cpu_power_limit", self.rapl.power_limit_w())
        gpu, gpu_missing = self.gpu.snapshot()
        missing.update(gpu_missing)
        return HardwareSnapshot(
            time.time(), psutil.cpu_percent(None), self._process.memory_info().rss, temp,
            self.cpu_temp.sensor if temp is not None else None, power, limit, self.rapl.max_power_w(), gpu,
            missing, dict(self.limits))

    def apply_limits(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Apply power_limit and gpu_power_limit (watts; None = leave as is, or put back the value
        we replaced). Never raises: each outcome is logged and kept in `limits` for the dashboard."""
        for key, device in (("power_limit", self.rapl), ("gpu_power_limit", self.gpu)):
            want = params.get(key)
            if want is None and key not in self._original:
                self.limits.pop(key, None)
                continue
            target = self._original[key] if want is None else float(want)
            try:
                previous = device.set_power_limit(target)
            except PowerLimitError as e:
                self.limits[key] = str(e)
                log.warning("%s", e)
                continue
            if want is None:
                del self._original[key]
                self.limits.pop(key, None)
                log.info("%s restored to %g W", key, target)
            else:
                self._original.setdefault(key, previous)
                self.limits[key] = f"{target:g} W (was {previous:g} W)"
                log.info("%s set to %g W (was %g W)", key, target, previous)
        return dict(self.limits)

    def apply_affinity(self, enabled: bool) -> str:
        """Pin to (or release from) one CPU per physical core, as many as configured threads."""
        return self.affinity.apply(enabled, self.governor.configured)

    def energy_meter(self) -> EnergyMeter:
        return EnergyMeter(self.rapl, self.gpu, self._clock)

    def close(self) -> None:
        """Put back every power limit and the CPU mask this process changed; release NVML."""
        self.apply_limits({})
        if self.affinity.status != "off":
            self.affinity.apply(False, self.governor.configured)
        self.gpu.close()
