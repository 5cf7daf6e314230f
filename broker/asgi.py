import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from broker.governance.access import SocketRoleGate  # noqa: E402
from broker.sockets import ExactOriginValidator, SessionBoundSockets  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": ExactOriginValidator(
            AuthMiddlewareStack(SessionBoundSockets(SocketRoleGate(URLRouter(websocket_urlpatterns))))
        ),
    }
)
