"""Per-row revisions on nodes and devices, so the loader re-reads only the rows written since its last read.

Every INSERT or UPDATE of a node or device row takes `revision = nextval(inventory_row_revision)` in a
BEFORE ROW trigger. The loader remembers the highest revision R among the rows its snapshot saw and
next time reads only `revision > R`. That is right only if no row with a revision <= R can become
visible later, i.e. if commit order is revision order. Sequences alone do not give that: writer A
draws 5, writer B draws 6 and commits, a snapshot sees 6 but not 5, R = 6, and A's row is missed
forever once A commits.

So writers are serialized before they draw: the token bump (migration 0003) moves from AFTER to BEFORE
STATEMENT. Its upsert locks the InventoryRevision row, and a row lock is held until the transaction
ends, so every nextval() of an inventory-writing transaction happens while it holds that lock (a
statement's BEFORE STATEMENT triggers fire before any of its row triggers). Two writers' lock
intervals are disjoint, hence so are their ranges of revisions, in lock order. If a snapshot sees a
row of revision w, w's writer committed before the snapshot; a writer that drew v < w held the lock
before w's writer did and committed (PostgreSQL marks a transaction committed before it releases its
locks) before w's writer could draw, so the snapshot sees v too. A writer that commits after the
snapshot draws above every revision the snapshot saw.

The sequence has CACHE 1 (the default, stated): with a per-session cache a later writer could draw a
smaller number that its session had preallocated. Deletions draw nothing; the loader notices them by
counting rows. The cycle's commit locks the same row (broker.cycle.commit.inventory_unchanged): a
writer now holds it from its first inventory statement, so the commit waits for it from then on, and
both take the revision row before any device row, one lock order for all.

SQLite (the embedded default, small clusters) gets the columns, always NULL, and no triggers; the
loader reads the whole inventory there whenever the token moves. Rows older than this migration keep a
NULL revision on PostgreSQL too until their next write: the loader's first read after it is a full one."""

from django.db import migrations, models

TABLES = ("inventory_topologylevel", "inventory_domain", "inventory_node", "inventory_device")
ROW_TABLES = ("inventory_node", "inventory_device")
SEQUENCE = "inventory_row_revision"

POSTGRESQL_ROW_FUNCTION = f"""
CREATE OR REPLACE FUNCTION inventory_row_revision() RETURNS trigger AS $$
BEGIN
    NEW.revision := nextval('{SEQUENCE}');
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
"""


def statement_trigger(table, timing):
    return (
        f"CREATE TRIGGER {table}_revision {timing} INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION inventory_revision_bump()"
    )


def install(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SEQUENCE {SEQUENCE} CACHE 1")
        cursor.execute(POSTGRESQL_ROW_FUNCTION)
        for table in ROW_TABLES:
            cursor.execute(
                f"CREATE TRIGGER {table}_row_revision BEFORE INSERT OR UPDATE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION inventory_row_revision()"
            )
        for table in TABLES:
            cursor.execute(f"DROP TRIGGER {table}_revision ON {table}")
            cursor.execute(statement_trigger(table, "BEFORE"))


def uninstall(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"DROP TRIGGER IF EXISTS {table}_revision ON {table}")
            cursor.execute(statement_trigger(table, "AFTER"))
        for table in ROW_TABLES:
            cursor.execute(f"DROP TRIGGER IF EXISTS {table}_row_revision ON {table}")
        cursor.execute("DROP FUNCTION IF EXISTS inventory_row_revision()")
        cursor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [("inventory", "0003_inventory_revision")]
    operations = [
        migrations.AddField(
            model_name="device",
            name="revision",
            field=models.BigIntegerField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name="node",
            name="revision",
            field=models.BigIntegerField(editable=False, null=True),
        ),
        migrations.RunPython(install, uninstall),
    ]
