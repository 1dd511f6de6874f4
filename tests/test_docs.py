"""The README and docs/: every generated block equals what its source makes of it now (a changed
JSON, spec row or kernel-table row fails here until `colibri-bench docs` is run), the README stays
a five-minute read, and every relative link between the pages resolves."""
from __future__ import annotations

import re
from pathlib import Path

from app.bench import docs

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_generated_block_is_up_to_date_with_its_source():
    assert docs.regenerate(ROOT, write=False) == [], "run `colibri-bench docs` and commit the pages"


def test_a_stale_block_is_found_and_rewritten_whole(tmp_path):
    block = next(b for b in docs.BLOCKS if b.name == "serve")
    page = tmp_path / block.page
    page.parent.mkdir(parents=True)
    page.write_text((ROOT / block.page).read_text().replace("| 8 |", "| 8 | 999.9 tok/s typed by hand |", 1))
    for other in {b.page for b in docs.BLOCKS} - {block.page}:
        (tmp_path / other).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / other).write_text((ROOT / other).read_text())
    assert docs.regenerate(tmp_path, write=True) == [f"{block.page}: serve"]
    assert page.read_text() == (ROOT / block.page).read_text()


def test_every_measured_block_names_its_date_commit_and_cpu():
    for b in docs.BLOCKS:
        if b.source.startswith(docs.RESULTS):
            text = b.render()
            assert "commit: " in text and "CPU: " in text and "Date: " in text, b.name


def test_the_readme_is_a_five_minute_read():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    assert "bash packaging/setup.sh run" in lines[lines.index("```bash") + 1]
    assert any(line.startswith("bash packaging/setup.sh test") for line in lines)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_every_relative_link_resolves():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
            assert dest.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: {target} leaves the repository"
            if anchor:
                assert anchor in _anchors(dest), f"{page.relative_to(ROOT)}: no heading for #{anchor} in {path or 'itself'}"


def test_no_path_of_one_machine_in_the_repository():
    """Paths under one machine's home or work folders mean nothing on another: the repository names
    paths relative to the checkout, the user's home (~) or the user data folder."""
    import subprocess
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        import pytest
        pytest.skip("not a git checkout")
    marks = [("/" + "root/").encode(), ("/" + "work/").encode()]
    found = []
    for name in filter(None, files.split(b"\0")):
        path = ROOT / name.decode()
        if path.is_file() and path.stat().st_size < 5_000_000:
            data = path.read_bytes()
            found += [f"{name.decode()}: {m.decode()}" for m in marks if m in data]
    assert found == []
