"""Monthly chargeback per team, as rows (the API's), CSV and XLSX: one source, the same figures."""

import csv
import io
from decimal import Decimal

from django.utils import timezone

from broker.costs.pending import pending_report
from broker.costs.report import chargeback

COLUMNS = (
    "month",
    "line",
    "kind",
    "device_hours",
    "allocated_cost",
    "reserved_unused_cost",
    "charge",
    "pending_cost_not_billed",
    # When the figures were read: a month still running changes with every hour.
    "as_of",
)
TEXT_COLUMNS = ("month", "line", "kind", "as_of")
PLATFORM_LINES = ("idle", "stranded", "unhealthy")
ZERO = Decimal("0.00")
MONEY_COLUMNS = ("allocated_cost", "reserved_unused_cost", "charge", "pending_cost_not_billed")


def chargeback_rows(start, end, now=None):
    """One row per team (allocated + reserved-unused = charge), one per platform category, and a total row
    whose charge is the whole capacity cost. The charges add up to it exactly. Pending cost is an
    opportunity cost beside the bill: its column is never part of a charge."""
    now = now or timezone.now()
    bill = chargeback(start, end, now=now)
    pending = pending_report(start, end, aggregate=("team",), step="month", now=now)["totals"]["pending"]
    month = f"{start:%Y-%m}"
    as_of = min(end, now).isoformat(timespec="seconds")
    rows = []
    for team in bill["teams"]:
        rows.append(
            {
                "month": month,
                "line": team["team"],
                "kind": "team",
                "device_hours": team["allocated_device_hours"] + team["reserved_unused_device_hours"],
                "allocated_cost": team["allocated_cost"],
                "reserved_unused_cost": team["reserved_unused_cost"],
                "charge": team["charge"],
                "pending_cost_not_billed": pending.get(team["team"], {}).get("cost", ZERO),
                "as_of": as_of,
            }
        )
    for name in PLATFORM_LINES:
        figure = bill["platform"][name]
        rows.append(
            {
                "month": month,
                "line": name,
                "kind": "platform",
                "device_hours": figure["device_hours"],
                "allocated_cost": ZERO,
                "reserved_unused_cost": ZERO,
                "charge": figure["cost"],
                "pending_cost_not_billed": ZERO,
                "as_of": as_of,
            }
        )
    rows.append(
        {
            "month": month,
            "line": "total",
            "kind": "total",
            "device_hours": bill["total"]["device_hours"],
            "allocated_cost": sum((r["allocated_cost"] for r in rows), ZERO),
            "reserved_unused_cost": sum((r["reserved_unused_cost"] for r in rows), ZERO),
            "charge": bill["total"]["cost"],
            "pending_cost_not_billed": sum((r["pending_cost_not_billed"] for r in rows), ZERO),
            "as_of": as_of,
        }
    )
    return rows


def to_csv(rows):
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _plain(row[key]) for key in COLUMNS})
    return buffer.getvalue()


def _plain(value):
    """Money and hours as fixed-point text (no float noise)."""
    if isinstance(value, Decimal):
        return f"{value:f}"
    return value


def to_xlsx(rows):
    from openpyxl import Workbook
    from openpyxl.styles import Font

    workbook = Workbook()
    sheet = workbook.active
    sheet.title = "Chargeback"
    sheet.append(list(COLUMNS))
    for cell in sheet[1]:
        cell.font = Font(bold=True)
    for row in rows:
        # Decimals are written as numbers; cents fit a double exactly enough for any realistic bill, and the
        # number format shows them to the cent.
        sheet.append([row[key] if key in TEXT_COLUMNS else float(row[key]) for key in COLUMNS])
    for column, key in enumerate(COLUMNS, start=1):
        if key in MONEY_COLUMNS:
            for (cell,) in sheet.iter_rows(min_row=2, min_col=column, max_col=column):
                cell.number_format = "#,##0.00"
        elif key == "device_hours":
            for (cell,) in sheet.iter_rows(min_row=2, min_col=column, max_col=column):
                cell.number_format = "#,##0.0000"
    sheet.freeze_panes = "A2"
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()
