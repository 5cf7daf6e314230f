import re

import yaml
from django import forms
from django.db.models import Q

from broker import limits
from broker.policy.models import DeviceClass, Queue, ResourceClass
from broker.policy.roles import is_admin, team_ids
from broker.workloads.models import Workload
from broker.workloads.services import PodSetRequest, Submission
from dashboard.advice import ANYWHERE, class_refusal, levels


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


CLAIM_EXAMPLE = """requests:
  - {name: gpus, exactly: {deviceClassName: h100, count: 2}}
  - {name: nics, exactly: {deviceClassName: nic, allocationMode: All}}
constraints:
  - {requests: [gpus], distinctAttribute: pcie_root}"""
GROUP_CLAIMS_EXAMPLE = """- name: scratch
  requests: [{name: data, exactly: {deviceClassName: scratch}}]"""
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CLAIM_TEXT_MAX = 20_000  # characters: far above any real claim, far below what would cost to parse


def parsed_text(text):
    """YAML (or JSON) text as data, or a ValidationError saying where it does not read."""
    if len(text) > CLAIM_TEXT_MAX:
        raise forms.ValidationError(f"At most {CLAIM_TEXT_MAX} characters.")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise forms.ValidationError(f"Not YAML or JSON{where}: {getattr(error, 'problem', None) or error}.") from None


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
    # What else a suggestion may change besides the gang (issue 27): empty means as the class says.
    topology_required = forms.ChoiceField(required=False, help_text="Where all pods must be together.")
    topology_preferred = forms.ChoiceField(required=False, help_text="Where pods are packed when possible.")
    # Everything the API's claims say (issue 26), as the API takes it: several named requests with
    # fallbacks, allocationMode All, matchAttribute / distinctAttribute constraints, and claims the
    # whole gang owns. YAML (JSON is YAML too), so a body copied from a ResourceClaim reads as it is.
    claim = forms.CharField(
        required=False,
        label="Each pod's claim (advanced)",
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "placeholder": CLAIM_EXAMPLE}),
        help_text="YAML or JSON, as a ResourceClaim's spec.devices: requests (exactly or firstAvailable, "
        "allocationMode All) and constraints (matchAttribute or distinctAttribute). Replaces devices per "
        "pod and device class.",
    )
    group_claims = forms.CharField(
        required=False,
        label="Group claims (advanced)",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "placeholder": GROUP_CLAIMS_EXAMPLE}),
        help_text="YAML or JSON list of {name, requests, constraints}: claims the whole gang owns, allocated "
        "once and reached by every pod.",
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
        self.levels = levels()
        places = [(level, f"one {level}") for level in self.levels]
        for name in ("topology_required", "topology_preferred"):
            self.fields[name].choices = [("", "As the class sets it"), (ANYWHERE, "anywhere"), *places]

    def clean(self):
        cleaned = super().clean()
        replicas, min_count = cleaned.get("replicas"), cleaned.get("min_count")
        if replicas and min_count and min_count > replicas:
            self.add_error("min_count", "The gang cannot be larger than the number of replicas.")
        for name in ("topology_required", "topology_preferred"):
            refusal = class_refusal(cleaned.get("resource_class"), name, cleaned.get(name), self.levels)
            if refusal:
                self.add_error(name, refusal)
        if cleaned.get("claim") and (cleaned.get("device_class") or cleaned.get("devices_per_pod") not in (None, 1)):
            self.add_error(
                "claim", "A claim says its devices itself: leave devices per pod at 1 and device class empty."
            )
        resource_class, device_class = cleaned.get("resource_class"), cleaned.get("device_class")
        if resource_class and device_class:
            offered = [choice.name for choice in resource_class.ordered_device_classes()]
            if device_class.name not in offered:
                self.add_error(
                    "device_class", f"{resource_class} does not offer {device_class}; it offers {', '.join(offered)}."
                )
        return cleaned

    def clean_claim(self):
        text = self.cleaned_data.get("claim", "").strip()
        if not text:
            return {}
        claim = parsed_text(text)
        if not isinstance(claim, dict) or not isinstance(claim.get("requests"), list):
            raise forms.ValidationError("A claim is a mapping with a list of requests (and constraints).")
        return claim

    def clean_group_claims(self):
        text = self.cleaned_data.get("group_claims", "").strip()
        if not text:
            return []
        claims = parsed_text(text)
        if not isinstance(claims, list) or not all(isinstance(claim, dict) for claim in claims):
            raise forms.ValidationError("Group claims are a list of {name, requests, constraints}.")
        if len(claims) > limits.GROUP_CLAIMS_MAX:
            raise forms.ValidationError(f"At most {limits.GROUP_CLAIMS_MAX} group claims.")
        for index, claim in enumerate(claims):
            unknown = sorted(set(claim) - {"name", "requests", "constraints"})
            if unknown:
                raise forms.ValidationError(f"Group claim {index + 1}: unknown field {unknown[0]}.")
            if not isinstance(claim.get("name"), str) or not DNS_LABEL.match(claim["name"]):
                raise forms.ValidationError(f"Group claim {index + 1}: its name must be a DNS label, e.g. scratch.")
            if not isinstance(claim.get("requests"), list) or not claim["requests"]:
                raise forms.ValidationError(f"Group claim {claim['name']}: a non-empty list of requests.")
            if not isinstance(claim.get("constraints", []), list):
                raise forms.ValidationError(f"Group claim {claim['name']}: constraints are a list.")
        return [
            {"name": claim["name"], "requests": claim["requests"], "constraints": claim.get("constraints") or []}
            for claim in claims
        ]

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
                    claim=data.get("claim") or {},
                ),
            ),
            group_claims=tuple(data.get("group_claims") or ()),
            expected_duration_seconds=int(hours * 3600) if hours else None,
            topology_required=topology(data.get("topology_required")),
            topology_preferred=topology(data.get("topology_preferred")),
        )

    def add_service_errors(self, errors):
        for field, found in errors.items():
            if field == "group_claims" and isinstance(found, list):
                claims = self.cleaned_data.get("group_claims") or []
                for index, per_claim in enumerate(found):
                    name = claims[index]["name"] if index < len(claims) else str(index + 1)
                    for texts in (per_claim or {}).values():
                        self.add_error("group_claims", [f"Group claim {name}: {text}" for text in texts])
            elif field == "pod_sets":
                for per_pod_set in found if isinstance(found, list) else [found]:
                    if isinstance(per_pod_set, dict):
                        for name, texts in per_pod_set.items():
                            name = "device_class" if name == "device_classes" else name
                            self.add_error(name if name in self.fields else None, texts)
                    elif per_pod_set:
                        self.add_error(None, per_pod_set)
            else:
                self.add_error(field if field in self.fields else None, found)


