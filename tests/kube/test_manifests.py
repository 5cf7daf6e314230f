"""deploy/kubernetes/: every manifest loads into the official client's models, and the ClusterRole grants
exactly the verbs the sync and the applier use against the API server."""

from pathlib import Path

import pytest
import yaml

from broker.cycle.runner import run_once
from broker.kube.applier import Applier
from tests.kube.helpers import admit
from tests.kube_apiserver import as_model, same_keys, to_dict

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
MODELS = {
    "Namespace": "V1Namespace",
    "ConfigMap": "V1ConfigMap",
    "ServiceAccount": "V1ServiceAccount",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "Deployment": "V1Deployment",
    "Service": "V1Service",
}


def manifests():
    return [doc for path in sorted(DEPLOY.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind):
    return [as_model(doc, MODELS[kind]) for doc in manifests() if doc["kind"] == kind]


@pytest.mark.parametrize("doc", manifests(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_it_loads_every_manifest_into_the_clients_models(doc):
    model = as_model(doc, MODELS[doc["kind"]])
    assert same_keys(doc, to_dict(model)) == [], "fields the client's model does not know"


def test_it_runs_web_worker_beat_and_sync_under_the_brokers_service_account():
    deployments = {d.metadata.name: d for d in by_kind("Deployment")}
    assert set(deployments) == {"web", "worker", "beat", "sync"}
    (account,) = by_kind("ServiceAccount")
    for deployment in deployments.values():
        assert deployment.spec.template.spec.service_account_name == account.metadata.name
        assert deployment.spec.selector.match_labels.items() <= deployment.spec.template.metadata.labels.items()
    assert deployments["sync"].spec.template.spec.containers[0].command == ["python", "manage.py", "kube_sync"]
    assert deployments["beat"].spec.replicas == deployments["sync"].spec.replicas == 1
    (binding,) = by_kind("ClusterRoleBinding")
    (role,) = by_kind("ClusterRole")
    assert binding.role_ref.name == role.metadata.name
    assert (binding.subjects[0].name, binding.subjects[0].namespace) == (
        account.metadata.name,
        account.metadata.namespace,
    )


def granted():
    (role,) = by_kind("ClusterRole")
    return {
        (group, resource, verb)
        for rule in role.rules
        for group in rule.api_groups
        for resource in rule.resources
        for verb in rule.verbs
    }


def test_it_grants_exactly_the_verbs_the_bridge_uses(sync, lab):
    group = admit(sync, lab)  # lists every resource, runs a cycle
    applier = Applier()
    # Updates claims' status and creates bindings from the mirror; one conflict of each makes it get the
    # claim and the pod, as it does whenever the mirror is behind.
    lab.fail("PUT", "status", 409)
    lab.fail("POST", "binding", 409)
    applier.drain()
    applier.write_conditions()  # patches PodGroups' status
    from broker.kube.sync import RESOURCES

    for resource in RESOURCES:
        sync.watch_once(resource, sync.cursor(resource))
    from tests.kube import objects

    lab.create(objects.taint_rule("broken", pool="k0"))
    sync.list_all()
    run_once()  # the cycle evicts the group from the tainted device
    assert applier.drain()  # creates evictions
    assert group.workload_id
    used = lab.verbs()
    assert used == granted()
