from django.apps import AppConfig


class GovernanceConfig(AppConfig):
    name = "broker.governance"
    label = "governance"
    verbose_name = "Governance: menu, approvals, audit"

    def ready(self):
        from axes.signals import user_locked_out

        from broker.governance import notify  # noqa: F401  (tells approvers of approval events)
        from broker.governance.lockouts import on_locked_out

        user_locked_out.connect(on_locked_out, dispatch_uid="broker.governance.lockouts")
