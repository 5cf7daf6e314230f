"""Declarative API test cases (NetBox's APIViewTestCases, as pytest): a class per model names its URL,
how to build one object, good and bad create data, an update, and who may write; the mixin turns that
into list / detail / create / update / delete / bad-input / refused-writer tests."""

from django.conf import settings

from broker.audit.models import AuditEvent
from broker.inventory.models import ClusterState

PERSONAS = ("alice", "bob", "olivia", "fiona", "april", "adam")
OPERATORS = {"olivia", "adam"}


def generation():
    return ClusterState.current_generation(settings.CLUSTER_NAME)


def signed_in(client, user):
    client.force_authenticate(user)
    return client


def persona(request, name):
    """A named persona's user, or None for the anonymous visitor."""
    return None if name == "anonymous" else request.getfixturevalue(name)


def detail_url(url, pk):
    return f"{url}{pk}/"


class ModelAPITests:
    model = None
    url = None
    writers = OPERATORS
    reader = "alice"

    def make_object(self, cluster):
        raise NotImplementedError

    def create_data(self, cluster, n):
        raise NotImplementedError

    def update_data(self, cluster):
        """A PATCH body; every key must read back as written."""
        raise NotImplementedError

    def bad_create_data(self, cluster):
        """[(body, {fields that must carry an error})]."""
        raise NotImplementedError

    @property
    def model_name(self):
        return self.model._meta.model_name

    def test_it_lists(self, cluster, api_client, request):
        self.make_object(cluster)
        response = signed_in(api_client, persona(request, self.reader)).get(self.url)
        assert response.status_code == 200
        assert response.data["count"] == self.model.objects.count()
        assert len(response.data["results"]) == min(self.model.objects.count(), 50)

    def test_it_shows_one(self, cluster, api_client, request):
        obj = self.make_object(cluster)
        response = signed_in(api_client, persona(request, self.reader)).get(detail_url(self.url, obj.pk))
        assert response.status_code == 200
        assert response.data["id"] == obj.pk

    def test_it_creates(self, cluster, api_client, request):
        for n, writer in enumerate(sorted(self.writers)):
            count, before_generation = self.model.objects.count(), generation()
            response = signed_in(api_client, persona(request, writer)).post(
                self.url, self.create_data(cluster, n), format="json"
            )
            assert response.status_code == 201, response.data
            assert self.model.objects.count() == count + 1
            event = AuditEvent.objects.get(action=f"{self.model_name}.create", target_id=str(response.data["id"]))
            assert event.actor_name == writer
            assert event.after["id"] == response.data["id"]
            assert generation() == before_generation + 1

    def test_it_updates(self, cluster, api_client, olivia):
        obj = self.make_object(cluster)
        changes = self.update_data(cluster)
        response = signed_in(api_client, olivia).patch(detail_url(self.url, obj.pk), changes, format="json")
        assert response.status_code == 200, response.data
        for field, value in changes.items():
            assert response.data[field] == value
        event = AuditEvent.objects.get(action=f"{self.model_name}.update", target_id=str(obj.pk))
        assert event.before != event.after

    def test_it_deletes(self, cluster, api_client, adam):
        obj = self.make_object(cluster)
        count = self.model.objects.count()
        response = signed_in(api_client, adam).delete(detail_url(self.url, obj.pk))
        assert response.status_code == 204
        assert self.model.objects.count() == count - 1
        assert AuditEvent.objects.filter(action=f"{self.model_name}.delete", target_id=str(obj.pk)).exists()

    def test_it_refuses_bad_input_with_field_errors(self, cluster, api_client, olivia):
        cases = self.bad_create_data(cluster)
        assert cases
        for body, fields in cases:
            count, events = self.model.objects.count(), AuditEvent.objects.count()
            response = signed_in(api_client, olivia).post(self.url, body, format="json")
            assert response.status_code == 400, (body, response.data)
            assert set(fields) <= set(response.data), (body, response.data)
            assert self.model.objects.count() == count
            assert AuditEvent.objects.count() == events

    def test_it_refuses_writes_from_non_writers(self, cluster, api_client, request):
        obj = self.make_object(cluster)
        count = self.model.objects.count()
        for name in sorted(set(PERSONAS) - set(self.writers)):
            client = signed_in(api_client, persona(request, name))
            assert client.post(self.url, self.create_data(cluster, 99), format="json").status_code == 403
            assert client.patch(detail_url(self.url, obj.pk), self.update_data(cluster)).status_code == 403
            assert client.delete(detail_url(self.url, obj.pk)).status_code == 403
        assert self.model.objects.count() == count
