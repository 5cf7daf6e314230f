from collections.abc import Mapping

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from broker.limits import REASON_MAX_LENGTH

# An unknown key is named in the answer; a body with thousands names the first this many.
UNKNOWN_NAMED = 20
# A browser form's CSRF token rides in the body of the browsable API's forms.
FORM_KEYS = {"csrfmiddlewaretoken"}


def drf_errors(error):
    """A Django ValidationError as the DRF error structure: {field: [messages]} or a list."""
    if hasattr(error, "error_dict"):
        return {
            field: [message for item in items for message in item.messages] for field, items in error.error_dict.items()
        }
    return error.messages


class RefusesUnknownFields:
    """A body key that names no field is refused with a 400 naming it: silently ignored, a misspelt
    `prority` submitted at the class's default priority and nobody was told."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = [key for key in data if key not in self.fields and key not in FORM_KEYS]
            if unknown:
                known = ", ".join(name for name, field in self.fields.items() if not field.read_only)
                raise serializers.ValidationError(
                    {str(key): [f"Unknown field; the fields are: {known}."] for key in unknown[:UNKNOWN_NAMED]}
                )
        return super().to_internal_value(data)


class StrictSerializer(RefusesUnknownFields, serializers.Serializer):
    """A request body: its fields, nothing else."""


class ValidatedModelSerializer(RefusesUnknownFields, serializers.ModelSerializer):
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


class ReasonSerializer(StrictSerializer):
    """The body of an operator's action: why, for the audit trail."""

    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=REASON_MAX_LENGTH)
