import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_manage(*args, **env):
    full_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    full_env.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full_env, capture_output=True, text=True)


def test_it_passes_the_deployment_checklist_in_production_mode(tmp_path):
    result = run_manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        PRODUCTION="True",
        SECRET_KEY=secrets.token_urlsafe(64),
        ALLOWED_HOSTS="broker.example.com",
        DATA_DIR=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr


def test_it_refuses_production_mode_without_a_real_secret_key(tmp_path):
    result = run_manage("check", PRODUCTION="True", SECRET_KEY="short", DATA_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_it_defaults_to_the_embedded_stack(tmp_path):
    code = (
        "from django.conf import settings; "
        "print(settings.DATABASES['default']['ENGINE'], settings.CHANNEL_LAYERS['default']['BACKEND'], "
        "settings.CYCLE_MODE)"
    )
    result = run_manage("shell", "-c", code, DATA_DIR=str(tmp_path))
    assert result.stdout.strip().splitlines()[-1].split() == [
        "django.db.backends.sqlite3",
        "channels.layers.InMemoryChannelLayer",
        "inprocess",
    ], result.stderr


def test_it_switches_to_postgres_and_redis_from_the_environment(tmp_path):
    code = (
        "from django.conf import settings; "
        "print(settings.DATABASES['default']['ENGINE'], settings.CHANNEL_LAYERS['default']['BACKEND'], "
        "settings.CELERY_BROKER_URL, settings.CYCLE_MODE)"
    )
    result = run_manage(
        "shell",
        "-c",
        code,
        DATA_DIR=str(tmp_path),
        DATABASE_URL="postgresql://u@db:5432/broker",
        REDIS_URL="redis://cache:6379/0",
    )
    assert result.stdout.strip().splitlines()[-1].split() == [
        "django.db.backends.postgresql",
        "channels_redis.core.RedisChannelLayer",
        "redis://cache:6379/0",
        "celery",
    ], result.stderr


def test_it_serves_plotly_from_the_installed_package():
    from django.contrib.staticfiles import finders

    found = finders.find("vendor/plotly.min.js")
    assert found and "site-packages/plotly" in found


def test_it_migrates_a_fresh_embedded_database_and_keeps_its_triggers(tmp_path):
    """`make run` starts from a fresh SQLite database. A migration that makes SQLite rebuild a table
    with triggers (adding a NOT NULL column through Django's AddField does) fails there, or loses the
    triggers that keep allocations and explanations honest."""
    result = run_manage("migrate", "--noinput", DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    code = (
        "import json; from django.db import connection; cursor = connection.cursor(); "
        "cursor.execute(\"SELECT tbl_name, count(*) FROM sqlite_master WHERE type = 'trigger' GROUP BY tbl_name\"); "
        "print(json.dumps(dict(cursor.fetchall())))"
    )
    shown = run_manage("shell", "-c", code, DATA_DIR=str(tmp_path))
    triggers = json.loads(shown.stdout.strip().splitlines()[-1])
    assert triggers.get("workloads_allocation", 0) >= 2 and triggers.get("workloads_explanation", 0) >= 2, triggers
    assert all(triggers.get(f"inventory_{table}", 0) >= 3 for table in ("device", "node", "domain")), triggers
