from django.apps import AppConfig


class KubeConfig(AppConfig):
    name = "broker.kube"
    label = "kube"
    verbose_name = "Kubernetes bridge"

    def ready(self):
        # The cycle's commit announces its decisions (broker.events.decisions_made) inside its own
        # transaction; the outbox receiver writes the actions to apply beside them.
        from broker.kube import outbox  # noqa: F401
