from django import template

from broker.audit.models import AuditEvent
from broker.governance.guidance import AUDIT_ACTION
from broker.governance.models import ApprovalRequest

register = template.Library()


@register.inclusion_tag("governance/_workload_approval.html")
def approval_card(workload):
    """The approval story of a workload for its page: why it needed approval, the decision, who made it
    and why, the granted window and reservation, escalation; and the advice given at submission."""
    approval_request = ApprovalRequest.objects.filter(workload=workload).select_related("reservation").first()
    advice = (
        AuditEvent.objects.filter(action=AUDIT_ACTION, target_type="workloads.workload", target_id=str(workload.pk))
        .values_list("after", flat=True)
        .first()
    )
    return {
        "workload": workload,
        "request": approval_request,
        "advice": (advice or {}).get("advice", []),
    }
