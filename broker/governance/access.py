"""Who may open which page and socket: one table for the whole site, enforced in one place.

Roles are Django groups (broker.policy.roles; an admin holds every role). Every page of the
dashboard, governance and finance namespaces needs at least one role, and the pages below need
specific ones; every websocket route likewise. The views and consumers check again where they act
(defence in depth); this table is what tests/governance/test_page_matrix.py walks.
"""

from channels.db import database_sync_to_async
from django.core.exceptions import PermissionDenied

from broker.policy import roles

ANY = "any role"
GATED_NAMESPACES = ("dashboard", "governance", "costs")

PAGE_ROLES = {
    "dashboard:node-cordon": (roles.OPERATOR,),
    "dashboard:device-health": (roles.OPERATOR,),
    "dashboard:workload-priority": (roles.OPERATOR,),
    "governance:class-new": (roles.OPERATOR,),
    "governance:class-edit": (roles.OPERATOR,),
    "governance:approvals": (roles.APPROVER,),
    "governance:approval-row": (roles.APPROVER,),
    "governance:approve": (roles.APPROVER,),
    "governance:reject": (roles.APPROVER,),
    "governance:audit": (roles.OPERATOR, roles.APPROVER),
    "governance:audit-export": (roles.OPERATOR, roles.APPROVER),
    "governance:lockouts": (roles.OPERATOR,),
    "governance:lockout-lift": (roles.OPERATOR,),
    "costs:finance": (roles.FINANCE, roles.OPERATOR),
}

SOCKET_ROLES = {
    "/ws/live/": ANY,
    "/ws/costs/": (roles.FINANCE, roles.OPERATOR),
    "/ws/approvals/": (roles.APPROVER,),
}


def allowed(user, needed):
    if needed == ANY:
        return any(roles.has_role(user, role) for role in roles.ROLES)
    return any(roles.has_role(user, role) for role in needed)


def may_open(user, view_name):
    """Whether `user` passes this table for the page `view_name` ("namespace:name")."""
    needed = page_roles(view_name, view_name.partition(":")[0])
    return needed is None or allowed(user, needed)


def page_roles(view_name, namespace):
    """The roles a page needs, or None when the page is not gated here (admin, API, login)."""
    if namespace not in GATED_NAMESPACES:
        return None
    return PAGE_ROLES.get(view_name, ANY)


class RolePagesMiddleware:
    """Refuses (403) a signed-in user without the page's role. Anonymous visitors pass through to the
    view's login_required, which sends them to log in."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        match = request.resolver_match
        if match is None or not request.user.is_authenticated:
            return None
        needed = page_roles(match.view_name, match.namespace)
        if needed is not None and not allowed(request.user, needed):
            raise PermissionDenied("Your role does not open this page.")
        return None


class SocketRoleGate:
    """ASGI middleware in front of the websocket router: closes 4401 for anonymous sockets and 4403 for
    a user without the route's role, before any consumer runs."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            user = scope.get("user")
            needed = SOCKET_ROLES.get(scope.get("path", ""), ANY)
            if user is None or not user.is_authenticated:
                return await self.refuse(receive, send, 4401)
            if not await database_sync_to_async(allowed)(user, needed):
                return await self.refuse(receive, send, 4403)
        return await self.inner(scope, receive, send)

    async def refuse(self, receive, send, code):
        message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": code})
