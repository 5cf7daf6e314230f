import pytest
from celery import current_app
from django.conf import settings as django_settings

from broker.cycle import triggers
from broker.cycle.runner import run_once
from broker.cycle.tasks import run_cycle


@pytest.fixture
def celery_mode(settings, monkeypatch):
    """Celery mode on the real Redis, with the task queue replaced by a list of what was queued."""
    if not django_settings.REDIS_URL:
        pytest.fail("trigger tests need REDIS_URL (make test sets it)")
    settings.CYCLE_MODE = "celery"
    settings.CYCLE_DEBOUNCE_SECONDS = 5
    client = triggers.redis_client()
    client.delete(triggers.debounce_key(), triggers.requests_key())
    queued = []

    def send_task(name, **kwargs):
        assert name == run_cycle.name, "the trigger queues the cycle task by a name no task has"
        queued.append(kwargs)

    monkeypatch.setattr(current_app, "send_task", send_task)
    yield queued
    client.delete(triggers.debounce_key(), triggers.requests_key())


def test_it_coalesces_a_burst_into_one_cycle(celery_mode):
    assert triggers.request_cycle("first") is True
    assert triggers.request_cycle("second") is False
    assert [call["kwargs"]["reason"] for call in celery_mode] == ["first"]
    assert celery_mode[0]["countdown"] == 5


def test_it_runs_once_more_for_a_request_made_while_a_cycle_ran(
    cluster, celery_mode, monkeypatch, django_capture_on_commit_callbacks
):
    from broker.cycle import runner

    client = triggers.redis_client()
    real_load = runner.load_snapshot

    def load_while_someone_submits(now):
        loaded = real_load(now)
        # A submission commits after this cycle's snapshot. Its own task comes due while this cycle
        # still holds the lock, so that task skips: its window closes with nothing run for it.
        triggers.request_cycle("submitted mid-cycle")
        client.delete(triggers.debounce_key())
        return loaded

    monkeypatch.setattr(runner, "load_snapshot", load_while_someone_submits)
    triggers.request_cycle("the request this cycle serves")
    client.delete(triggers.debounce_key())  # its window closed: the task runs the cycle now
    with django_capture_on_commit_callbacks(execute=True):
        run_once()

    assert [call["kwargs"]["reason"] for call in celery_mode] == [
        "the request this cycle serves",
        "submitted mid-cycle",
        "changes arrived during the previous cycle",
    ]


def test_it_does_not_run_again_when_nothing_was_requested_meanwhile(
    cluster, celery_mode, django_capture_on_commit_callbacks
):
    triggers.request_cycle("before the cycle")
    triggers.redis_client().delete(triggers.debounce_key())
    with django_capture_on_commit_callbacks(execute=True):
        run_once()
    assert len(celery_mode) == 1


def test_it_wakes_the_in_process_runner(settings):
    settings.CYCLE_MODE = "inprocess"
    triggers.wait_for_request(0)
    assert triggers.request_cycle("submitted") is True
    assert triggers.wait_for_request(0.01) is True
    assert triggers.wait_for_request(0.01) is False
