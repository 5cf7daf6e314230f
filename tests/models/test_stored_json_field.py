"""StoredJSONField: an Explanation's JSON kept as text (PostgreSQL `json`), read back as the ORM's
JSONField reads it, whichever way it was written."""

from django.db import connection

from broker.workloads.models import Explanation
from tests.builders import make_workload

DETAILS = {"text": 'tab\t"quote" \\ ü 🚀', "n": [1, 2.5, None, True], "nested": {"b": 1, "a": {}}}


def explain(workload, **fields):
    return Explanation.objects.create(workload=workload, reason="InsufficientCapacity", message="m", **fields)


def column_types():
    if connection.vendor != "postgresql":  # SQLite's columns are as declared
        return {
            name: Explanation._meta.get_field(name).db_type(connection)
            for name in ("details", "secondary", "suggestions")
        }
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            [Explanation._meta.db_table],
        )
        return dict(cursor.fetchall())


def test_it_stores_the_explanations_json_as_text_on_postgresql(cluster):
    types = column_types()
    expected = "json" if connection.vendor == "postgresql" else "text"
    assert [types[name] for name in ("details", "secondary", "suggestions")] == [expected] * 3


def test_it_reads_back_what_the_orm_saved(cluster):
    saved = explain(make_workload(cluster.queue_a), details=DETAILS, secondary=["QuotaExceeded"])

    read = Explanation.objects.get(pk=saved.pk)

    assert (read.details, read.secondary, read.suggestions) == (DETAILS, ["QuotaExceeded"], [])


def test_it_reads_back_what_an_update_and_a_bulk_update_wrote(cluster):
    first, second = (explain(make_workload(cluster.queue_a, name=f"w{i}")) for i in range(2))

    Explanation.objects.filter(pk=first.pk).update(details={"updated": [1, "two"]})
    second.details, second.suggestions = DETAILS, [{"kind": "smaller", "change": {"pods": 2}}]
    Explanation.objects.bulk_update([second], ["details", "suggestions"])

    assert Explanation.objects.get(pk=first.pk).details == {"updated": [1, "two"]}
    second.refresh_from_db()
    assert (second.details, second.suggestions) == (DETAILS, [{"kind": "smaller", "change": {"pods": 2}}])


def test_it_reads_json_scalars_and_values_lists_as_values(cluster):
    saved = explain(make_workload(cluster.queue_a), details="just a string", secondary=[], suggestions=[None])

    assert Explanation.objects.filter(pk=saved.pk).values_list("details", "suggestions").get() == (
        "just a string",
        [None],
    )


def test_it_reads_a_json_string_that_looks_like_json_as_the_string(cluster):
    saved = explain(make_workload(cluster.queue_a), details="[1]", secondary=[])

    assert Explanation.objects.get(pk=saved.pk).details == "[1]"
    assert Explanation.objects.filter(pk=saved.pk).values_list("details", flat=True).get() == "[1]"
