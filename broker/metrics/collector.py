"""A Prometheus collector that reads every figure from the database at scrape time.

Nothing is counted in process memory: the web, Celery and cycle processes are many and restart, the
database is the one place that knows what happened. So the collector is a custom Collector (not Counter
objects incremented by the code) on a private registry, which also keeps the Python process metrics of
the default registry out of the broker's page.
"""

from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from broker.metrics import checkpoint, queries

PREFIX = "capacity_broker"
WORKLOAD_LABELS = ["team", "resource_class"]


def name(suffix):
    return f"{PREFIX}_{suffix}"


def pending_families(now, history):
    """`history`: checkpoint.history's figures at `now`."""
    pending = GaugeMetricFamily(
        name("workloads_pending"),
        "Workloads waiting now, by their latest pending reason code, team and resource class.",
        labels=["reason", *WORKLOAD_LABELS],
    )
    for row in queries.pending_now():
        pending.add_metric([row["reason"], row["team"], row["resource_class"]], row["count"])

    waits = HistogramMetricFamily(
        name("pending_wait_seconds"),
        "Completed waits in the queue (submission or requeue to admission, cancel or failure), in seconds.",
        labels=[*WORKLOAD_LABELS, "outcome"],
    )
    for row in history["waits"]:
        buckets = [(floatToGoString(bound), count) for bound, count in row["buckets"]]
        buckets.append(("+Inf", row["count"]))
        waits.add_metric([row["team"], row["resource_class"], row["outcome"]], buckets, row["sum_seconds"])

    held = CounterMetricFamily(
        name("pending_seconds"),
        "Seconds workloads spent waiting under each reason code, by team and resource class.",
        labels=["reason", *WORKLOAD_LABELS],
    )
    for row in history["seconds_by_reason"]:
        held.add_metric([row["reason"], row["team"], row["resource_class"]], row["seconds"])

    pended = CounterMetricFamily(
        name("workloads_pended"),
        "Distinct workloads that ever waited under each reason code, by team and resource class.",
        labels=["reason", *WORKLOAD_LABELS],
    )
    for row in history["workloads_by_reason"]:
        pended.add_metric([row["reason"], row["team"], row["resource_class"]], row["count"])
    return [pending, waits, held, pended]


def wrong_class_families(history):
    wrong = CounterMetricFamily(
        name("wrong_class_requests"),
        "Requests for the wrong class: kind is InvalidRequest, NotEntitled, FallbackUsed or FitsSmallerClass.",
        labels=["kind", *WORKLOAD_LABELS],
    )
    for row in history["wrong_class"]:
        wrong.add_metric([row["kind"], row["team"], row["resource_class"]], row["count"])
    return [wrong]


def stranded_families(now):
    stranded = GaugeMetricFamily(
        name("stranded_devices"),
        "Free healthy devices no pending workload can use, per device class, at the latest capacity sample.",
        labels=["device_class"],
    )
    for row in queries.latest_capacity():
        stranded.add_metric([row["device_class"]], row["stranded"])

    device_seconds = CounterMetricFamily(
        name("stranded_device_seconds"),
        "Stranded device-seconds per device class since sampling began.",
        labels=["device_class"],
    )
    for device_class, total in sorted(queries.stranded_device_seconds(now).items()):
        device_seconds.add_metric([device_class], total)
    return [stranded, device_seconds]


def intervention_families():
    manual = CounterMetricFamily(
        name("manual_interventions"),
        "Operator actions that changed a placement, health, priority or quota by hand, by action and role.",
        labels=["action", "role"],
    )
    for row in queries.manual_interventions():
        manual.add_metric([row["action"], row["role"]], row["count"])
    return [manual]


def topology_families():
    runtime = SummaryMetricFamily(
        name("workload_runtime_seconds"),
        "Runtime of succeeded workloads by how many domains of a topology level their pods spanned.",
        labels=["level", "span"],
    )
    for row in queries.runtime_by_span():
        runtime.add_metric([row["level"], str(row["span"])], row["count"], row["sum_seconds"])
    return [runtime]


def operational_families():
    cycles = CounterMetricFamily(name("cycles"), "Scheduling cycles by outcome.", labels=["outcome"])
    for outcome, count in queries.cycles_by_outcome().items():
        cycles.add_metric([outcome], count)

    last = queries.last_cycle()
    phases = GaugeMetricFamily(
        name("last_cycle_seconds"), "The last finished cycle's time per phase.", labels=["phase"]
    )
    finished = GaugeMetricFamily(name("last_cycle_timestamp_seconds"), "When the last cycle finished (Unix time).")
    if last is not None:
        for phase in ("load", "decide", "commit"):
            phases.add_metric([phase], last[f"{phase}_ms"] / 1000)
        phases.add_metric(["total"], (last["load_ms"] + last["decide_ms"] + last["commit_ms"]) / 1000)
        finished.add_metric([], last["finished_at"].timestamp())

    totals = queries.decide_time_totals()
    decide = SummaryMetricFamily(
        name("cycle_decide_seconds"), "Time the pure decision core took, over committed cycles."
    )
    decide.add_metric([], totals["count"], totals["sum_ms"] / 1000)

    devices = GaugeMetricFamily(name("devices"), "Devices by health.", labels=["health"])
    for health, count in queries.devices_by_health().items():
        devices.add_metric([health], count)

    workloads = GaugeMetricFamily(name("workloads"), "Workloads by state.", labels=["state"])
    for state, count in queries.workloads_by_state().items():
        workloads.add_metric([state], count)
    return [cycles, phases, finished, decide, devices, workloads]


class BrokerCollector(Collector):
    """Every family, read fresh from the database on each scrape."""

    def __init__(self, clock=timezone.now):
        self.clock = clock

    def collect(self):
        now = self.clock()
        history = checkpoint.history(now)
        yield from pending_families(now, history)
        yield from wrong_class_families(history)
        yield from stranded_families(now)
        yield from intervention_families()
        yield from topology_families()
        yield from operational_families()


def build_registry(clock=timezone.now):
    """A private registry holding only the broker's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(clock))
    return registry
