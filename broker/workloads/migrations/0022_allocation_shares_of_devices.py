"""Devices shared by several allocations (issue 26): an allocation may take a share of a device that
allows several (inventory 0006, DRA allowMultipleAllocations), recorded as the capacity it consumes
(DRA consumedCapacity); a pod set says what each pod takes (DRA ExactDeviceRequest capacity).

- The one-active-allocation index becomes one whole holder per device: keyed (device, 0) for a whole
  allocation and (device, id) for a share. Its condition is still released_at IS NULL, so it stays the
  index of every active allocation. On SQLite a partial or expression index is dropped and made without
  rebuilding the table (whose triggers, 0016, a rebuild would drop).
- On PostgreSQL, a statement trigger on INSERT refuses a share of a device that allows none and a share
  beside a whole allocation (either way round), as unique_violation, constraint
  "allocation_whole_or_shared". It looks further only while some share is active (one probe of the
  small allocation_active_shares index), so a cluster without time-slicing pays that one lookup.
  Allocations are written once, by the cycle's commit, and then only released: no UPDATE trigger.
  SQLite has one writer at a time, the cycle, whose commit checks the same (broker.cycle.commit).
- The columns are added as in 0019 and 0021: on SQLite by its own ALTER TABLE ADD COLUMN.
"""

from django.db import migrations, models
from django.db.models import Case, F, Q, Value, When

CAPACITY = models.JSONField(
    default=dict,
    blank=True,
    help_text="What each pod takes of each of its devices when its resource class shares them (TimeSliced), "
    'as DRA\'s ExactDeviceRequest capacity.requests writes it, e.g. {"memory": "20Gi"}; empty: devices whole.',
)
CONSUMED = models.JSONField(null=True, blank=True)

SHARES_CHECK = """
CREATE OR REPLACE FUNCTION allocation_whole_or_shared() RETURNS trigger AS $$
DECLARE
    device bigint;
    problem text;
BEGIN
    -- No active share anywhere (new ones included: this runs after the insert): nothing can mix. One
    -- probe of the small allocation_active_shares index, so a cycle of whole devices pays only that.
    IF NOT EXISTS (SELECT 1 FROM workloads_allocation WHERE released_at IS NULL AND consumed_capacity IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    problem := 'allows no multiple allocations';
    SELECT n.device_id INTO device FROM new_shares n JOIN inventory_device d ON d.id = n.device_id
     WHERE n.consumed_capacity IS NOT NULL AND n.released_at IS NULL AND NOT d.allow_multiple_allocations
     LIMIT 1;
    IF NOT FOUND THEN
        problem := 'is held whole';
        SELECT n.device_id INTO device FROM new_shares n JOIN workloads_allocation a
            ON a.device_id = n.device_id AND a.released_at IS NULL AND a.consumed_capacity IS NULL
         WHERE n.consumed_capacity IS NOT NULL AND n.released_at IS NULL LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'a share of a device that %', problem USING ERRCODE = 'unique_violation',
            CONSTRAINT = 'allocation_whole_or_shared', DETAIL = format('Key (device_id)=(%s) %s.', device, problem);
    END IF;
    SELECT n.device_id INTO device FROM new_shares n JOIN workloads_allocation a
        ON a.device_id = n.device_id AND a.released_at IS NULL AND a.consumed_capacity IS NOT NULL
     WHERE n.consumed_capacity IS NULL AND n.released_at IS NULL LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a whole allocation of a shared device' USING ERRCODE = 'unique_violation',
            CONSTRAINT = 'allocation_whole_or_shared', DETAIL = format('Key (device_id)=(%s) is shared.', device);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER allocation_whole_or_shared AFTER INSERT ON workloads_allocation
    REFERENCING NEW TABLE AS new_shares FOR EACH STATEMENT EXECUTE FUNCTION allocation_whole_or_shared();
"""


def add_columns(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            "ALTER TABLE workloads_podset ADD COLUMN capacity text NOT NULL DEFAULT '{}' "
            'CHECK ((JSON_VALID("capacity") OR "capacity" IS NULL))'
        )
        schema_editor.execute(
            "ALTER TABLE workloads_allocation ADD COLUMN consumed_capacity text NULL "
            'CHECK ((JSON_VALID("consumed_capacity") OR "consumed_capacity" IS NULL))'
        )
        return
    for model_name, name, prototype in (("PodSet", "capacity", CAPACITY), ("Allocation", "consumed_capacity", CONSUMED)):
        field = prototype.clone()
        field.set_attributes_from_name(name)
        schema_editor.add_field(apps.get_model("workloads", model_name), field)


def drop_columns(apps, schema_editor):
    schema_editor.execute("ALTER TABLE workloads_podset DROP COLUMN capacity")
    schema_editor.execute("ALTER TABLE workloads_allocation DROP COLUMN consumed_capacity")


def install_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:  # no parameters: the function's "%" stays as it is
            cursor.execute(SHARES_CHECK)


def uninstall_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS allocation_whole_or_shared ON workloads_allocation")
        schema_editor.execute("DROP FUNCTION IF EXISTS allocation_whole_or_shared()")


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0006_device_allows_multiple_allocations"),
        ("workloads", "0021_pod_set_claim"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(model_name="podset", name="capacity", field=CAPACITY),
                migrations.AddField(model_name="allocation", name="consumed_capacity", field=CONSUMED),
            ],
            database_operations=[migrations.RunPython(add_columns, drop_columns)],
        ),
        migrations.RemoveConstraint(model_name="allocation", name="allocation_one_active_per_device"),
        migrations.AddConstraint(
            model_name="allocation",
            constraint=models.UniqueConstraint(
                F("device"),
                Case(
                    When(consumed_capacity__isnull=True, then=Value(0)),
                    default=F("id"),
                    output_field=models.BigIntegerField(),
                ),
                condition=Q(released_at__isnull=True),
                name="allocation_one_whole_per_device",
            ),
        ),
        migrations.AddIndex(
            model_name="allocation",
            index=models.Index(
                fields=["device"],
                condition=Q(released_at__isnull=True, consumed_capacity__isnull=False),
                name="allocation_active_shares",
            ),
        ),
        migrations.RunPython(install_trigger, uninstall_trigger),
    ]