def topology(value):
    """A topology field's value as a Submission takes it: None keeps the class's, "" asks for none."""
    if not value:
        return None
    return "" if value == ANYWHERE else value


def resubmission_initial(workload, pod_set, changes):
    """The submit form's values saying `workload` again under a free name, with `changes` (form fields)
    made: what a suggestion's "resubmit with this change" opens."""
    resource_class = workload.resource_class
    initial = {
        "name": free_name(workload),
        "queue": workload.queue_id,
        "resource_class": workload.resource_class_id,
        "replicas": pod_set.replicas,
        "devices_per_pod": pod_set.devices_per_pod,
        "min_count": pod_set.min_count,
        "expected_hours": round(workload.expected_duration_seconds / 3600, 3)
        if workload.expected_duration_seconds
        else None,
        "device_class": pod_set.device_classes[0] if pod_set.device_classes else "",
        "topology_required": own_topology(workload.topology_required, resource_class.topology_required),
        "topology_preferred": own_topology(workload.topology_preferred, resource_class.topology_preferred),
        "claim": yaml.safe_dump(pod_set.claim, sort_keys=False) if pod_set.claim else "",
        "group_claims": yaml.safe_dump(workload.group_claims, sort_keys=False) if workload.group_claims else "",
    }
    return {**initial, **changes}


def own_topology(value, class_value):
    """The form's value for a workload's level: "" for the class's own (a stored empty level reads so)."""
    return "" if not value or value == class_value else value


def free_name(workload):
    """`name-2`, `name-3`, ...: the first name its team has not used (names are unique within a team)."""
    taken = set(Workload.objects.filter(team_id=workload.team_id).values_list("name", flat=True))
    base = workload.name[:95]
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


class PriorityForm(forms.Form):
    """An operator's priority override on the workload page: a manual intervention, so it says why."""

    priority = forms.IntegerField(min_value=limits.PRIORITY_MIN, max_value=limits.PRIORITY_MAX)
    reason = forms.CharField(max_length=limits.REASON_MAX_LENGTH, error_messages={"required": "Say why."})

    def error_text(self):
        return " ".join(f"{field}: {' '.join(texts)}" for field, texts in self.errors.items())
