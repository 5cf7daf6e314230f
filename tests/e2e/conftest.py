"""The production stack for end-to-end tests: daphne and a Celery worker on the pytest test database
and Redis, and Debian's Chromium through Playwright (never a downloaded browser)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.servers import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def stack_env():
    """The child processes must open the database pytest-django created, not the one DATABASE_URL names."""
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return {
        **os.environ,
        "DATABASE_URL": f"postgresql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "CYCLE_MODE": "celery",
        "CYCLE_DEBOUNCE_SECONDS": "0.2",
        "DJANGO_SETTINGS_MODULE": "broker.settings",
        "PYTHONUNBUFFERED": "1",
    }


def stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session", autouse=True)
def orphaned_sessions_ended(django_db_setup, django_db_blocker):
    """After the last test, end this process's other sessions on the test database. ORM calls a test
    makes while Playwright's sync API drives the browser run in another context (Django keeps its
    connections per context), whose connection is reused from test to test and never closed, so
    pytest-django could not drop the test database at the end of the run."""
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def stack(cluster, tmp_path, request):
    """(base url, log directory): daphne and a Celery worker on the test database and Redis."""
    if not settings.REDIS_URL or connection.vendor != "postgresql":
        pytest.fail("the end-to-end tests run the production stack: set DATABASE_URL (PostgreSQL) and REDIS_URL")
    env = stack_env()
    port = free_port()
    bin_dir = Path(sys.executable).parent
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("daphne", "celery")}  # noqa: SIM115
    server = subprocess.Popen(
        [str(bin_dir / "daphne"), "-b", "127.0.0.1", "-p", str(port), "broker.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=logs["daphne"],
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [
            str(bin_dir / "celery"),
            "-A",
            "broker",
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=ROOT,
        env=env,
        stdout=logs["celery"],
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, server)
        yield f"http://127.0.0.1:{port}", tmp_path
    finally:
        stop(worker)
        stop(server)
        for log in logs.values():
            log.close()
        ARTIFACTS.mkdir(exist_ok=True)
        for name in ("daphne", "celery"):
            (ARTIFACTS / f"e2e-{request.node.name}-{name}.log").write_text((tmp_path / f"{name}.log").read_text())


@pytest.fixture
def browser(monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread; the ORM calls here stay synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Debian's chromium is not installed at {CHROMIUM}")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def log_in(browser, base, username):
    """A fresh browser context signed in as `username`, on the overview with its live socket up."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(20000)
    # What the browser reports as broken (a failed script, a missing file): tests assert it stays empty.
    page.console_errors = []
    page.on("console", lambda message: message.type == "error" and page.console_errors.append(message.text))
    page.on("pageerror", lambda error: page.console_errors.append(str(error)))
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "password")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    page.wait_for_selector('#live-status[data-state="live"]')
    return page


def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
