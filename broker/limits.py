"""The bounds of what the broker accepts: one place for each rule, read by the API's serializers and
parsers, the pages' forms, the filters and the admin, so each refuses the same input with the same words
before the database sees it.

The numbers are those a real cluster can have, with room to spare, and inside what PostgreSQL's integer
columns hold (a value past 2³¹ was a database overflow, a 500):

- priority: Kubernetes' PriorityClass range, user classes up to one billion;
- pod sets: Kueue's eight per workload (its Workload API's maxItems), replicas up to 100,000 pods;
- devices per pod: 1,024 (the largest DRA ResourceClaim allocation, with room);
- device classes per pod set: DRA's eight firstAvailable alternatives;
- expected duration: ten years.
"""

import datetime

import django_filters
from django import forms
from django.core.validators import MaxValueValidator, MinValueValidator

PRIORITY_MIN = -2_147_483_648
PRIORITY_MAX = 1_000_000_000
REPLICAS_MAX = 100_000
DEVICES_PER_POD_MAX = 1_024
POD_SETS_MAX = 8
GROUP_CLAIMS_MAX = 8
DEVICE_CLASSES_PER_POD_SET_MAX = 8
EXPECTED_DURATION_MAX_SECONDS = 10 * 366 * 24 * 3600
EXPECTED_HOURS_MAX = EXPECTED_DURATION_MAX_SECONDS // 3600
# Any JSON body the API takes is a few levels deep (a submission: body → pod sets → one pod set → its
# device classes); 32 leaves room and stops a 100,000-deep body long before Python's recursion limit.
JSON_DEPTH_MAX = 32
# Pages of a list: beyond this the offset alone would overflow PostgreSQL's bigint.
PAGE_MAX = 1_000_000
# A manual intervention's reason (the audit trail's `reason` column takes this many characters).
REASON_MAX_LENGTH = 2000

PRIORITY_VALIDATORS = [MinValueValidator(PRIORITY_MIN), MaxValueValidator(PRIORITY_MAX)]
REPLICAS_VALIDATORS = [MinValueValidator(1), MaxValueValidator(REPLICAS_MAX)]
DEVICES_PER_POD_VALIDATORS = [MinValueValidator(1), MaxValueValidator(DEVICES_PER_POD_MAX)]
EXPECTED_DURATION_VALIDATORS = [MinValueValidator(1), MaxValueValidator(EXPECTED_DURATION_MAX_SECONDS)]
# The admin's forms add these to the model fields of these names (BoundedFieldsAdminMixin).
VALIDATORS_BY_FIELD = {
    "priority": PRIORITY_VALIDATORS,
    "value": PRIORITY_VALIDATORS,  # a priority class's value
    "replicas": REPLICAS_VALIDATORS,
    "min_count": REPLICAS_VALIDATORS,
    "devices_per_pod": DEVICES_PER_POD_VALIDATORS,
    "expected_duration_seconds": EXPECTED_DURATION_VALIDATORS,
}

# PostgreSQL takes UTC offsets up to ±15:59; Python parses up to ±23:59. An aware instant is compared in
# UTC, so it is turned to UTC before any query sees it (the instant is the same, the offset is gone).
DATETIME_OUT_OF_RANGE = "That instant is outside the range of dates the broker stores."


def in_utc(value):
    """An aware datetime as the same instant in UTC; a ValidationError when that instant has no UTC
    date (year 1 with a positive offset)."""
    if value is None or value.tzinfo is None:
        return value
    try:
        return value.astimezone(datetime.UTC)
    except OverflowError as error:
        raise forms.ValidationError(DATETIME_OUT_OF_RANGE, code="overflow") from error


class UtcDateTimeField(forms.DateTimeField):
    """Django's DateTimeField, with any UTC offset turned to UTC."""

    def to_python(self, value):
        return in_utc(super().to_python(value))


class UtcIsoDateTimeField(django_filters.fields.IsoDateTimeField):
    """django-filter's ISO 8601 field, with any UTC offset turned to UTC."""

    def to_python(self, value):
        return in_utc(super().to_python(value))


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    """The ISO 8601 filter of every list that filters on an instant."""

    field_class = UtcIsoDateTimeField


NUL_REFUSED = "Text cannot contain NUL (\\u0000) characters."


def json_refusal(data):
    """Why parsed JSON is refused, or "": nested deeper than JSON_DEPTH_MAX, or NUL in a key or string
    (PostgreSQL stores neither in text nor jsonb). Walks without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > JSON_DEPTH_MAX:
                return f"JSON nested deeper than {JSON_DEPTH_MAX} levels is not accepted."
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and "\x00" in key:
                    return NUL_REFUSED
                stack.append((item, depth + 1))
        elif isinstance(value, str) and "\x00" in value:
            return NUL_REFUSED
    return ""


def validate_json_value(value):
    """The admin's JSON fields refuse what the API's parser refuses."""
    refusal = json_refusal(value)
    if refusal:
        raise forms.ValidationError(refusal, code="invalid")


def page_number(raw):
    """A list page's ?page=: a whole number from 1 to PAGE_MAX; anything else is the first or last page."""
    try:
        number = int(raw or "1")
    except (TypeError, ValueError):
        return 1
    return min(max(1, number), PAGE_MAX)


class BoundedFieldsAdminMixin:
    """For a ModelAdmin or inline: its form fields named in VALIDATORS_BY_FIELD take those bounds, so the
    admin refuses what the API and the pages refuse, with the same words."""

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        formfield = super().formfield_for_dbfield(db_field, request, **kwargs)
        bounds = VALIDATORS_BY_FIELD.get(db_field.name)
        if formfield is not None and bounds:
            formfield.validators = [*formfield.validators, *bounds]
            for validator in bounds:
                attr = "min" if isinstance(validator, MinValueValidator) else "max"
                formfield.widget.attrs[attr] = validator.limit_value
        return formfield
