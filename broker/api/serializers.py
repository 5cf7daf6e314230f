from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers


def drf_errors(error):
    """A Django ValidationError as the DRF error structure: {field: [messages]} or a list."""
    if hasattr(error, "error_dict"):
        return {
            field: [message for item in items for message in item.messages] for field, items in error.error_dict.items()
        }
    return error.messages


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Runs the model's own clean() as part of validation (NetBox's ValidatedModelSerializer), so the API
    refuses exactly what the admin refuses, with field errors, before anything is written."""

    def validate(self, attrs):
        attrs = super().validate(attrs)
        model = self.Meta.model
        concrete = {field.name for field in model._meta.concrete_fields}
        # A fresh copy: clean() must not leave half-applied values on the instance the view holds.
        instance = model() if self.instance is None else model.objects.get(pk=self.instance.pk)
        for name, value in attrs.items():
            if name in concrete:
                setattr(instance, name, value)
        try:
            instance.clean()
        except DjangoValidationError as error:
            raise serializers.ValidationError(drf_errors(error)) from error
        return attrs


class ReasonSerializer(serializers.Serializer):
    """The body of an operator's action: why, for the audit trail."""

    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
