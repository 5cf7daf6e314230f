"""An explanation's workload is checked by triggers instead of a foreign key.

A foreign key checks, and share-locks, the workload of every new explanation one by one: at 100k
devices a refill's commit writes 17,000 new explanations, and those checks took 116-205 ms of a
0.6-1.1 s commit (a slow day). The insert trigger's one join and its locks run inside the COPY, where
PostgreSQL waits for the rows' encoding anyway. These triggers do what the key did, a statement's rows
at a time:

- an INSERT (or an UPDATE that changes `workload_id`) naming a workload that does not exist is refused:
  foreign_key_violation, constraint "explanation_workload". The named workloads are locked FOR KEY
  SHARE in one statement, as the key locked each: a workload deleted after a REPEATABLE READ cycle's
  snapshot makes that locking read fail (the cycle's stale-snapshot refusal), one being deleted makes it
  wait and then fail, and a deletion that starts later waits for the inserting transaction;
- a DELETE of workloads deletes their explanations (Django's collector deletes them first; this catches
  what committed in between, the rows of a cycle the deletion waited for: READ COMMITTED, each statement
  of the trigger sees what committed before it. A deletion at REPEATABLE READ would not see them; the
  deletions here, the API's, the admin's and the retention's, run at READ COMMITTED);
- a change of a named workload's id is refused.

SQLite (the embedded default) gets the insert and update check as row triggers, and leaves deletions to
Django's collector: one writer at a time there, so nothing commits between the two. (A trigger on the
workload table would also go, unnoticed, with the next migration that makes SQLite rebuild that table.)
"""

import django.db.models.deletion
from django.db import migrations, models

POSTGRESQL = """
CREATE OR REPLACE FUNCTION explained_workloads_exist() RETURNS trigger AS $$
DECLARE
    named bigint;
    locked bigint;
    missing bigint;
BEGIN
    SELECT count(*) INTO named FROM new_explanations;
    IF named = 0 THEN
        RETURN NULL;
    END IF;
    -- A join, not IN: the planner knows the transition table's size and hashes a cycle's thousands of
    -- rows against one pass over the workloads, where IN's guess of 200 distinct ids probed the index per row.
    SELECT count(*) INTO locked FROM (
        SELECT 1 FROM workloads_workload w JOIN new_explanations n ON n.workload_id = w.id
           FOR KEY SHARE OF w
    ) AS kept;
    IF locked < named THEN
        SELECT n.workload_id INTO missing FROM new_explanations n
         WHERE NOT EXISTS (SELECT 1 FROM workloads_workload w WHERE w.id = n.workload_id) LIMIT 1;
        RAISE EXCEPTION 'explanation names workload %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'explanation_workload',
                  TABLE = 'workloads_explanation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION explained_workload_exists_row() RETURNS trigger AS $$
BEGIN
    PERFORM 1 FROM workloads_workload w WHERE w.id = NEW.workload_id FOR KEY SHARE OF w;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'explanation names workload %, which does not exist', NEW.workload_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'explanation_workload',
                  TABLE = 'workloads_explanation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION explanations_of_deleted_workloads_go() RETURNS trigger AS $$
BEGIN
    DELETE FROM workloads_explanation e USING old_workloads o WHERE e.workload_id = o.id;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION explained_workload_kept() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM workloads_explanation e WHERE e.workload_id = OLD.id) THEN
        RAISE EXCEPTION 'workloads_workload % is named by an explanation', OLD.id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'explanation_workload',
                  TABLE = 'workloads_workload';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER explanation_workload_insert AFTER INSERT ON workloads_explanation
    REFERENCING NEW TABLE AS new_explanations
    FOR EACH STATEMENT EXECUTE FUNCTION explained_workloads_exist();
CREATE TRIGGER explanation_workload_update BEFORE UPDATE OF workload_id ON workloads_explanation
    FOR EACH ROW WHEN (OLD.workload_id IS DISTINCT FROM NEW.workload_id)
    EXECUTE FUNCTION explained_workload_exists_row();
CREATE TRIGGER explanation_workload_delete AFTER DELETE ON workloads_workload
    REFERENCING OLD TABLE AS old_workloads
    FOR EACH STATEMENT EXECUTE FUNCTION explanations_of_deleted_workloads_go();
CREATE TRIGGER explanation_workload_rekey BEFORE UPDATE OF id ON workloads_workload
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id) EXECUTE FUNCTION explained_workload_kept();
"""

POSTGRESQL_TRIGGERS = {
    "explanation_workload_insert": "workloads_explanation",
    "explanation_workload_update": "workloads_explanation",
    "explanation_workload_delete": "workloads_workload",
    "explanation_workload_rekey": "workloads_workload",
}
POSTGRESQL_FUNCTIONS = (
    "explained_workloads_exist",
    "explained_workload_exists_row",
    "explanations_of_deleted_workloads_go",
    "explained_workload_kept",
)

SQLITE_CHECK = (
    "WHEN NOT EXISTS (SELECT 1 FROM workloads_workload WHERE id = NEW.workload_id) "
    "BEGIN SELECT RAISE(ABORT, 'explanation names a workload which does not exist'); END"
)
SQLITE = [
    f"CREATE TRIGGER explanation_workload_insert BEFORE INSERT ON workloads_explanation {SQLITE_CHECK}",
    f"CREATE TRIGGER explanation_workload_update BEFORE UPDATE OF workload_id ON workloads_explanation {SQLITE_CHECK}",
]


def install(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(POSTGRESQL)
        elif connection.vendor == "sqlite":
            for statement in SQLITE:
                cursor.execute(statement)
        else:
            raise NotImplementedError(f"explanation reference triggers for {connection.vendor}")


def uninstall(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for name, table in POSTGRESQL_TRIGGERS.items():
                cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            for function in POSTGRESQL_FUNCTIONS:
                cursor.execute(f"DROP FUNCTION IF EXISTS {function}()")
        elif connection.vendor == "sqlite":
            for name in ("explanation_workload_insert", "explanation_workload_update"):
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):

    dependencies = [
        ('workloads', '0016_allocation_references_checked_by_statement'),
    ]

    operations = [
        migrations.AlterField(
            model_name='explanation',
            name='workload',
            field=models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='explanation', to='workloads.workload'),
        ),
        migrations.RunPython(install, uninstall),
    ]
