import os

from celery import Celery
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")

app = Celery("broker")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect(dispatch_uid="capacity-broker-warm-up")
def warm_up_for_cycles(**_):
    """Every process that runs tasks (each prefork child, or the solo pool's one) reads and indexes the
    cluster before its first task, so the first cycle it runs is as fast as the later ones
    (broker.cycle.runner.warm_up; CYCLE_WARM_UP=False skips it)."""
    from django.conf import settings
    from django.db import connections

    if not settings.CYCLE_WARM_UP:
        return None
    from broker.cycle.runner import warm_up

    try:
        return warm_up()
    finally:
        # Celery's Django fixup drops the connections a child finds open; a task opens its own.
        connections.close_all()
