"""Device-class price history.

A price is in force from its `effective_from` until the next price of the class: a change never reaches
back over time already past. The first price of a class is recorded at EPOCH so that it also covers any
time before the class existed (replays, imported history): that is the class's only price then, not a
change.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver
from django.utils import timezone

from broker.costs.models import DeviceClassPrice
from broker.policy.models import DeviceClass

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MICROSECOND = timedelta(microseconds=1)
# Prices carry 4 decimal places (DeviceClass.price_per_hour); the ledger keeps them as integers of 1/10000.
PRICE_SCALE = 10_000


def price_units(price):
    """A price as an integer number of 1/10000 currency units (exact for 4 decimal places)."""
    scaled = Decimal(price) * PRICE_SCALE
    if scaled != scaled.to_integral_value():
        raise ValueError(f"price {price} has more than 4 decimal places")
    return int(scaled)


def latest_price(device_class):
    return DeviceClassPrice.objects.filter(device_class=device_class).order_by("-effective_from").first()


@receiver(post_save, sender=DeviceClass, dispatch_uid="costs.record_price_change")
def record_price_change(sender, instance, created, raw=False, **kwargs):
    """Whenever a device class is saved with a price different from the last recorded one, the new price
    starts now (never earlier)."""
    if raw:
        return
    latest = latest_price(instance)
    if latest is None:
        DeviceClassPrice.objects.create(
            device_class=instance, price_per_hour=instance.price_per_hour, effective_from=EPOCH
        )
        return
    if Decimal(latest.price_per_hour) == Decimal(instance.price_per_hour):
        return
    at = max(timezone.now(), latest.effective_from + ONE_MICROSECOND)
    DeviceClassPrice.objects.create(device_class=instance, price_per_hour=instance.price_per_hour, effective_from=at)


def set_price(device_class, price, at=None, actor=None, reason=""):
    """Record `price` for `device_class` from `at` (default now) and make it the current price.

    `at` must come after every price already recorded for the class: the history only grows forward, so
    nothing already billed changes. Returns the new DeviceClassPrice.
    """
    from broker.audit.models import record

    at = at or timezone.now()
    price = Decimal(price)
    if price < 0:
        raise ValidationError({"price_per_hour": "A price cannot be negative."})
    price_units(price)
    with transaction.atomic():
        DeviceClass.objects.select_for_update().filter(pk=device_class.pk).first()
        latest = latest_price(device_class)
        if latest is not None and at <= latest.effective_from:
            raise ValidationError(
                {"effective_from": f"Prices only change forward: the last price starts {latest.effective_from}."}
            )
        row = DeviceClassPrice.objects.create(device_class=device_class, price_per_hour=price, effective_from=at)
        before = str(device_class.price_per_hour)
        # update(), not save(): the signal would record the same change a second time, at "now".
        DeviceClass.objects.filter(pk=device_class.pk).update(price_per_hour=price)
        device_class.price_per_hour = price
        record(
            "deviceclass.price",
            device_class,
            actor=actor,
            before={"price_per_hour": before},
            after={"price_per_hour": str(price), "effective_from": at.isoformat()},
            reason=reason,
        )
    return row


def price_timelines(device_class_ids=None):
    """{device class id: [(effective_from, price units), ...] ascending}; classes with no recorded
    history (rows written around the signal) fall back to their current price for all time."""
    classes = DeviceClass.objects.all()
    if device_class_ids is not None:
        classes = classes.filter(pk__in=device_class_ids)
    out = {pk: [] for pk in classes.values_list("pk", flat=True)}
    rows = DeviceClassPrice.objects.filter(device_class_id__in=list(out)).order_by("device_class_id", "effective_from")
    for class_id, at, price in rows.values_list("device_class_id", "effective_from", "price_per_hour"):
        out[class_id].append((at, price_units(price)))
    for pk, price in classes.values_list("pk", "price_per_hour"):
        if not out[pk]:
            out[pk] = [(EPOCH, price_units(price))]
    return out
