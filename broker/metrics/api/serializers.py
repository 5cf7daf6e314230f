"""Response shapes of GET /api/metrics/ (for the schema; the data is already plain)."""

from rest_framework import serializers


class PendingNowSerializer(serializers.Serializer):
    reason = serializers.CharField()
    team = serializers.CharField()
    resource_class = serializers.CharField()
    count = serializers.IntegerField()


class BucketSerializer(serializers.Serializer):
    le = serializers.FloatField(help_text="Upper bound, seconds.")
    count = serializers.IntegerField(help_text="Waits at or under the bound (cumulative).")


class WaitSerializer(serializers.Serializer):
    team = serializers.CharField()
    resource_class = serializers.CharField()
    outcome = serializers.CharField(help_text="How the wait ended: Admitted, Cancelled or Failed.")
    count = serializers.IntegerField()
    sum_seconds = serializers.FloatField()
    mean_seconds = serializers.FloatField()
    buckets = BucketSerializer(many=True)


class ReasonSecondsSerializer(serializers.Serializer):
    reason = serializers.CharField()
    team = serializers.CharField()
    resource_class = serializers.CharField()
    seconds = serializers.FloatField()


class PendingSerializer(serializers.Serializer):
    now = PendingNowSerializer(many=True, help_text="Workloads waiting now.")
    waits = WaitSerializer(many=True, help_text="Completed waits.")
    seconds_by_reason = ReasonSecondsSerializer(many=True)
    workloads_by_reason = PendingNowSerializer(many=True, help_text="Distinct workloads that ever had the reason.")


class WrongClassSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="InvalidRequest, NotEntitled, FallbackUsed or FitsSmallerClass.")
    team = serializers.CharField()
    resource_class = serializers.CharField()
    count = serializers.IntegerField()


class CapacitySerializer(serializers.Serializer):
    device_class = serializers.CharField()
    at = serializers.DateTimeField()
    total = serializers.IntegerField()
    unhealthy = serializers.IntegerField()
    reserved_unused = serializers.IntegerField()
    stranded = serializers.IntegerField()


class StrandedSerializer(serializers.Serializer):
    latest = CapacitySerializer(many=True, help_text="The latest capacity sample of each device class.")
    device_seconds = serializers.DictField(child=serializers.FloatField(), help_text="{device class: seconds}")


class InterventionSerializer(serializers.Serializer):
    action = serializers.CharField()
    role = serializers.CharField()
    count = serializers.IntegerField()


class RuntimeSpanSerializer(serializers.Serializer):
    level = serializers.CharField()
    span = serializers.IntegerField(help_text="Domains of the level the pods landed on.")
    count = serializers.IntegerField()
    sum_seconds = serializers.FloatField()
    mean_seconds = serializers.FloatField()


class LastCycleSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    outcome = serializers.CharField()
    finished_at = serializers.DateTimeField()
    load_ms = serializers.FloatField()
    decide_ms = serializers.FloatField()
    commit_ms = serializers.FloatField()
    pending_count = serializers.IntegerField()
    admitted_count = serializers.IntegerField()


class DecideTotalsSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    sum_ms = serializers.FloatField()


class CyclesSerializer(serializers.Serializer):
    by_outcome = serializers.DictField(child=serializers.IntegerField())
    last = LastCycleSerializer(allow_null=True)
    decide = DecideTotalsSerializer(help_text="Committed cycles and their summed decide time.")


class MetricsSerializer(serializers.Serializer):
    generated_at = serializers.DateTimeField()
    pending = PendingSerializer()
    wrong_class = WrongClassSerializer(many=True)
    stranded = StrandedSerializer()
    manual_interventions = InterventionSerializer(many=True)
    runtime_by_span = RuntimeSpanSerializer(many=True)
    cycles = CyclesSerializer()
    devices = serializers.DictField(child=serializers.IntegerField(), help_text="Devices by health.")
    workloads = serializers.DictField(child=serializers.IntegerField(), help_text="Workloads by state.")
