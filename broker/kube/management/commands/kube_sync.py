"""Mirror a Kubernetes cluster: list, then watch, its inventory and PodGroups until stopped."""

import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from kubernetes.config import ConfigException

from broker.kube.mirror import InvalidConfiguration, topology_labels
from broker.kube.sync import RESOURCES, Sync


class Command(BaseCommand):
    help = "Mirror a Kubernetes cluster's nodes, ResourceSlices, DeviceClasses, DeviceTaintRules and PodGroups."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="List every resource once, then exit.")
        parser.add_argument("--cluster", default=None, help="The cluster's name (default: KUBE_CLUSTER_NAME).")

    def handle(self, *args, once=False, cluster=None, **options):
        if not settings.KUBE_ENABLED:
            raise CommandError("the Kubernetes bridge is off: set KUBE_ENABLED=True")
        try:
            topology_labels()
            sync = Sync(cluster)
        except (InvalidConfiguration, ConfigException) as error:
            raise CommandError(str(error)) from error
        if once:
            versions = sync.list_all()
            self.stdout.write(
                f"listed {', '.join(RESOURCE.name for RESOURCE in RESOURCES)} of {sync.cluster.name} "
                f"at resourceVersion {max(versions.values(), key=lambda v: int(v) if v.isdigit() else 0)}"
            )
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: sync.stop())
        self.stdout.write(f"syncing cluster {sync.cluster.name} from {sync.api.configuration.host}")
        sync.run()
