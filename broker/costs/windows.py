"""Windows and steps as OpenCost's allocation API spells them, in UTC, with `now` passed in."""

import re
from datetime import UTC, datetime, timedelta

from broker.costs.prices import EPOCH

STEPS = ("hour", "day", "week", "month")
MAX_STEPS = 2000
_RELATIVE = re.compile(r"^(\d{1,4})([mhdw])$")
_MONTH = re.compile(r"^(\d{4})-(\d{2})$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class WindowError(ValueError):
    pass


def to_us(moment):
    return (moment - EPOCH) // timedelta(microseconds=1)


def from_us(micros):
    return EPOCH + timedelta(microseconds=micros)


def month_start(moment):
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(moment):
    start = month_start(moment)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)


def parse_month(value):
    """ "2026-11" -> (2026-11-01T00:00Z, 2026-12-01T00:00Z)."""
    match = _MONTH.match(value or "")
    if not match or not 1 <= int(match[2]) <= 12:
        raise WindowError("Use YYYY-MM, e.g. 2026-11.")
    start = datetime(int(match[1]), int(match[2]), 1, tzinfo=UTC)
    return start, next_month(start)


def parse_window(value, now):
    """(start, end) for "start,end" (RFC 3339), "7d" / "24h" / "2w" / "30m" (ending now), "today", "week",
    "month" (so far), "lastmonth", or "YYYY-MM"."""
    value = (value or "").strip()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if value == "today":
        return today, now
    if value == "week":
        return today - timedelta(days=today.weekday()), now
    if value == "month":
        return month_start(now), now
    if value == "lastmonth":
        end = month_start(now)
        return month_start(end - timedelta(days=1)), end
    if _MONTH.match(value):
        return parse_month(value)
    match = _RELATIVE.match(value)
    if match:
        amount = int(match[1])
        if amount == 0:
            raise WindowError("A relative window must be at least 1 unit long.")
        return now - timedelta(**{_UNITS[match[2]]: amount}), now
    if "," in value:
        start, end = (_parse_moment(part) for part in value.split(",", 1))
        if end <= start:
            raise WindowError("The window must end after it starts.")
        return start, end
    raise WindowError('Use "start,end" in RFC 3339, a duration such as 7d or 24h, today, week, month or lastmonth.')


def _parse_moment(text):
    text = text.strip()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise WindowError(f'"{text}" is not an RFC 3339 time such as 2026-11-01T00:00:00Z.') from None
    if moment.tzinfo is None:
        raise WindowError(f'"{text}" needs a time zone, e.g. a trailing Z.')
    if moment < EPOCH:
        raise WindowError("Times before 1970 are not billed.")
    return moment.astimezone(UTC)


def step_floor(moment, step):
    if step == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if step == "day":
        return day
    if step == "week":
        return day - timedelta(days=day.weekday())  # ISO weeks start on Monday
    return month_start(moment)


def step_after(moment, step):
    if step == "month":
        return next_month(moment)
    return moment + {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}[step]


def steps_of(start, end, step):
    """Calendar-aligned steps covering [start, end), the first and last clipped to the window."""
    if step not in STEPS:
        raise WindowError(f"Use one of {', '.join(STEPS)}.")
    out = []
    cursor = start
    while cursor < end:
        boundary = step_after(step_floor(cursor, step), step)
        out.append((cursor, min(boundary, end)))
        cursor = boundary
        if len(out) > MAX_STEPS:
            raise WindowError(f"More than {MAX_STEPS} steps: use a longer step or a shorter window.")
    return out
