"""`request_cycle(reason)`: ask for a scheduling cycle soon, coalescing bursts of requests.

Submits, cancels, completions and inventory changes each ask. In celery mode the first request of a
burst sets a Redis key (SET NX, expiring after CYCLE_DEBOUNCE_SECONDS) and queues one run_cycle task
that starts when the window closes, so a hundred submissions in half a second cost one cycle. In the
embedded default the request wakes the in-process runner. The periodic cycle (beat or the runner's
timer) still runs when a request is lost, e.g. while Redis is restarting.

Lower layers ask through the `broker.events.cycle_wanted` hook (`events.request_cycle_after_commit`);
`ask_for_cycle` below is its receiver. The task is queued by its name, the contract with the Celery edge
(broker.cycle.tasks), so this module need not import the tasks that run it.
"""

import logging
import threading
import time

from celery import current_app
from django.conf import settings
from django.dispatch import receiver

from broker import events

log = logging.getLogger(__name__)

RUN_CYCLE_TASK = "broker.cycle.tasks.run_cycle"

_wake = threading.Event()
_local_window = {"until": 0.0}
_local_lock = threading.Lock()
_redis = {}


def debounce_key():
    return f"capacity-broker:{settings.CLUSTER_NAME}:cycle-requested"


def redis_client():
    client = _redis.get(settings.REDIS_URL)
    if client is None:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
        _redis[settings.REDIS_URL] = client
    return client


def first_in_window():
    """True for the first request of a debounce window, False for the ones it absorbs."""
    seconds = settings.CYCLE_DEBOUNCE_SECONDS
    if settings.REDIS_URL:
        return bool(redis_client().set(debounce_key(), "1", nx=True, px=max(1, int(seconds * 1000))))
    with _local_lock:
        now = time.monotonic()
        if now < _local_window["until"]:
            return False
        _local_window["until"] = now + seconds
        return True


def requests_key():
    return f"capacity-broker:{settings.CLUSTER_NAME}:cycle-requests"


def request_cycle(reason=""):
    """Returns True when this request scheduled (or woke) a cycle, False when an earlier one covers it."""
    if settings.CYCLE_MODE != "celery":
        _wake.set()
        return True
    try:
        # Counted even when debounced: a cycle already past its snapshot must know to run once more.
        redis_client().incr(requests_key())
        if not first_in_window():
            return False
        current_app.send_task(RUN_CYCLE_TASK, kwargs={"reason": reason}, countdown=settings.CYCLE_DEBOUNCE_SECONDS)
    except Exception:
        # The caller's change is already committed; the periodic cycle will pick it up.
        log.warning("could not request a scheduling cycle (%s)", reason, exc_info=True)
        return False
    return True


def requests_so_far():
    """Read before a cycle opens its transaction: every request counted here committed before the
    cycle's snapshot, so the cycle covers it. None outside celery mode or when Redis is unreachable."""
    if settings.CYCLE_MODE != "celery":
        return None
    try:
        return int(redis_client().get(requests_key()) or 0)
    except Exception:
        log.warning("could not read the cycle request counter", exc_info=True)
        return None


def follow_up_requests(seen):
    """After a cycle commits: requests counted since `seen` may have come after its snapshot (their own
    task was debounced, or found this cycle holding the lock), so they get one more cycle.
    Returns True when it asked for one."""
    if seen is None or requests_so_far() in (None, seen):
        return False
    return request_cycle("changes arrived during the previous cycle")


@receiver(events.cycle_wanted, dispatch_uid="cycle-trigger")
def ask_for_cycle(sender, reason="", **kwargs):
    request_cycle(reason)


def wait_for_request(timeout):
    """For the in-process runner: True when a cycle was requested within `timeout` seconds."""
    requested = _wake.wait(timeout)
    _wake.clear()
    return requested
