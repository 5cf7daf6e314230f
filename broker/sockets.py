"""What every WebSocket passes, whatever its route: an exact origin check, and a session that is still
signed in for every message it is sent.

The origin: exactly this site, scheme, host and port.

Channels' AllowedHostsOriginValidator compares the Origin's host name with ALLOWED_HOSTS and ignores the
port, so a page served by anything else on the same host (another port) could open a socket with the
user's cookies. A socket is accepted when its Origin is the origin the socket itself was opened on
(its Host header, with the scheme the browser used) or one listed in CSRF_TRUSTED_ORIGINS, and its Host
is one of ALLOWED_HOSTS.
"""

from importlib import import_module
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": "80", "https": "443"}


def normalized(scheme, netloc):
    """(scheme, host, port) with the scheme's default port written out; None when malformed."""
    host, port = split_domain_port(netloc)
    if not host or scheme not in DEFAULT_PORTS:
        return None
    return scheme, host, port or DEFAULT_PORTS[scheme]


def header(scope, name):
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin1")
    return ""


def socket_scheme(scope):
    """The scheme of the page that opened the socket: https behind a TLS proxy that says so."""
    if scope.get("scheme") == "wss":
        return "https"
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name = proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode()
        if header(scope, name) == proxy[1]:
            return "https"
    return "http"


def origin_allowed(scope):
    origin, host = header(scope, b"origin"), header(scope, b"host")
    if not origin or not host or not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
        return False
    parts = urlsplit(origin)
    claimed = normalized(parts.scheme, parts.netloc)
    if claimed is None:
        return False
    if claimed == normalized(socket_scheme(scope), host):
        return True
    trusted = (urlsplit(o) for o in settings.CSRF_TRUSTED_ORIGINS)
    return any(claimed == normalized(t.scheme, t.netloc) for t in trusted)


class ExactOriginValidator:
    """ASGI middleware: refuses (closes) a WebSocket whose Origin is not exactly this site's."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)


# A socket whose session ended is closed with this code (the pages treat 4401 as "signed out").
SIGNED_OUT = 4401


def session_alive(scope):
    """Whether the session the socket was opened with still signs in its user: not logged out (the
    session row is gone), not expired, not signed in as someone else since."""
    user, session = scope.get("user"), scope.get("session")
    key = getattr(session, "session_key", None)
    if user is None or not user.is_authenticated or not key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
    return store.load().get(SESSION_KEY) == str(user.pk)


class SessionBoundSockets:
    """ASGI middleware inside AuthMiddlewareStack: before each message a consumer sends, the session is
    read again; once it has ended (logout, expiry) the socket is closed instead, so rows the user may no
    longer read stop at once, on every route (/ws/live/, /ws/costs/, /ws/approvals/)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.application(scope, receive, send)
        closed = False

        async def guarded_send(message):
            nonlocal closed
            if closed:
                return None
            if message["type"] == "websocket.send" and not await database_sync_to_async(session_alive)(scope):
                closed = True
                return await send({"type": "websocket.close", "code": SIGNED_OUT})
            if message["type"] == "websocket.close":
                closed = True
            return await send(message)

        return await self.application(scope, receive, guarded_send)
