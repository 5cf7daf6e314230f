"""`manage.py prune_history [--dry-run]`: the retention pass that Celery beat runs daily, by hand.

Removes scheduling cycles older than CYCLE_RETENTION_DAYS and the history of workloads that ended more
than HISTORY_RETENTION_DAYS ago (broker/cycle/retention.py), and says how many rows went. A bad argument
is one line on stderr and exit code 2; a bad retention setting, one line and exit code 1.
"""

import argparse

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from broker.cycle import retention


def days(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of days, 0 or more (0 keeps forever), not {text!r}")
    return value


def batch_size(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number, 1 or more, not {text!r}")
    return value


class Command(BaseCommand):
    help = "Remove old scheduling cycles and the history of long-finished workloads (what beat does daily)."

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # argparse prints its usage block before the error; one line is easier to read in a cron mail.
        if parser.called_from_command_line:
            parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message}\n")
        return parser

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
        parser.add_argument(
            "--cycle-days", type=days, metavar="DAYS", help="keep cycles this many days (default: CYCLE_RETENTION_DAYS)"
        )
        parser.add_argument(
            "--history-days",
            type=days,
            metavar="DAYS",
            help="keep finished workloads' history this many days (default: HISTORY_RETENTION_DAYS)",
        )
        parser.add_argument(
            "--batch-size", type=batch_size, default=retention.BATCH_SIZE, help="ids per transaction (%(default)s)"
        )

    def handle(self, *args, **options):
        now = timezone.now()
        cycle_days, cycle_source = self.period(options["cycle_days"], "CYCLE_RETENTION_DAYS", "--cycle-days")
        history_days, history_source = self.period(options["history_days"], "HISTORY_RETENTION_DAYS", "--history-days")
        dry_run = options["dry_run"]
        try:
            counts = retention.prune_history(
                now, cycle_days=cycle_days, history_days=history_days, dry_run=dry_run, batch_size=options["batch_size"]
            )
        except retention.RetentionError as error:
            raise CommandError(str(error)) from None
        verb = "would remove" if dry_run else "removed"
        if dry_run:
            self.stdout.write("Dry run: nothing was changed.")
        if cycle_days:
            self.stdout.write(
                f"Scheduling cycles: {verb} {counts['cycles']:,} started before {stamp(now, cycle_days)} "
                f"({cycle_source}={cycle_days}; the latest are kept), clearing {counts['cycle_references']:,} "
                "references to them."
            )
        else:
            self.stdout.write(f"Scheduling cycles: all kept ({cycle_source}=0).")
        if history_days:
            self.stdout.write(
                f"Finished workloads' history: {verb} {counts['explanation_changes']:,} explanation changes and "
                f"{counts['workload_transitions']:,} state transitions of workloads that ended before "
                f"{stamp(now, history_days)} ({history_source}={history_days})."
            )
        else:
            self.stdout.write(f"Finished workloads' history: all kept ({history_source}=0).")

    @staticmethod
    def period(option, setting, flag):
        if option is None:
            return getattr(settings, setting), setting
        return option, flag


def stamp(now, days):
    return timezone.localtime(retention.cutoff(now, days)).strftime("%Y-%m-%d %H:%M %Z")
