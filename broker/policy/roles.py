"""Roles are Django groups; team scope comes from Team.members."""

MEMBER = "member"
OPERATOR = "operator"
FINANCE = "finance"
APPROVER = "approver"
ADMIN = "admin"
ROLES = (MEMBER, OPERATOR, FINANCE, APPROVER, ADMIN)


def has_role(user, role):
    if not user or not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    # Cache group names on the user object: every permission check in a request asks again.
    names = getattr(user, "_broker_roles", None)
    if names is None:
        names = set(user.groups.values_list("name", flat=True))
        user._broker_roles = names
    return role in names or ADMIN in names


def is_operator(user):
    return has_role(user, OPERATOR)


def is_finance(user):
    return has_role(user, FINANCE)


def is_approver(user):
    return has_role(user, APPROVER)


def is_admin(user):
    return has_role(user, ADMIN)


def sees_all_workloads(user):
    """Operators, approvers and admins read every team's workloads."""
    return is_operator(user) or is_approver(user)


def team_ids(user):
    if not user or not user.is_authenticated:
        return set()
    cached = getattr(user, "_broker_team_ids", None)
    if cached is None:
        cached = set(user.teams.values_list("id", flat=True))
        user._broker_team_ids = cached
    return cached
