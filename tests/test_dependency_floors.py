"""The floors in pyproject.toml that keep known escapes out, and the installed versions above them.

A floor that guards a security boundary (the chat-template sandbox, the PDF reader, the HTTP
server) is raised past every release with a published escape or denial of service; CI fails when
an installed package falls below any floor pyproject.toml declares (a stale virtual environment
would otherwise test, and ship, a version the floors exist to keep out).
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

# the lowest release of each package past its known escapes, and what each floor keeps out
SECURITY_FLOORS = {
    "jinja2": ("3.1.6", "sandbox escapes through a chat template: CVE-2024-56326, CVE-2025-27516"),
    "pypdf": ("6.15.0", "crafted-PDF loops and memory exhaustion fixed through 6.15.0 (CVE-2026-59935..59938, "
                        "CVE-2026-71852, CVE-2026-71870)"),
    "starlette": ("1.3.1", "Host-header path poisoning CVE-2026-48710 and the advisories fixed through 1.3.1"),
    "h11": ("0.16.0", "request smuggling through chunked bodies: CVE-2025-43859"),
    "uvicorn": ("0.30.0", "no known advisory since 0.11.7; the h11 protocol class the server subclasses"),
    "fastapi": ("0.110.0", "multipart ReDoS CVE-2024-24762 (0.109.1)"),
}


def declared(text: str) -> dict[str, Requirement]:
    """The [project] dependencies of a pyproject.toml, by normalised name."""
    reqs = [Requirement(r) for r in tomllib.loads(text)["project"]["dependencies"]]
    return {r.name.lower().replace("_", "-"): r for r in reqs}


def below_floor(reqs: dict[str, Requirement]) -> list[str]:
    """Each declared dependency whose installed version its specifier rejects (or that is missing)."""
    out = []
    for name, req in reqs.items():
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            out.append(f"{name}: not installed (pyproject.toml asks {req.specifier})")
            continue
        if not req.specifier.contains(have, prereleases=True):
            out.append(f"{name} {have} is installed; pyproject.toml asks {req.specifier}")
    return out


def floor_of(req: Requirement) -> Version | None:
    lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(lows) if lows else None


def test_security_floors_are_past_the_known_escapes():
    reqs = declared((ROOT / "pyproject.toml").read_text())
    for name, (floor, why) in SECURITY_FLOORS.items():
        assert name in reqs, f"{name} guards a security boundary but pyproject.toml does not declare it ({why})"
        low = floor_of(reqs[name])
        assert low is not None and low >= Version(floor), \
            f"pyproject.toml lets {name} {reqs[name].specifier} in; at least {floor} keeps out {why}"


def test_installed_versions_meet_every_floor():
    assert below_floor(declared((ROOT / "pyproject.toml").read_text())) == []


def test_a_version_below_its_floor_is_named():
    reqs = declared('[project]\ndependencies = ["jinja2>=999", "pytest>=1.0", "no-such-package-colibri>=1"]\n')
    assert below_floor(reqs) == [f"jinja2 {version('jinja2')} is installed; pyproject.toml asks >=999",
                                 "no-such-package-colibri: not installed (pyproject.toml asks >=1)"]
