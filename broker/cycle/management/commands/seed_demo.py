"""`manage.py seed_demo [--inventory philly|alibaba-2026] [--if-empty]`: the demo cluster.

Builds the inventory from the real machine lists in settings.TRACES_DIR (see ../shared/data/traces/
README.md): Philly's 552 machines (321 × 2 GPUs of 12 GB, 231 × 8 GPUs of 24 GB = 2,490 devices) by
default, or Alibaba's 4,278 nodes (10,412 GPUs with their real model names) with
`--inventory alibaba-2026`.

The traces have no racks, so the topology is derived deterministically (broker/demo/inventory.py):
machines are grouped by type, sorted by number, 8 nodes of one type per rack, 8 racks of one type per
block, blocks round-robin into zone-a / zone-b. Philly's list has no GPU model, only memory, so its
devices are named by memory: model "gpu-12gb" / "gpu-24gb" with a `memory` attribute in GB.

Teams and queues are the Philly virtual clusters (philly_vc_nodes_heliosartifact.csv, plus the VCs
that appear only in philly.csv, with no quota), all in one cohort that lends and borrows freely; each
class's devices are shared out as quota in proportion to the VC's node count. Then the resource
classes, their priority classes and the demo logins (password = user name).

A few nodes show DRA's richer device model: four 8-GPU nodes publish each GPU whole and as MIG-style
partitions (device classes mig-1g, mig-2g; the whole GPU and its partitions consume one counter set),
and one rack's nodes carry RDMA NICs (class rdma-nic) under the PCIe roots of their GPUs. The menu
offers them as gpu-slice and networked-training, and standing requests use both (broker/demo/).

Idempotent: a second run creates nothing. `--if-empty` does nothing at all when any node exists.
"""

from django.core.management.base import BaseCommand, CommandError

from broker.demo.inventory import INVENTORIES
from broker.demo.seed import SeedConflict, seed
from broker.inventory.models import Node


class Command(BaseCommand):
    help = "Build the demo cluster from the real Philly (default) or Alibaba machine lists."

    def add_arguments(self, parser):
        parser.add_argument("--inventory", choices=INVENTORIES, default="philly")
        parser.add_argument("--if-empty", action="store_true", help="Do nothing when the database has nodes.")

    def handle(self, *args, inventory, if_empty, **options):
        if if_empty and Node.objects.exists():
            self.stdout.write("The database already has an inventory; nothing seeded.")
            return
        try:
            report = seed(inventory)
        except (SeedConflict, FileNotFoundError) as error:
            raise CommandError(str(error)) from error
        if not report.changed:
            self.stdout.write(f"The {inventory} demo is already in place; nothing changed.")
        else:
            made = ", ".join(f"{count} {what}" for what, count in report.created.items() if count)
            self.stdout.write(self.style.SUCCESS(f"Seeded the {inventory} demo: {made}."))
        self.stdout.write("Demo logins (password = user name):")
        for username, _password, what in report.logins:
            self.stdout.write(f"  {username:<16} {what}")
