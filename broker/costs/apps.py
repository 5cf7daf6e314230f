from django.apps import AppConfig


class CostsConfig(AppConfig):
    name = "broker.costs"
    label = "costs"

    def ready(self):
        # Price history follows every save of a device class, whoever saves it (admin, API, seed).
        from broker.costs import prices  # noqa: F401
