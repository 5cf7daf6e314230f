"""An allocation's workload and device are checked by triggers instead of foreign keys.

A foreign key checks, and share-locks, the referenced row of every new row one by one: 230 ms of a
20,000-admission commit (25,000 allocations). These triggers do what the two foreign keys did, a
statement's rows at a time:

- an INSERT (or an UPDATE that changes either column) naming a workload or device that does not exist
  is refused: foreign_key_violation, constraint "allocation_references";
- a DELETE of a workload or device that an allocation (active or released) names is refused, and so is
  a change of such a row's id.

They take no row locks. The one writer of allocations, the cycle's commit, holds what those locks
held: the row of every workload it admits (its UPDATE) and the inventory revision row, which every
inventory write takes first (inventory 0004, BEFORE STATEMENT). A deletion that starts during the
commit waits for it and then (READ COMMITTED, each trigger query sees what committed before it) finds
the new allocations; one that committed after the cycle's snapshot makes the commit's own locking read
fail, the stale-snapshot refusal. TRUNCATE is left to administrators, as with a foreign key and CASCADE.

SQLite (the embedded default) gets the insert and update check as row triggers, and no deletion
check: one writer at a time there, and Django's PROTECT refuses an ORM deletion of an allocated row.
(A deletion trigger would also break Django's flush, which deletes table by table.)
"""

import django.db.models.deletion
from django.db import migrations, models

POSTGRESQL = """
CREATE OR REPLACE FUNCTION allocation_references_exist() RETURNS trigger AS $$
DECLARE
    missing bigint;
    kind text := 'workload';
BEGIN
    SELECT n.workload_id INTO missing FROM new_allocations n
     WHERE NOT EXISTS (SELECT 1 FROM workloads_workload w WHERE w.id = n.workload_id) LIMIT 1;
    IF NOT FOUND THEN
        kind := 'device';
        SELECT n.device_id INTO missing FROM new_allocations n
         WHERE NOT EXISTS (SELECT 1 FROM inventory_device d WHERE d.id = n.device_id) LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'allocation names % %, which does not exist', kind, missing
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'allocation_references',
                  TABLE = 'workloads_allocation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION allocated_rows_kept() RETURNS trigger AS $$
DECLARE
    held bigint;
BEGIN
    IF TG_TABLE_NAME = 'inventory_device' THEN
        SELECT o.id INTO held FROM old_rows o
         WHERE EXISTS (SELECT 1 FROM workloads_allocation a WHERE a.device_id = o.id) LIMIT 1;
    ELSE
        SELECT o.id INTO held FROM old_rows o
         WHERE EXISTS (SELECT 1 FROM workloads_allocation a WHERE a.workload_id = o.id) LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION '% % is named by allocations', TG_TABLE_NAME, held
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'allocation_references',
                  TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION allocation_references_exist_row() RETURNS trigger AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workloads_workload w WHERE w.id = NEW.workload_id)
       OR NOT EXISTS (SELECT 1 FROM inventory_device d WHERE d.id = NEW.device_id) THEN
        RAISE EXCEPTION 'allocation names workload % and device %, one of which does not exist',
                NEW.workload_id, NEW.device_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'allocation_references',
                  TABLE = 'workloads_allocation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION allocated_row_kept() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM workloads_allocation a
                WHERE (TG_TABLE_NAME = 'inventory_device' AND a.device_id = OLD.id)
                   OR (TG_TABLE_NAME = 'workloads_workload' AND a.workload_id = OLD.id)) THEN
        RAISE EXCEPTION '% % is named by allocations', TG_TABLE_NAME, OLD.id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'allocation_references',
                  TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER allocation_references_insert AFTER INSERT ON workloads_allocation
    REFERENCING NEW TABLE AS new_allocations
    FOR EACH STATEMENT EXECUTE FUNCTION allocation_references_exist();
CREATE TRIGGER allocation_references_update BEFORE UPDATE OF workload_id, device_id ON workloads_allocation
    FOR EACH ROW WHEN (OLD.workload_id IS DISTINCT FROM NEW.workload_id OR OLD.device_id IS DISTINCT FROM NEW.device_id)
    EXECUTE FUNCTION allocation_references_exist_row();
"""

REFERENCED_TABLES = ("workloads_workload", "inventory_device")


def referenced_triggers(table):
    # The deletion check takes a statement's rows as one set; the id change (which Django never makes)
    # is looked at only for a row whose id changes, so the cycle's 20,000-row UPDATEs pay nothing.
    return [
        f"CREATE TRIGGER allocation_references_delete AFTER DELETE ON {table} REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION allocated_rows_kept()",
        f"CREATE TRIGGER allocation_references_rekey BEFORE UPDATE OF id ON {table} FOR EACH ROW "
        "WHEN (OLD.id IS DISTINCT FROM NEW.id) EXECUTE FUNCTION allocated_row_kept()",
    ]


SQLITE_CHECK = (
    "WHEN NOT EXISTS (SELECT 1 FROM workloads_workload WHERE id = NEW.workload_id) "
    "OR NOT EXISTS (SELECT 1 FROM inventory_device WHERE id = NEW.device_id) "
    "BEGIN SELECT RAISE(ABORT, 'allocation names a workload or device which does not exist'); END"
)
SQLITE = [
    f"CREATE TRIGGER allocation_references_insert BEFORE INSERT ON workloads_allocation {SQLITE_CHECK}",
    "CREATE TRIGGER allocation_references_update BEFORE UPDATE OF workload_id, device_id ON workloads_allocation "
    + SQLITE_CHECK,
]


def install(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(POSTGRESQL)
            for table in REFERENCED_TABLES:
                for statement in referenced_triggers(table):
                    cursor.execute(statement)
        elif connection.vendor == "sqlite":
            for statement in SQLITE:
                cursor.execute(statement)
        else:
            raise NotImplementedError(f"allocation reference triggers for {connection.vendor}")


def uninstall(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in (*REFERENCED_TABLES, "workloads_allocation"):
                for name in ("insert", "update", "delete", "rekey"):
                    cursor.execute(f"DROP TRIGGER IF EXISTS allocation_references_{name} ON {table}")
            for function in ("allocation_references_exist", "allocation_references_exist_row",
                             "allocated_rows_kept", "allocated_row_kept"):
                cursor.execute(f"DROP FUNCTION IF EXISTS {function}()")
        elif connection.vendor == "sqlite":
            for name in ("insert", "update"):
                cursor.execute(f"DROP TRIGGER IF EXISTS allocation_references_{name}")


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0004_row_revisions'),
        ('workloads', '0015_waiting_workloads_in_submission_order'),
    ]

    operations = [
        migrations.AlterField(
            model_name='allocation',
            name='device',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT, related_name='allocations', to='inventory.device'),
        ),
        migrations.AlterField(
            model_name='allocation',
            name='workload',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT, related_name='allocations', to='workloads.workload'),
        ),
        migrations.RunPython(install, uninstall),
    ]
