"""The embedded default's database paths run in CI too.

`make run` keeps its data in SQLite, and there the cycle takes other paths than on PostgreSQL: it writes
admissions after the decision (`AdmissionWriter._write_now`, shares of shared devices included), reads
every workload at each load instead of the change log, and the reports group and price in Python where
PostgreSQL does it in SQL. The suite runs on PostgreSQL, where those paths' tests skip, so here the
tests of the cycle, the models and the costs run once more in a child pytest on a fresh SQLite database.
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
DIRECTORIES = ("tests/cycle", "tests/models", "tests/costs")
TIMEOUT_SECONDS = 900  # ~1.5 min on two cores
MIN_PASSED = 350  # 380 on 2026-12-04: fewer means directories or tests went missing from the run


def own_redis_database(url: str) -> str:
    """The same Redis server, another database: the child flushes its database when it starts, and the
    suite's servers (the e2e Celery worker, daphne) may still use the suite's."""
    parts = urlsplit(url)
    database = "13" if parts.path.strip("/") != "13" else "12"
    return urlunsplit(parts._replace(path=f"/{database}"))


def child_environment(tmp_path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "CI", "PYTEST_ADDOPTS")}
    env["DATA_DIR"] = str(tmp_path)  # the embedded database lives there, never in the checkout
    if settings.REDIS_URL:
        # The trigger tests ask Redis for the debounce window, as a deployment with Celery does.
        env["REDIS_URL"] = own_redis_database(settings.REDIS_URL)
    return env


def test_it_picks_another_redis_database_than_the_suites():
    assert own_redis_database("redis://127.0.0.1:6379/14") == "redis://127.0.0.1:6379/13"
    assert own_redis_database("redis://127.0.0.1:6379/13") == "redis://127.0.0.1:6379/12"
    assert own_redis_database("redis://:secret@cache:6380") == "redis://:secret@cache:6380/13"


def test_it_passes_the_cycle_model_and_cost_tests_on_sqlite(tmp_path):
    command = [sys.executable, "-m", "pytest", *DIRECTORIES, "-p", "no:cacheprovider", "-q", "-rfEs", "--no-header"]
    result = subprocess.run(
        command, cwd=ROOT, env=child_environment(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_SECONDS
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"{summary}\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    # It ran on SQLite: the tests of PostgreSQL's own paths skipped, saying why.
    assert "SQLite writes the admissions after the decision" in result.stdout, result.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= MIN_PASSED, summary
