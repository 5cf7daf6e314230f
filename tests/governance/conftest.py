import pytest


@pytest.fixture
def paula(cluster):
    """A member of team-a who is also an approver: she may decide on others' requests, never her own."""
    from tests.builders import make_user

    return make_user("paula", roles=["member", "approver"], teams=[cluster.team_a])


@pytest.fixture
def nora(cluster):
    """Signed in, but holds no role at all."""
    from tests.builders import make_user

    return make_user("nora")
