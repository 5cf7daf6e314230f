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


DURATION_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


@register.filter
def duration(seconds):
    """Seconds as people say them: the two largest units, "4 d 4 h", "2 h 30 min", "45 s"."""
    try:
        left = int(round(float(seconds)))
    except (TypeError, ValueError):
        return ""
    if left <= 0:
        return "0 s"
    parts = []
    for unit, size in DURATION_UNITS:
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
        if len(parts) == 2 or (parts and not left):
            break
    return " ".join(parts)


def _flat(value, prefix):
    if isinstance(value, dict) and value:
        rows = []
        for key, inner in value.items():
            rows.extend(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
        return rows
    if isinstance(value, list | tuple | dict):
        shown = ", ".join(str(item) for item in value) if value and not isinstance(value, dict) else "none"
    else:
        shown = "—" if value is None else value
    return [(prefix, shown)]


@register.filter
def fields(mapping):
    """A dict (nested ones flattened to dotted names) as (name, value) rows for a small table."""
    if mapping is None:
        return []
    if not isinstance(mapping, dict):
        return [("value", mapping)]
    return [(name.replace("_", " "), value) for name, value in _flat(mapping, "")]


@register.filter
def changes(event):
    """An audit event's before and after side by side: (field, before, after) for every field either has."""
    before = dict(fields(event.before)) if event.before is not None else {}
    after = dict(fields(event.after)) if event.after is not None else {}
    names = list(dict.fromkeys([*before, *after]))
    return [(name, before.get(name, ""), after.get(name, "")) for name in names]
