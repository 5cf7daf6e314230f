from django import template

register = template.Library()


@register.filter
def pct(value, total):
    """value as a percentage of total, for bar widths; 0 when the total is 0."""
    try:
        return round(100 * float(value) / float(total), 2) if total else 0
    except (TypeError, ValueError):
        return 0


@register.filter
def get(mapping, key):
    return mapping.get(key) if hasattr(mapping, "get") else None
