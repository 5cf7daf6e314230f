"""Query parameters of the cost endpoints: validated like any input, so a bad one is a 400 naming it."""

from django.utils import timezone
from rest_framework import serializers

from broker.costs.pending import PENDING_AGGREGATES
from broker.costs.report import AGGREGATES
from broker.costs.windows import STEPS, WindowError, parse_month, parse_window, steps_of


def split_aggregate(value, allowed):
    parts = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [part for part in parts if part not in allowed]
    if not parts or unknown:
        raise serializers.ValidationError(f"Use one or more of {', '.join(allowed)}, comma-separated.")
    if len(set(parts)) != len(parts):
        raise serializers.ValidationError("Name each aggregate once.")
    return tuple(parts)


class WindowQuerySerializer(serializers.Serializer):
    window = serializers.CharField(default="7d", max_length=100)
    step = serializers.ChoiceField(choices=STEPS, default="day")

    allowed_aggregates = AGGREGATES

    def validate(self, attrs):
        now = self.context.get("now") or timezone.now()
        try:
            attrs["start"], attrs["end"] = parse_window(attrs["window"], now)
        except WindowError as error:
            raise serializers.ValidationError({"window": [str(error)]}) from error
        try:
            steps_of(attrs["start"], attrs["end"], attrs["step"])
        except WindowError as error:
            raise serializers.ValidationError({"step": [str(error)]}) from error
        attrs["now"] = now
        return attrs


class AllocationQuerySerializer(WindowQuerySerializer):
    aggregate = serializers.CharField(default="team", max_length=200)
    idle = serializers.BooleanField(default=True)
    share_idle = serializers.BooleanField(default=False)
    top = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=10_000,
        help_text="Keep the lines of this many costliest aggregates over the window; the rest sum to one "
        '"(other)" line.',
    )

    def validate_aggregate(self, value):
        return split_aggregate(value, AGGREGATES)


class PendingQuerySerializer(WindowQuerySerializer):
    aggregate = serializers.CharField(default="team", max_length=200)

    def validate_aggregate(self, value):
        return split_aggregate(value, PENDING_AGGREGATES)


class MonthQuerySerializer(serializers.Serializer):
    month = serializers.CharField(max_length=7)

    def validate_month(self, value):
        try:
            return parse_month(value)
        except WindowError as error:
            raise serializers.ValidationError(str(error)) from error


class StatementQuerySerializer(MonthQuerySerializer):
    team = serializers.SlugField(max_length=63)
