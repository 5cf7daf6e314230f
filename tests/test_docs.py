"""The documentation site (docs/, mkdocs.yml): it builds strictly and offline, it names every setting,
and the repository speaks of dates, commits and issues, not of how the work was organised."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "broker" / "settings.py"
CONFIGURATION = ROOT / "docs" / "configuration.md"
ENV_READERS = {"getenv", "envbool", "envint", "envfloat"}
FETCHED_FROM_ELSEWHERE = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]+\"")


def build(config, site_dir):
    """`mkdocs build --strict` of `config` into `site_dir`: (exit status, what it printed)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return done.returncode, done.stdout + done.stderr


def copy_of_the_docs(tmp_path):
    """mkdocs.yml and docs/ copied side by side, so a test can break the copy."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path / "mkdocs.yml"


def test_it_builds_the_site_strictly_and_offline(tmp_path):
    status, output = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert status == 0, output
    pages = {path.relative_to(tmp_path / "site").as_posix() for path in (tmp_path / "site").rglob("*.html")}
    assert {"index.html", "configuration.html", "api.html", "guides/operator.html", "changelog.html"} <= pages
    for path in (tmp_path / "site").rglob("*.html"):
        # Offline: no script, style sheet or font fetched from elsewhere (a plain link to a site is fine).
        fetched = FETCHED_FROM_ELSEWHERE.findall(path.read_text(encoding="utf-8"))
        assert not fetched, f"{path} fetches {fetched}"


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(("orphan.md", "# Left out of the nav\n"), id="a page left out of the nav"),
        pytest.param(("index.md", "\n[gone](no-such-page.md)\n"), id="a link to a missing page"),
        pytest.param(("index.md", "\n[gone](concepts.md#no-such-heading)\n"), id="a link to a missing anchor"),
    ],
)
def test_it_refuses_a_broken_site(tmp_path, breakage):
    config = copy_of_the_docs(tmp_path)
    name, text = breakage
    page = tmp_path / "docs" / name
    page.write_text((page.read_text(encoding="utf-8") if page.exists() else "") + text, encoding="utf-8")
    status, output = build(config, tmp_path / "site")
    assert status != 0, output


def settings_read_from_the_environment():
    """Every name broker/settings.py reads from the environment (os.getenv and its env* helpers)."""
    names = set()
    for node in ast.walk(ast.parse(SETTINGS.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        first = node.args[0]
        if function in ENV_READERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.add(first.value)
    return names


def test_it_reads_settings_from_the_settings_module():
    # The check below is only as good as this list: it must find the settings everyone knows.
    assert {
        "DATABASE_URL",
        "REDIS_URL",
        "CYCLE_MODE",
        "API_PAGE_SIZE",
        "PRODUCTION",
    } <= settings_read_from_the_environment()


def documented_settings():
    """The names in the first column of docs/configuration.md's tables."""
    names = set()
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_it_documents_every_setting_read_from_the_environment():
    missing = settings_read_from_the_environment() - documented_settings()
    assert not missing, f"docs/configuration.md does not document {sorted(missing)}"


def test_it_documents_no_setting_that_nothing_reads():
    readers = [SETTINGS, ROOT / "Makefile", *sorted((ROOT / "bench").glob("*.py"))]
    text = "\n".join(path.read_text(encoding="utf-8") for path in readers)
    stale = {name for name in documented_settings() if name not in text}
    assert not stale, f"docs/configuration.md documents {sorted(stale)}, which nothing reads"


def test_it_names_dates_commits_and_issues_not_sessions():
    found = subprocess.run(
        ["git", "grep", "-n", "-i", "-E", "session [0-9]+|sessions [0-9]+"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    # git grep: 1 = nothing found, 0 = found; anything else (not a repository) fails too.
    assert found.returncode == 1 and not found.stdout, found.stdout or found.stderr
