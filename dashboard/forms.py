from django import forms
from django.db.models import Q

from broker import limits
from broker.policy.models import DeviceClass, Queue, ResourceClass
from broker.policy.roles import is_admin, team_ids
from broker.workloads.services import PodSetRequest, Submission


def entitled_resource_classes(user):
    """The menu a user may pick from: classes open to every team or to one of the user's teams."""
    classes = ResourceClass.objects.select_related("priority_class").prefetch_related(
        "device_class_choices__device_class"
    )
    if is_admin(user):
        return classes.order_by("name")
    return (
        classes.filter(Q(allowed_teams__isnull=True) | Q(allowed_teams__in=team_ids(user))).distinct().order_by("name")
    )


def plain_words(resource_class):
    """What a resource class promises, in a sentence an ML engineer reads without the docs."""
    devices = [dc.name.upper() for dc in resource_class.ordered_device_classes()]
    parts = []
    if devices:
        parts.append("Runs on " + " (or else ".join(devices) + ")" * (len(devices) - 1))
    if resource_class.topology_required:
        parts.append(f"all pods inside one {resource_class.topology_required}")
    elif resource_class.topology_preferred:
        parts.append(f"packed into one {resource_class.topology_preferred} when possible")
    parts.append(resource_class.get_sharing_display().lower())
    parts.append(f"priority {resource_class.priority_class.name}")
    parts.append("may be preempted by more urgent work" if resource_class.preemptible else "never preempted")
    if resource_class.max_devices:
        parts.append(f"up to {resource_class.max_devices} devices")
    if resource_class.max_devices_per_pod:
        parts.append(f"at most {resource_class.max_devices_per_pod} per pod")
    if resource_class.approval_required:
        parts.append("needs an approver's yes")
    elif resource_class.approval_threshold_devices:
        parts.append(f"needs approval above {resource_class.approval_threshold_devices} devices")
    return "; ".join(parts) + "."


class SubmitForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="Unique within your team, e.g. llama-finetune-7.")
    queue = forms.ModelChoiceField(queryset=Queue.objects.none(), empty_label=None)
    resource_class = forms.ModelChoiceField(queryset=ResourceClass.objects.none(), empty_label=None)
    # One of the class's device classes instead of its fallback order: a partition profile (mig-2g of a
    # class offering mig-1g or else mig-2g), or a GPU model.
    device_class = forms.ModelChoiceField(
        queryset=DeviceClass.objects.none(),
        to_field_name="name",
        required=False,
        empty_label="Any the class offers, in its order",
        help_text="Only this kind of device, e.g. one partition profile.",
    )
    replicas = forms.IntegerField(min_value=1, max_value=limits.REPLICAS_MAX, initial=1, help_text="Pods in the gang.")
    devices_per_pod = forms.IntegerField(min_value=1, max_value=limits.DEVICES_PER_POD_MAX, initial=1)
    min_count = forms.IntegerField(
        min_value=1,
        max_value=limits.REPLICAS_MAX,
        required=False,
        help_text="Pods that must start together; empty means all of them.",
    )
    # A float field takes "1e20" and "inf": the bound keeps the seconds an integer the database holds.
    expected_hours = forms.FloatField(
        min_value=0,
        max_value=limits.EXPECTED_HOURS_MAX,
        required=False,
        help_text="Helps estimate when others start.",
    )

    def __init__(self, user, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        # A browser cuts a pasted name at maxlength without a word; the server refuses it with a reason.
        self.fields["name"].widget.attrs.pop("maxlength", None)
        queues = Queue.objects.select_related("team").order_by("name")
        if not is_admin(user):
            queues = queues.filter(team_id__in=team_ids(user))
        self.fields["queue"].queryset = queues
        self.fields["resource_class"].queryset = entitled_resource_classes(user)
        self.fields["device_class"].queryset = DeviceClass.objects.filter(
            resource_class_choices__resource_class__in=entitled_resource_classes(user)
        ).distinct()

    def clean(self):
        cleaned = super().clean()
        replicas, min_count = cleaned.get("replicas"), cleaned.get("min_count")
        if replicas and min_count and min_count > replicas:
            self.add_error("min_count", "The gang cannot be larger than the number of replicas.")
        resource_class, device_class = cleaned.get("resource_class"), cleaned.get("device_class")
        if resource_class and device_class:
            offered = [choice.name for choice in resource_class.ordered_device_classes()]
            if device_class.name not in offered:
                self.add_error(
                    "device_class", f"{resource_class} does not offer {device_class}; it offers {', '.join(offered)}."
                )
        return cleaned

    def submission(self):
        data = self.cleaned_data
        hours = data.get("expected_hours")
        return Submission(
            name=data["name"],
            queue=data["queue"],
            resource_class=data["resource_class"],
            pod_sets=(
                PodSetRequest(
                    name="main",
                    replicas=data["replicas"],
                    devices_per_pod=data["devices_per_pod"],
                    min_count=data.get("min_count"),
                    device_classes=(data["device_class"].name,) if data.get("device_class") else (),
                ),
            ),
            expected_duration_seconds=int(hours * 3600) if hours else None,
        )

    def add_service_errors(self, errors):
        for field, found in errors.items():
            if field == "pod_sets":
                for per_pod_set in found if isinstance(found, list) else [found]:
                    if isinstance(per_pod_set, dict):
                        for name, texts in per_pod_set.items():
                            self.add_error(name if name in self.fields else None, texts)
                    elif per_pod_set:
                        self.add_error(None, per_pod_set)
            else:
                self.add_error(field if field in self.fields else None, found)


class PriorityForm(forms.Form):
    """An operator's priority override on the workload page: a manual intervention, so it says why."""

    priority = forms.IntegerField(min_value=limits.PRIORITY_MIN, max_value=limits.PRIORITY_MAX)
    reason = forms.CharField(max_length=limits.REASON_MAX_LENGTH, error_messages={"required": "Say why."})

    def error_text(self):
        return " ".join(f"{field}: {' '.join(texts)}" for field, texts in self.errors.items())
