from django.apps import AppConfig


class CycleConfig(AppConfig):
    name = "broker.cycle"
    label = "cycle"

    def ready(self):
        # Each connects its receivers of broker.events and Django's model signals.
        from broker import live  # noqa: F401  (committed cycles reach the live pages)
        from broker.cycle import signals, triggers  # noqa: F401  (changes ask for a cycle)
