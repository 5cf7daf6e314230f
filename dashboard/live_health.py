"""Whether live updates can flow: the Redis behind the channel layer and the shared cache answers.

While it does not, pages still render from PostgreSQL (dashboard.inventory_state.cached computes what
the cache would have held) and say that live updates are paused; cycles resume by themselves once Redis
is back (Celery reconnects). The answer is kept a few seconds, so a page costs at most one ping.
"""

import logging
import time

from django.conf import settings

log = logging.getLogger(__name__)

CHECK_SECONDS = 5.0
TIMEOUT_SECONDS = 0.5
_state = {"checked": float("-inf"), "up": True}
_clients = {}


def client():
    found = _clients.get(settings.REDIS_URL)
    if found is None:
        import redis

        found = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS
        )
        _clients[settings.REDIS_URL] = found
    return found


def note(up):
    _state.update(up=up, checked=time.monotonic())


def redis_up():
    """True in the embedded default (no Redis) and while Redis answers a ping."""
    if not settings.REDIS_URL:
        return True
    if time.monotonic() - _state["checked"] < CHECK_SECONDS:
        return _state["up"]
    try:
        client().ping()
    except Exception:
        log.warning("Redis cannot be reached: live updates are paused", exc_info=True)
        note(False)
    else:
        note(True)
    return _state["up"]


def forget():
    """Check again at the next question (tests, and a process that saw Redis fail)."""
    _state["checked"] = float("-inf")
