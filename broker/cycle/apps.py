from django.apps import AppConfig


class CycleConfig(AppConfig):
    name = "broker.cycle"
    label = "cycle"

    def ready(self):
        from broker.cycle import signals  # noqa: F401  (connects the receivers)
