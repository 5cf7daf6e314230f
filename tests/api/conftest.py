import pytest


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Personas are created per test; the production hasher would make user creation the slowest step."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
