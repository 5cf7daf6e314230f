from celery import shared_task

from broker.kube.applier import Applier


@shared_task(name="broker.kube.tasks.apply_outbox", ignore_result=True)
def apply_outbox():
    """Drain the outbox (bind, evict), deallocate the claims of groups that stopped, then bring every
    PodGroup's condition up to the broker's word."""
    applier = Applier()
    applier.drain()
    applier.release_claims()
    applier.write_conditions()
