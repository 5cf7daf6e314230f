"""Who may do what through the API. Roles are Django groups (broker.policy.roles); team scope for
workloads is applied by the viewsets' querysets, so these classes only answer "may this role act"."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from broker.policy import roles


def has_any_role(user):
    return any(roles.has_role(user, role) for role in roles.ROLES)


def reads_workloads(user):
    """Members read their own teams' workloads; operators, approvers and admins read all; finance none."""
    return roles.sees_all_workloads(user) or roles.has_role(user, roles.MEMBER)


class IsBrokerUser(BasePermission):
    """Signed in and holding at least one role."""

    def has_permission(self, request, view):
        return has_any_role(request.user)


class ReadAnyRoleWriteOperator(IsBrokerUser):
    """Inventory and policy: every role reads, operators and admins write."""

    def has_permission(self, request, view):
        if request.method in SAFE_METHODS:
            return super().has_permission(request, view)
        return roles.is_operator(request.user)


class ReadsWorkloads(BasePermission):
    """Workloads, allocations and explanations: workload internals are not finance's to read."""

    def has_permission(self, request, view):
        return reads_workloads(request.user)


class SubmitsWorkloads(BasePermission):
    """Submitting is a team member's act (the queue check happens in validation); admins may too."""

    def has_permission(self, request, view):
        return roles.has_role(request.user, roles.MEMBER) or roles.is_admin(request.user)


class CancelsWorkload(BasePermission):
    """The owning team, operators and admins cancel."""

    def has_permission(self, request, view):
        return reads_workloads(request.user)

    def has_object_permission(self, request, view, obj):
        return roles.is_operator(request.user) or obj.team_id in roles.team_ids(request.user)


class IsApprover(BasePermission):
    message = "Only approvers decide on approvals."

    def has_permission(self, request, view):
        return roles.is_approver(request.user)


class IsOperator(BasePermission):
    message = "Only operators do this."

    def has_permission(self, request, view):
        return roles.is_operator(request.user)


class ReadsAudit(BasePermission):
    """Operators, approvers and admins read the audit trail; it has no write endpoints at all."""

    def has_permission(self, request, view):
        return roles.is_operator(request.user) or roles.is_approver(request.user)
