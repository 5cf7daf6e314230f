import re

import yaml
from django.core.management import call_command


def test_it_serves_an_openapi_3_schema(db, api_client):
    response = api_client.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    assert schema["openapi"].startswith("3.")
    assert "/api/workloads/{id}/approve/" in schema["paths"]
    assert "/api/audit-events/export/" in schema["paths"]
    assert "post" not in schema["paths"]["/api/audit-events/"]


def test_it_generates_the_schema_without_warnings(db, tmp_path):
    # --fail-on-warn turns every drf-spectacular warning (an untyped field, an unnamed enum) into an error.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert "Capacity Broker API" in (tmp_path / "schema.yaml").read_text()


def test_it_serves_swagger_ui_from_local_static_files(db, api_client):
    response = api_client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any("drf_spectacular_sidecar/swagger-ui-dist" in source for source in sources), sources
    assert all(not source.startswith(("http://", "https://", "//")) for source in sources), sources
    assert "cdn" not in html.lower()


def test_it_issues_a_token_that_authenticates(db, cluster, alice, api_client):
    response = api_client.post("/api/auth/token/", {"username": "alice", "password": "password"})
    assert response.status_code == 200
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {response.data['token']}")
    assert api_client.get("/api/status/").status_code == 200
    api_client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    refused = api_client.get("/api/status/")
    # Session authentication comes first and sends no WWW-Authenticate challenge, so DRF answers 403.
    assert (refused.status_code, str(refused.data["detail"])) == (403, "Invalid token.")


def test_it_refuses_an_unknown_schema_format_in_json_naming_each_format_once(db, api_client):
    response = api_client.get("/api/schema/?format=xml")
    assert response.status_code == 400
    assert response["Content-Type"].endswith("json")
    assert response.json() == {"format": ["Unknown format; one of: yaml, json."]}
    assert api_client.get("/api/schema/?format=json").json()["openapi"].startswith("3.")
