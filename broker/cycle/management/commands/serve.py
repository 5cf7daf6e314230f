"""`manage.py serve [--port 8000] [--host 127.0.0.1]`: the ASGI app under daphne, plus, on the embedded
default (CYCLE_MODE=inprocess), the background runner: Philly trace replay, simulated executor and a
scheduling cycle every CYCLE_INTERVAL_SECONDS. In celery mode it only serves: beat and the workers run
cycles, the executor and (with DEMO_REPLAY on) the replay.
"""

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve the app with daphne; on the embedded default also run the scheduling loop and demo replay."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-runner", action="store_true", help="Serve only; run no cycles here.")
        parser.add_argument("--no-replay", action="store_true", help="Run cycles but replay no trace.")

    def handle(self, *args, host, port, no_runner, no_replay, **options):
        # daphne.server installs Twisted's asyncio reactor on import; import it before anything else uses Twisted.
        from daphne import server as daphne_server
        from daphne.endpoints import build_endpoint_description_strings

        from broker import live
        from broker.asgi import application
        from broker.cycle import embedded

        background = None
        if settings.CYCLE_MODE == "inprocess" and not no_runner:
            replay = None
            if not no_replay:
                from broker.cycle.replay import PhillyReplay

                replay = PhillyReplay.resume()
            live.bind_event_loop(daphne_server.twisted_loop)
            background = embedded.Runner(replay=replay)
            background.start()
            what = "cycles, simulated executor" + ("" if no_replay else ", Philly replay")
            self.stdout.write(f"In-process runner started ({what}) every {settings.CYCLE_INTERVAL_SECONDS}s.")
        else:
            self.stdout.write(f"CYCLE_MODE={settings.CYCLE_MODE}: Celery beat and workers run the cycles.")
        self.stdout.write(f"Serving on http://{host}:{port}/ (Ctrl-C to stop)")
        app = ASGIStaticFilesHandler(application) if settings.DEBUG else application
        try:
            daphne_server.Server(
                application=app,
                endpoints=build_endpoint_description_strings(host=host, port=port),
                signal_handlers=True,
                action_logger=None,
            ).run()
        finally:
            if background is not None:
                background.stop()
                background.join(timeout=10)
