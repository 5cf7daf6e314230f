from django import forms

from broker.governance.approvals import cost_threshold
from broker.limits import UtcDateTimeField
from broker.policy.models import DeviceClass, ResourceClass, Team


class ResourceClassForm(forms.ModelForm):
    """Everything a resource class encodes, with its device classes as an ordered fallback list."""

    device_classes = forms.CharField(
        help_text="Device class names in fallback order, first choice first, separated by commas.",
    )
    cost_threshold_per_hour = forms.DecimalField(
        required=False,
        min_value=0,
        decimal_places=2,
        help_text="Requests costing more than this per hour need approval; empty: no cost rule.",
    )
    allowed_teams = forms.ModelMultipleChoiceField(
        queryset=Team.objects.order_by("name"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every team may use it.",
    )
    reason = forms.CharField(required=False, max_length=2000, help_text="Why: kept in the audit trail.")

    class Meta:
        model = ResourceClass
        fields = [
            "name",
            "display_name",
            "description",
            "device_classes",
            "topology_required",
            "topology_preferred",
            "sharing",
            "priority_class",
            "preemptible",
            "preempts_across_queues",
            "checkpoint_restart_seconds",
            "max_devices",
            "max_devices_per_pod",
            "max_duration_seconds",
            "cost_label",
            "approval_required",
            "approval_threshold_devices",
            "cost_threshold_per_hour",
            "allowed_teams",
        ]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["device_classes"] = ", ".join(dc.name for dc in self.instance.ordered_device_classes())
            self.initial["cost_threshold_per_hour"] = cost_threshold(self.instance)
        self.fields["device_classes"].help_text += " Known: " + ", ".join(
            DeviceClass.objects.order_by("name").values_list("name", flat=True)
        )

    def clean_device_classes(self):
        names = [name.strip() for name in self.cleaned_data["device_classes"].split(",") if name.strip()]
        if not names:
            raise forms.ValidationError("Name at least one device class.")
        if len(set(names)) != len(names):
            raise forms.ValidationError("Name each device class once.")
        found = {dc.name: dc for dc in DeviceClass.objects.filter(name__in=names)}
        unknown = [name for name in names if name not in found]
        if unknown:
            raise forms.ValidationError(f"Unknown device class: {', '.join(unknown)}.")
        return [found[name] for name in names]


class DecisionForm(forms.Form):
    comment = forms.CharField(max_length=5000, widget=forms.Textarea(attrs={"rows": 2}), help_text="Say why.")
    not_before = UtcDateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), label="Not before"
    )
    not_after = UtcDateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), label="Not after"
    )
    reserve = forms.BooleanField(required=False, label="Reserve the devices for the team over the window")

    def clean_comment(self):
        comment = self.cleaned_data["comment"].strip()
        if not comment:
            raise forms.ValidationError("A comment is required: say why.")
        return comment


class AuditFilterForm(forms.Form):
    q = forms.CharField(required=False, label="Search")
    action = forms.CharField(required=False)
    actor = forms.CharField(required=False)
    target_type = forms.CharField(required=False)
    target_id = forms.CharField(required=False)
    manual = forms.ChoiceField(
        required=False, choices=[("", "any"), ("yes", "manual interventions"), ("no", "not manual")]
    )
    source = forms.ChoiceField(
        required=False,
        label="Who",
        choices=[("", "people"), ("replay", "the demo's replay"), ("all", "people and the replay")],
        help_text="The demo's trace replay submits for members; its events are left out unless asked for.",
    )
    after = UtcDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    before = UtcDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
