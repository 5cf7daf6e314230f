from django.urls import reverse


def test_it_explains_a_refused_page_in_the_products_own_page(client, olivia):
    client.force_login(olivia)
    response = client.get(reverse("governance:approvals"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "Your role does not open this page." in html
    assert "Signed in as olivia" in html
    assert 'class="topbar"' in html


def test_it_answers_a_hidden_workload_with_the_products_not_found_page(client, alice, bob, cluster):
    from tests.builders import make_workload

    hidden = make_workload(cluster.queue_b, name="secret", submitted_by=bob)
    client.force_login(alice)
    response = client.get(reverse("dashboard:workload", args=[hidden.pk]))
    assert response.status_code == 404
    assert "belongs to a team you are not in" in response.content.decode()


def test_it_never_shows_the_debug_url_list_for_a_hidden_workload(client, alice, bob, cluster, settings):
    from tests.builders import make_workload

    settings.DEBUG = True  # as `make run` serves
    hidden = make_workload(cluster.queue_b, name="secret", submitted_by=bob)
    client.force_login(alice)
    response = client.get(reverse("dashboard:workload", args=[hidden.pk]))
    html = response.content.decode()
    assert response.status_code == 404
    assert "belongs to a team you are not in" in html
    assert "URLconf" not in html and "secret" not in html
