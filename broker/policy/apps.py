from django.apps import AppConfig


class PolicyConfig(AppConfig):
    name = "broker.policy"
    label = "policy"
