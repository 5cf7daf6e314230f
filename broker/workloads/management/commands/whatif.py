"""`manage.py whatif SCENARIO.yaml [--json]`: one cycle of the real decision core on a YAML cluster.

Touches no database. The scenario format is broker/scheduler/scenario.py's (issue 3); a missing file,
bad YAML or a malformed scenario is one line on stderr and exit code 2.
"""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from broker.scheduler.cycle import decide
from broker.scheduler.scenario import ScenarioError, load_scenario, result_table, result_to_json


class Command(BaseCommand):
    help = "Run one scheduling cycle on a what-if scenario file (no database) and print the decisions."
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("scenario", help="path to a scenario YAML file")
        parser.add_argument("--json", action="store_true", help="print the decisions as JSON")

    def handle(self, *args, **options):
        path = Path(options["scenario"])
        try:
            snapshot = load_scenario(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise CommandError(f"{path}: cannot read the scenario: {error.strerror or error}", returncode=2) from None
        except (ScenarioError, UnicodeDecodeError) as error:
            raise CommandError(f"{path}: {error}", returncode=2) from None
        result = decide(snapshot)
        if options["json"]:
            self.stdout.write(json.dumps(result_to_json(snapshot, result), indent=2))
        else:
            self.stdout.write(result_table(snapshot, result))
