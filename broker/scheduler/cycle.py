"""One scheduling cycle: `decide(snapshot) -> CycleResult`, pure and deterministic.

The steps are numbered in the comments of `Cycle.run`, as Kueue's scheduler.go numbers its own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter

from broker.scheduler import backfill, claims, explanation, group_claims, heap, preemption, sharing
from broker.scheduler.capacity import NODE_LEVEL, ROOT, Access, CapacityState, View
from broker.scheduler.failures import evictions_for, failed_devices
from broker.scheduler.ordering import FairShareOrder, ShareBook, shortest_first_key
from broker.scheduler.placement import GangPlan, PlannedPod, choose_counted, place_gang, spend
from broker.scheduler.quota import EPSILON, Consumption, QuotaTree, request_charges
from broker.scheduler.requests import Request, all_levels, approval_problem, entitlement_problem, resolve
from broker.scheduler.selectors import ClassMatcher, SelectorCache
from broker.scheduler.snapshot import (
    Admission,
    CycleResult,
    PendingDecision,
    PodPlacement,
    Preemption,
    RunningWorkload,
    Snapshot,
    made,
)
from broker.scheduler.windows import Window, future_windows

NOMINATED = "nominated:"  # slot holder prefix for devices held for a nominated preemptor
LARGE_GANG_TRIES = 3  # of the oldest large gangs, how many per protected one may be tried
NOTHING: frozenset = frozenset()


def decide(snapshot: Snapshot, on_admission: Callable[[Admission], None] | None = None) -> CycleResult:
    """Admissions, preemptions and an explanation for every pending workload not admitted.

    `on_admission`, if given, is called with each admission as the cycle makes it, in the order made.
    An admission is final once made (nothing later in the cycle takes it back, and the result holds it
    as it was passed), so a caller may start writing it while the cycle goes on deciding."""
    with heap.collector_paused():  # its objects all live until it ends (heap.py)
        cycle = Cycle(snapshot, on_admission)
        result = cycle.run()
        cycle.state.retire()
        return result


def warm(snapshot: Snapshot) -> None:
    """What a process that decides does before its first cycle: decide once on `snapshot` (the result
    is dropped) and make what later cycles make on first use and then keep for the same inventory: its
    index and records (as `decide` leaves them) and the cluster as built, which explanations ask for
    when a request could never run (0.5 s at 325,000 devices, else paid by the first cycle that asks)."""
    with heap.collector_paused():
        cycle = Cycle(snapshot)
        cycle.run()
        cycle.empty_state()
        cycle.state.retire()


@dataclass
class Outcome:
    """What the cycle did with one request that was not admitted (explanations read it)."""

    request: Request
    victims: tuple = ()
    waiting_for_evictions: tuple = ()
    protected: bool = False
    unprotectable: bool = False  # no protection could be planned for it (or its quota rules one out)
    victim_scope: tuple = ()  # the domain its victims make room in
    # (device class, devices) a several-request claim's plan would have charged past its queue's quota:
    # what an All request or a larger firstAvailable way takes is known only once it is placed.
    quota_short: tuple = ()


@dataclass
class CycleLog:
    cluster_order: list = field(default_factory=list)
    admitted: dict = field(default_factory=dict)
    admitted_plans: dict = field(default_factory=dict)
    # Each admission's expected duration, in the order of `admitted`: read while its request is at hand
    # (the release timeline wants them all, and finding them again later costs a cache miss or three each).
    admitted_durations: list = field(default_factory=list)
    outcomes: dict = field(default_factory=dict)
    invalid: dict = field(default_factory=dict)
    preemptions: list = field(default_factory=list)


class Cycle:
    """State shared by the steps of one cycle (and by explanation, preemption and backfill)."""

    def __init__(self, snapshot: Snapshot, on_admission: Callable[[Admission], None] | None = None):
        self.snapshot = snapshot
        self.on_admission = on_admission
        self.config = snapshot.config
        self.matcher = ClassMatcher(snapshot.device_classes)
        self.selectors = SelectorCache()
        self._ledger: sharing.Ledger | None = None
        self.class_names = tuple(sorted(device_class.name for device_class in snapshot.device_classes))
        self.lookups = {
            "queues": {queue.name: queue for queue in snapshot.queues},
            "resource_classes": {rc.name: rc for rc in snapshot.resource_classes},
            "device_classes": {dc.name: dc for dc in snapshot.device_classes},
            "levels": all_levels(snapshot),
        }
        self.running = {workload.id: workload for workload in snapshot.running}
        self.log = CycleLog()
        # Gangs ahead in line whose planned start work behind them may not delay, first in line first.
        self.protections: list[backfill.Protection] = []
        self._excluded_unions: dict[tuple, frozenset] = {}
        self._excluded_memo: dict = {}  # see excluded_for and _new_marks
        self._marks: list | None = None
        self._marked = -1  # how many protections `_marks` counts
        self._now = snapshot.now
        self._protected_ids: set[str] = set()
        # Of those, the oldest large gangs, protected before anything else is decided (_protect_oldest_gangs).
        self.protected_first: set[str] = set()
        self.windows: list[Window] = []
        self._failed: set = set()
        self._extras_cache: dict = {}
        self._access_keys: dict = {}
        self._empty_state: CapacityState | None = None
        self._hopeless: set = set()  # see _hopeless_key
        self.group_candidates: dict = {}  # see group_claims.class_slots
        self._hopeless_demands: set = set()  # ids of the demands tuples of those keys (held by requests)
        self.chosen_victims: set[str] = set()
        # Of those, the ones that only lose pods (they run on): the pods they give up, by `leaving_id`,
        # released now in the release timeline as whole victims are.
        self.leaving: dict[str, RunningWorkload] = {}
        self.preemption_failed: set = set()
        self.victim_index = None
        self.preemptions_by_queue: dict[str, int] = {}
        self.simulated_class: dict[str, str] = {}
        self.simulated_plans: dict[str, GangPlan] = {}

    # --- the cycle ---

    def run(self) -> CycleResult:
        # 1. Index the snapshot: classes per distinct device description, free counts per node and
        #    domain, devices held by running work, reservations materialised on concrete devices.
        self.state = CapacityState.for_cycle(self.snapshot, self.matcher, self.class_names)
        # 1b. Running work on failed devices is evicted, and seen as evicting from here on.
        self.evictions = self._evict_from_failed_devices()
        # 1c. Reservation windows opening later, and the nodes they will take (Slurm's rule).
        self.windows = future_windows(self.state, self.snapshot) if self.config.reservations_ahead else []
        # Reserved and tainted devices are never plain: the extras hold all of them.
        self.reserved_teams = frozenset(slot.owner for slot in self.state.extras if slot.owner is not None)
        self.has_taints = any(slot.taints for slot in self.state.extras)
        # 2. Charge running workloads (evicting ones too: they still hold devices) to quota and fair share,
        #    summed per queue and class first (usage is a sum, so the totals are what each charge adds up to).
        self.quota = QuotaTree(self.snapshot.queues, self.snapshot.cohorts)
        self.book = ShareBook(self.snapshot.queues, self._class_capacity())
        # By what each device's allocation consumes (a partition its share of the GPU, a time-slice its
        # share of the capacity), each device under the class it was allocated with.
        self.consumption = consumption = Consumption.of_snapshot(self.snapshot)
        charges: dict[tuple, float] = {}
        if consumption.whole and not any(workload.device_classes for workload in self.snapshot.running):
            for workload in self.snapshot.running:  # sums: the order cannot change them (but for rounding)
                key = (workload.queue, workload.device_class)
                charges[key] = charges.get(key, 0) + workload.device_count
        else:
            for workload, charged in consumption.of_every_running(self.snapshot.running):
                for device_class, amount in charged.items():
                    key = (workload.queue, device_class)
                    charges[key] = charges.get(key, 0) + amount
        for (queue, device_class), amount in charges.items():
            self._charge(queue, device_class, amount)
        # 3. Resolve pending workloads against the policy (the impossible ones are InvalidRequest), each
        #    at its turn in step 4: the first admission is then made before the last of 20,000 requests
        #    is resolved, and its writes can start (broker.cycle.admissions). Those whose devices are held
        #    or being freed go first, as the nominations and the victim index ask after them.
        by_queue: dict[str, list] = {}  # each queue's in its own order (FairShareOrder sorts them)
        for workload in self.snapshot.pending:
            by_queue.setdefault(workload.queue, []).append(workload)
        self.requests: dict[str, Request] = {}
        self._shapes: dict = {}
        self._own_answers = {w.evicted_for for w in self.snapshot.running if w.evicting and w.evicted_for}
        self._own_answers.update(w.id for w in self.snapshot.pending if w.nominated_devices)
        own_answers = self._own_answers
        self._own_nodes = self._nodes_freed_for(own_answers) if own_answers else {}
        for workload in sorted((w for w in self.snapshot.pending if w.id in own_answers), key=_by_id):
            self._resolve(workload)
        # 3b. Devices a preemptor's victims freed are held for it until its turn (its nomination).
        self._hold_nominated()
        # 3c. The oldest large gangs keep a planned start wherever they stand in line.
        self._protect_oldest_gangs()
        # 4. Order: fair share between queues (recomputed after each admission), then priority, then age.
        #    A workload that cannot be resolved takes no share and no position: the order goes on as if
        #    it were not there.
        requests = self.requests
        resolve_now = self._resolve
        in_order = self.log.cluster_order.append
        outcomes = self.log.outcomes
        nominated = self.nominated  # emptied, never replaced, as nominees take their turns
        hopeless_demands = self._hopeless_demands  # cleared, never replaced, by _release_nominated
        aging = self.config.shortest_first_aging_seconds
        within_queue = shortest_first_key(self.snapshot.now, aging) if aging else None
        for workload in FairShareOrder(by_queue, self.book, within_queue):
            request = requests.get(workload.id) or resolve_now(workload)
            if request is None:
                continue
            request_id = request.id
            in_order(request_id)
            if nominated:
                self._release_nominated(request_id)
            # Workloads of one shape share their demands tuple: a cheap first test before the full key.
            if id(request.demands) in hopeless_demands and self._hopeless_key(request) in self._hopeless:
                outcomes[request_id] = Outcome(request)
                continue
            # 5. Gates, quota and a placement of the whole gang, first device class that works.
            if not self._admit(request):
                # 6. No room: look for the cheapest victims, else keep a place for the head of the line.
                hopeless = self._hopeless_key(request)
                self._after_failure(request)
                if hopeless is not None and self._failed_outright(request):
                    self._hopeless.add(hopeless)
                    self._hopeless_demands.add(id(request.demands))
        # 7. Explain every workload not admitted, against the state at the end of the cycle.
        pending = explanation.explain_all(self, rerun=decide)
        # 8. Assemble the result in a stable order.
        return CycleResult(
            admissions=tuple(self.log.admitted[key] for key in sorted(self.log.admitted)),
            preemptions=tuple(sorted(self.log.preemptions, key=lambda p: (p.victim_id, p.preemptor_id))),
            pending=tuple(sorted(pending, key=_by_workload_id)),
            evictions=tuple(self.evictions),
        )

    def _evict_from_failed_devices(self) -> list:
        """Evictions of the running work on failed devices (see broker.scheduler.failures); the snapshot
        and `running` then hold it as evicting for nobody, and the devices of pods that leave a shrunk
        workload are held under their own record's id, as the loader would give them next cycle."""
        failed = failed_devices(self.snapshot)
        if not failed:
            return []
        slots, running = self.state.slot_by_id, self.running
        hits: dict[str, list[str]] = {}
        shared = False
        for device_id in failed:
            slot = slots.get(device_id)
            workload = running.get(slot.holder) if slot is not None and slot.holder is not None else None
            if workload is None:
                continue
            # Held by a share (broker.scheduler.sharing): other sharers may be beside the one the state names.
            shared = shared or any(pod.consumed and device_id in pod.device_ids for pod in workload.pods)
            if not workload.evicting and workload.part_of is None:
                hits.setdefault(workload.id, []).append(device_id)
        if shared:
            # Every running pod that takes a share of a failed device leaves too (a pass over running
            # work only when a failed device is shared, which work held alone never is).
            failed_ids = set(failed)
            for workload in self.snapshot.running:
                if workload.evicting or workload.part_of is not None:
                    continue
                for pod in workload.pods:
                    if pod.consumed:
                        for device_id in pod.device_ids:
                            if device_id in failed_ids and device_id not in hits.get(workload.id, ()):
                                hits.setdefault(workload.id, []).append(device_id)
        if not hits:
            return []
        evictions, records = evictions_for(hits, running, failed)
        replaced = {}
        journal = self.state._journal
        for records_of_one in records:
            for record in records_of_one:
                replaced[record.workload_id if record.part_of is None else record.part_of] = records_of_one
                running[record.id] = record
                if record.part_of is not None:
                    for pod in record.pods:
                        for device_id in pod.device_ids:
                            slot = slots[device_id]
                            if journal is not None:
                                journal.append((slot, slot.holder))
                            slot.holder = record.id
        swapped = []
        for workload in self.snapshot.running:
            swapped.extend(replaced.get(workload.id, (workload,)))
        self.snapshot = replace(self.snapshot, running=tuple(swapped))
        return evictions

    def _resolve(self, workload) -> Request | None:
        """The workload's Request, kept in `requests`; None when it can never run (logged invalid)."""
        resolved = resolve(workload, self.snapshot, self.lookups, self._shapes)
        if isinstance(resolved, str):
            self.log.invalid[workload.id] = resolved
            return None
        self.requests[workload.id] = resolved
        return resolved

    def _nodes_freed_for(self, workload_ids) -> dict[str, frozenset]:
        """Workload id -> the nodes of the devices being evicted for it or nominated to it. Its victims
        were chosen before any gang protected this cycle held those nodes: they stay open to it."""
        slots = self.state.slot_by_id
        nodes: dict[str, set] = {}
        for workload in self.snapshot.running:
            if workload.evicting and workload.evicted_for in workload_ids:
                here = nodes.setdefault(workload.evicted_for, set())
                here.update(slots[d].node for pod in workload.pods for d in pod.device_ids if d in slots)
        for workload in self.snapshot.pending:
            if workload.nominated_devices:
                here = nodes.setdefault(workload.id, set())
                here.update(slots[d].node for d in workload.nominated_devices if d in slots)
        return {workload_id: frozenset(found) for workload_id, found in nodes.items()}

    def _hold_nominated(self) -> None:
        """Free devices named in a pending workload's `nominated_devices` are held for it (first
        nominee wins a device named twice), so work ordered before it cannot take what its victims
        freed; `_release_nominated` gives them back at its turn."""
        self.nominated: dict[str, list] = {}
        slots = self.state.slot_by_id
        nominees = [workload for workload in self.snapshot.pending if workload.nominated_devices]  # few or none
        for workload in sorted(nominees, key=_by_id):
            if workload.id not in self.requests:
                continue
            held = {}
            for device_id in workload.nominated_devices:
                slot = slots.get(device_id)
                if slot is not None and slot.holder is None:
                    held[device_id] = slot
            if held:
                held = list(held.values())
                self.state.hold(held, NOMINATED + workload.id)
                self.nominated[workload.id] = held

    def _protect_oldest_gangs(self) -> None:
        """Plan a start and domain for the oldest waiting gangs of at least `large_gang_devices` devices,
        before anything is admitted. Protection in line order reaches only the first few blocked
        workloads; with shortest-first order a large gang sits behind every short job of its queue, never
        gets there, and the racks it waits for keep being refilled (by admissions and by preemptors alike)
        until it has waited for hours. Held from the start of the cycle, its domain takes only work that
        ends before its planned start, whatever that work's place in line."""
        count = self.config.protected_large_gangs
        if count <= 0 or not self.config.enable_backfill_protection:
            return
        least = self.config.large_gang_devices
        large = []
        for workload in self.snapshot.pending:
            devices = 0
            for pod_set in workload.pod_sets:
                per_pod = pod_set.devices_per_pod
                if pod_set.requests:  # a several-request claim: the fewest devices its requests do with
                    per_pod = claims.Claim(pod_set.requests).fewest_devices()
                devices += pod_set.gang_size * per_pod
            if devices >= least:
                large.append(workload)
        large.sort(key=_by_age)
        # The oldest `count` that get a planned start: one whose start cannot be planned (no expected
        # end in reach) leaves its place to the next, as Slurm's backfill reserves for the first jobs
        # that can have a reservation. Tries are bounded: each can walk every domain's ends.
        for workload in large[: count * LARGE_GANG_TRIES]:
            if len(self.protected_first) >= count:
                break
            request = self.requests.get(workload.id) or self._resolve(workload)
            if request is None or self.gate_problem(request) or not self.entitled_classes(request):
                continue
            protection = backfill.plan_protection(self, request, every_domain=True)
            if protection is not None:
                self.protections.append(protection)
                self._protected_ids.add(protection.workload_id)
                self.protected_first.add(protection.workload_id)

    def _release_nominated(self, workload_id: str) -> None:
        held = self.nominated.pop(workload_id, None)
        if held:
            self.state.release(held)
            # Free capacity grew: forget the placement failures memoised so far.
            self._failed.clear()
            self.preemption_failed.clear()
            self._hopeless.clear()
            self._hopeless_demands.clear()

    def _hopeless_key(self, request: Request) -> tuple | None:
        """Everything steps 5 and 6 read of a request, for remembering that requests like it got
        nothing (no placement, no victims, no protection). During a cycle free devices, quota headroom
        and victims only run out (until a nomination is released, which forgets), so the next such
        request would get nothing too: on a long queue most of it is a few shapes that cannot run.
        None for a workload devices are held or being freed for: its answer is its own."""
        if request.id in self._own_answers or request.shared_amounts is not None or request.workload.group_claims:
            return None
        queue = request.queue
        workload = request.workload
        at_limit = self.preemptions_by_queue.get(queue.name, 0) >= self.config.preemptions_per_queue_per_cycle
        return (
            request.classes, request.demands, request.required, request.preferred, queue.name, request.team,
            request.preemptible, request.tolerations, workload.priority, workload.preemption_policy,
            workload.submitted if queue.within_queue == "LowerOrNewerEqualPriority" else None,
            self.excluded_for(request), at_limit,
            # ShorterRemaining's victims depend on its expected duration (preemption.find_victims).
            workload.expected_duration if self.config.shorter_remaining_factor else None,
            # Whether it has waited long enough to be protected without known durations (backfill).
            self.snapshot.now - workload.submitted >= self.config.backfill_wait_seconds,
        )  # fmt: skip

    def _failed_outright(self, request: Request) -> bool:
        outcome = self.log.outcomes.get(request.id)
        return (
            outcome is not None
            and not outcome.victims
            and not outcome.waiting_for_evictions
            and not outcome.protected
            # Until enough gangs are protected, the next may be; not one like it whose protection could
            # not be planned (the nodes held ahead only grow, and its wait is in the key).
            and (not self._protects_more() or not self.config.enable_backfill_protection or outcome.unprotectable)
        )

    @property
    def protection(self) -> backfill.Protection | None:
        """The first protected gang in line (the head), None when none is."""
        return self.protections[0] if self.protections else None

    def _protects_more(self) -> bool:
        in_line = len(self.protections) - len(self.protected_first)
        return in_line < max(1, self.config.backfill_depth)

    def quota_need(self, request: Request) -> float:
        """The least quota `request` can be charged (broker.scheduler.quota.Consumption): its device
        count, times the smallest share a device counts for when partitions or shared devices exist
        (for a time-sliced request, the smallest fraction of a shared device's capacity its amounts take),
        and its group claims' fewest devices, charged once with it."""
        consumption = self.consumption
        if consumption.whole and request.shared_amounts is None:
            return request.quota_needed
        group = (request.quota_needed - request.needed) * consumption.smallest
        if request.shared_amounts is not None:
            fractions = [
                max((amount / capacity[name] for name, amount in request.shared_amounts.items() if capacity.get(name)),
                    default=1.0)
                for capacity in consumption.capacities.values()
            ]  # fmt: skip
            return request.needed * min(1.0, min(fractions, default=1.0)) + group
        return request.needed * consumption.smallest + group

    def _charge(self, queue: str, device_class: str, amount: int) -> None:
        self.quota.add_usage(queue, device_class, amount)
        self.book.add(queue, device_class, amount)

    def _class_capacity(self) -> dict[str, int]:
        return dict(zip(self.class_names, self.state.class_devices, strict=True))

    # --- step 5 ---

    def gate_problem(self, request: Request) -> str | None:
        return entitlement_problem(request) or approval_problem(request)

    def _admit(self, request: Request) -> bool:
        if self.gate_problem(request):
            self.log.outcomes[request.id] = Outcome(request)
            return False
        excluded = self.excluded_for(request)
        quota = self.quota
        queue = request.queue.name
        needed = request.needed
        if request.workload.group_claims:
            return self._admit_grouped(request, excluded)
        if request.claimed:
            return self._admit_claim(request, excluded)
        if request.shared_amounts is not None:
            return self._admit_shared(request, excluded)
        consumption = self.consumption
        # Partitions count for their share of a GPU: the least a request can be charged is its device
        # count times the smallest share; its plan's own charge is checked once made.
        least = needed if consumption.whole else needed * consumption.smallest
        for class_name in request.classes:
            available = quota.available(queue, class_name)
            if available is not None and least > available + EPSILON:
                continue
            plan = self.find_plan(request, class_name, excluded=excluded)
            if plan is None:
                continue
            if consumption.whole:
                if not request.simple:  # a simple gang has no optional pods: its plan is what quota allowed
                    plan = _trim_to_quota(plan, request, available)
            elif available is not None:
                plan = _trim_to_quota(plan, request, available, consumption)
                if consumption.of_devices([slot.id for slot in plan.slots()]) > available + EPSILON:
                    continue
            self._commit(request, class_name, plan)
            return True
        self.log.outcomes[request.id] = Outcome(request)
        return False

    def _admit_claim(self, request: Request, excluded: frozenset) -> bool:
        """Several-request claims. The admission is recorded under the class of the first request's way
        (the GPUs of "8 GPUs and a NIC"), and each request's devices count against its own class's quota
        (Admission.request_classes), as the running workload it becomes is counted in every later cycle
        (RunningWorkload.device_classes); a plan over any class's quota waits, its optional pods too."""
        plan = self.find_plan(request, request.classes[0], excluded=excluded)
        short = ()
        if plan is not None:
            class_name = plan.pods[0].requests[0][1]
            queue = request.queue.name
            charges = request_charges(plan.pods, self.consumption, class_name)
            for device_class, amount in charges.items():
                available = self.quota.available(queue, device_class)
                if available is not None and amount > available + EPSILON:
                    short = (device_class, amount)
                    break
            else:
                self._commit(request, class_name, plan)
                return True
        self.log.outcomes[request.id] = Outcome(request, quota_short=short)
        return False

    def _admit_grouped(self, request: Request, excluded: frozenset) -> bool:
        """A gang with group claims (broker.scheduler.group_claims): its claims' devices count once,
        with its pods', against the quota of the class it is admitted with; optional pods above its
        gang minimum are dropped to fit the quota, never the claims' devices."""
        classes = request.classes[:1] if request.claimed else request.classes
        for class_name in classes:
            available = self.quota.available(request.queue.name, class_name)
            if available is not None and request.quota_needed > available and not request.claimed:
                continue
            plan = self.find_plan(request, class_name, excluded=excluded)
            if plan is None:
                continue
            if request.claimed:
                class_name = plan.pods[0].requests[0][1]
            available = self.quota.available(request.queue.name, class_name)
            if available is not None:
                plan = _trim_to_quota(plan, request, available - plan.group_count())
                if sum(len(pod.slots) for pod in plan.pods) + plan.group_count() > available:
                    continue
            self._commit(request, class_name, plan)
            return True
        self.log.outcomes[request.id] = Outcome(request)
        return False

    def grouped_plan(self, request: Request, class_name: str, access: Access, excluded=frozenset()):
        return group_claims.GroupPlacer(self, request, access, excluded).place(class_name)

    def group_why_not(self, request: Request) -> tuple[str, str]:
        """(reason code, message): why a gang with group claims finds no place now, naming the claim."""
        placer = group_claims.GroupPlacer(self, request, request.default_access, NOTHING)
        return placer.why_not(request.classes[0])

    @property
    def ledger(self) -> sharing.Ledger:
        """What is left on devices several allocations may share; made at the first time-sliced request
        (a cycle without one never looks at them)."""
        if self._ledger is None:
            self._ledger = sharing.Ledger(self.snapshot, self.state)
        return self._ledger

    def _admit_shared(self, request: Request, excluded: frozenset) -> bool:
        """A time-sliced request: its devices' capacity amounts come from the ledger; idle devices it
        takes leave the free pool (held by it), shared ones stay where they are."""
        consumption = self.consumption
        for class_name in request.classes:
            available = self.quota.available(request.queue.name, class_name)
            # A share counts for what it takes of a device: checked on the plan, by its own charge.
            plan = self.find_plan(request, class_name, excluded=excluded)
            if plan is None:
                continue
            consumed = tuple(sorted(request.shared_amounts.items()))
            if available is not None:
                plan = _trim_to_quota(plan, request, available, consumption, consumed)
                if consumption.of_devices([slot.id for slot in plan.slots()], consumed) > available + EPSILON:
                    continue
            slots = [slot for pod in plan.pods for slot in pod.slots]
            self.state.hold(self.ledger.commit(slots, request.shared_amounts), request.id)
            node_names = self.state.node_names
            pods = tuple(
                made(PodPlacement, pod_set=pod.pod_set, index=pod.index, node=node_names[pod.node],
                     device_ids=tuple(slot.id for slot in pod.slots), requests=(), consumed=consumed)
                for pod in sorted(plan.pods, key=_pod_order)
            )  # fmt: skip
            self._charge(request.queue.name, class_name, self.consumption.of_devices([s.id for s in slots], consumed))
            admission = made(
                Admission, workload_id=request.id, device_class=class_name, pods=pods, domain=self.common_domain(plan),
                request_classes=(), group_requests=(),
            )  # fmt: skip
            # Not among admitted_plans: a simulated end of it must not free devices others share.
            self.log.admitted[request.id] = admission
            self.log.admitted_durations.append(request.workload.expected_duration)
            if self.on_admission is not None:
                self.on_admission(admission)
            return True
        self.log.outcomes[request.id] = Outcome(request)
        return False

    def shared_plan(self, request: Request, class_name: str, access: Access, excluded=frozenset(), leaving=()):
        """A time-sliced request's plan; with `leaving` (running records), as if those had left."""
        levels = self.state.levels
        ledger = self.ledger.without(leaving) if leaving else self.ledger
        return sharing.place_shared(
            self.state, ledger, self.state.class_index[class_name], request.demands, request.shared_amounts,
            access, levels.index(request.required) if request.required else None, excluded,
            frozenset(workload.id for workload in leaving),
        )  # fmt: skip

    def freed_view(self, class_name: str, access: Access, excluded, freed=(), credit=None) -> View:
        """`view`, with the devices of `freed` ((rank, slot) of any class) that are of this class counted
        free too, and `credit` (counter position -> amount) given back: what preemption victims leave."""
        if not freed and credit is None:
            return self.view(class_name, access, excluded)
        class_index = self.state.class_index[class_name]
        view = self.view(class_name, access, excluded, [entry for entry in freed if class_index in entry[1].classes])
        if credit is not None:
            view.counter_credit = credit
        return view

    def claim_plan(
        self, request: Request, access: Access, excluded=frozenset(), freed=(), credit=None
    ) -> GangPlan | None:
        """A several-request claim's plan; with `freed` and `credit` as `freed_view` takes them."""
        state = self.state
        views = {name: self.freed_view(name, access, excluded, freed, credit) for name in request.classes}
        levels = state.levels
        planner = claims.Planner(state, views, request.demands, self.selectors)
        return planner.place(
            levels.index(request.required) if request.required else None,
            levels.index(request.preferred) if request.preferred else None,
            state.class_index[request.classes[0]],
        )

    def claim_planner(self, request: Request, access: Access | None = None) -> claims.Planner:
        """A planner over the current free state, for explanations."""
        access = access or request.default_access
        views = {name: self.view(name, access) for name in request.classes}
        return claims.Planner(self.state, views, request.demands, self.selectors)

    @property
    def shrunk_victims(self) -> set[str]:
        """The chosen victims that only lose pods."""
        return {workload.id for workload in self.leaving.values()}

    def _commit(self, request: Request, class_name: str, plan: GangPlan) -> None:
        planned = plan.pods
        workload = request.workload
        request_id = workload.id
        state = self.state
        node_names = state.node_names
        if len(planned) == 1:
            # Most admissions are one pod: its node's domains are the gang's, and its records are made
            # here as `made` makes them, without a call and a keyword dict for each of two records.
            pod = planned[0]
            slots = pod.slots
            state.hold(slots, request_id)
            placement = object.__new__(PodPlacement)
            placement.__dict__.update(
                pod_set=pod.pod_set,
                index=pod.index,
                node=node_names[pod.node],
                device_ids=tuple([slot.id for slot in slots]),
                requests=(),
                consumed=(),
            )
            pods = (placement,)
            domain = self._node_domain(pod.node)
        else:
            slots = [slot for pod in planned for slot in pod.slots]
            state.hold(slots, request_id)
            pods = tuple(
                [
                    made(
                        PodPlacement,
                        pod_set=pod.pod_set,
                        index=pod.index,
                        node=node_names[pod.node],
                        device_ids=tuple([slot.id for slot in pod.slots]),
                        requests=(),
                        consumed=(),
                    )
                    for pod in sorted(planned, key=_pod_order)
                ]
            )
            domain = self.common_domain(plan)
        if request.claimed:
            pods = tuple(
                [
                    made(PodPlacement, pod_set=pod.pod_set, index=pod.index, node=placed.node,
                         device_ids=placed.device_ids, requests=claims.slot_labels(pod), consumed=())
                    for pod, placed in zip(sorted(planned, key=_pod_order), pods, strict=True)
                ]
            )  # fmt: skip
        request_classes = ()
        group_requests = ()
        group = []
        if workload.group_claims:  # allocated once for the gang, charged with it to its class
            group = [slot for _, claim_slots in plan.group for slot in claim_slots]
            state.hold(group, request_id)
            group_requests = tuple((label, tuple(slot.id for slot in claim_slots)) for label, claim_slots in plan.group)
        if request.claimed:  # each request's devices under its own class
            labels = {label: device_class for pod in planned for label, device_class, _ in pod.requests}
            request_classes = tuple(labels.items())
            for device_class, amount in request_charges(planned, self.consumption, class_name).items():
                self._charge(request.queue.name, device_class, amount)
            if group:
                self._charge(request.queue.name, class_name, self.consumption.of_devices([s.id for s in group]))
        elif self.consumption.whole:
            self._charge(request.queue.name, class_name, len(slots) + len(group))
        else:
            self._charge(request.queue.name, class_name, self.consumption.of_devices([s.id for s in [*slots, *group]]))
        admission = object.__new__(Admission)
        admission.__dict__.update(
            workload_id=request_id,
            device_class=class_name,
            pods=pods,
            domain=domain,
            request_classes=request_classes,
            group_requests=group_requests,
        )
        log = self.log
        log.admitted[request_id] = admission
        log.admitted_plans[request_id] = plan
        log.admitted_durations.append(workload.expected_duration)
        if self.on_admission is not None:
            self.on_admission(admission)

    def common_domain(self, plan: GangPlan) -> Mapping[str, str]:
        """Levels (coarse to fine, node excluded) on which all pods share one domain."""
        pods = plan.pods
        node = pods[0].node
        if len(pods) == 1 or all(pod.node == node for pod in pods):
            return self._node_domain(node)
        domain = {}
        for level_index, level in enumerate(self.state.levels):
            if level == NODE_LEVEL:
                break
            keys = {self.state.domain_of(pod.node, level_index) for pod in plan.pods}
            if len(keys) != 1:
                break
            domain[level] = next(iter(keys))[-1]
        return domain

    def _node_domain(self, node: int) -> Mapping[str, str]:
        """Every level's domain of one node (it shares them all with itself)."""
        return self.state.index.node_domain_maps[node] or self.state.index.node_domain(node)

    # --- step 6 ---

    def _after_failure(self, request: Request) -> None:
        if self.gate_problem(request):
            return
        if request.claimed or request.shared_amounts is not None or request.workload.group_claims:
            # Victims of a gang with claims, or of a time-sliced request, are searched by placing it
            # itself.
            if self.config.enable_preemption:
                found = preemption.find_claim_victims(self, request)
                if found is not None:
                    self._record_preemption(request, found)
                    return
            if request.shared_amounts is not None or request.workload.group_claims:
                # Protected starts are planned for whole devices and for several-request claims
                # (backfill._plan_claim); not yet for time-slices or for devices the gang owns.
                self.log.outcomes[request.id].unprotectable = True
                return
        elif self.config.enable_preemption:
            # Preemption may also make quota room (victims of the same queue give theirs back).
            found = preemption.find_victims(self, request)
            if found is not None:
                self._record_preemption(request, found)
                return
        outcome = self.log.outcomes[request.id]
        if request.id in self.protected_first:
            outcome.protected = True
            return
        if not self.entitled_classes(request):
            outcome.unprotectable = True
            return
        if self.config.enable_backfill_protection and self._protects_more():
            protection = backfill.plan_protection(self, request)
            if protection is not None:
                self.protections.append(protection)
                self._protected_ids.add(protection.workload_id)
                outcome.protected = True
            else:
                outcome.unprotectable = True

    def _record_preemption(self, request: Request, found) -> None:
        outcome = self.log.outcomes[request.id]
        outcome.victims = found.victims
        outcome.waiting_for_evictions = found.evicting
        outcome.victim_scope = found.scope
        for victim in found.victims:
            workload = victim.workload
            pods = tuple((pod.pod_set, pod.index) for pod in workload.pods) if workload.partial else ()
            self.log.preemptions.append(
                Preemption(workload.id, request.id, victim.rule, self._victim_message(victim, request), pods)
            )

    def _victim_message(self, victim, request) -> str:
        return victim.message(request, self.snapshot.now, self.config.shorter_remaining_factor or 0.0)

    # --- shared questions ---

    def quota_passing_classes(self, request: Request) -> tuple[str, ...]:
        return tuple(
            class_name
            for class_name in request.classes
            if self.quota.fits(request.queue.name, class_name, request.quota_needed)
        )

    def entitled_classes(self, request: Request) -> tuple[str, ...]:
        """Classes whose quota passes, or that stay within the queue's own nominal quota (a queue is
        always entitled to its nominal, even while cohort borrowers hold it)."""
        quota = self.quota
        queue = request.queue.name
        return tuple(
            class_name
            for class_name in request.classes
            if quota.fits(queue, class_name, request.needed)
            or quota.usage(queue, class_name) + request.needed <= (quota.nominal(queue, class_name) or 0)
        )

    def excluded_for(self, request: Request) -> frozenset:
        """Nodes `request` may not take now: those held for every protected gang ahead whose planned
        start it would delay (it runs past that start, or no start is planned), and those of reservation
        windows it would overrun. Asked for every request, two or three times: by what the answer
        depends on, which is where its expected run ends among the marks (see `_new_marks`)."""
        protections = self.protections
        if not protections and not self.windows:
            return NOTHING
        if len(protections) != self._marked:
            self._new_marks()
        if request.id in self._protected_ids or request.id in self._own_nodes:
            # Its own protection, or the nodes its victims free, hold nothing against it: a few only.
            return self._excluded_now(request)
        duration = request.workload.expected_duration
        if duration is None:
            key = -1
        else:
            end = self._now + duration
            # Marks strictly before the end: a protection holds its nodes against an end past its
            # planned start, a window blocks an end past its opening.
            key = bisect_left(self._marks, end) if end == end and self._marks is not None else ("end", duration)
        if self.windows:  # only a window reads the team and preemptibility: else they would split the memo
            key = (key, request.team, request.preemptible)
        found = self._excluded_memo.get(key)
        if found is None:
            found = self._excluded_memo[key] = self._excluded_now(request)
        return found

    def _new_marks(self) -> None:
        """The planned starts of the protections so far and the windows' openings, in order, and a memo
        for them. A protection and a window read a request's expected end (now + duration) only by
        comparing it with its mark, so requests whose ends fall between the same marks are answered
        alike. Keyed by the duration itself, the memo missed for nearly every request (durations are
        distinct to the second), and each miss asked every protection and window again."""
        starts = [p.planned_start for p in self.protections if p.planned_start is not None]
        starts += [window.reservation.start for window in self.windows]
        # A NaN mark has no place in an order: then each duration keys on its own (compared as ever).
        self._marks = sorted(set(starts)) if all(start == start for start in starts) else None
        self._marked = len(self.protections)
        self._excluded_memo = {}

    def _excluded_now(self, request: Request) -> frozenset:
        now = self.snapshot.now
        windows = [window.nodes for window in self.windows_blocking(request)] if self.windows else []
        protected = [
            nodes
            for protection in self.protections
            if protection.workload_id != request.id and (nodes := protection.excluded_for(request, now))
        ]
        own = self._own_nodes.get(request.id)
        if own:
            # Its victims were chosen before this cycle's protected gangs held those nodes: what they
            # free (or freed) stays open to it. A few workloads a cycle, so no union is kept for them.
            return frozenset().union(*windows, *(nodes - own for nodes in protected))
        held = windows + protected
        if len(held) < 2:
            return held[0] if held else frozenset()
        key = tuple(map(id, held))  # the protections' and windows' own sets, alive for the cycle
        union = self._excluded_unions.get(key)
        if union is None:
            union = self._excluded_unions[key] = frozenset().union(*held)
        return union

    def windows_blocking(self, request: Request) -> list[Window]:
        """Reservation windows not open yet whose nodes `request` may not take: it would overrun them."""
        workload = request.workload
        now = self.snapshot.now
        return [
            window
            for window in self.windows
            if window.blocks(request.team, request.preemptible, workload.expected_duration, now)
        ]

    def protections_holding(self, request: Request) -> list[backfill.Protection]:
        """The protected gangs whose held nodes `request` may not take now."""
        now = self.snapshot.now
        return [p for p in self.protections if p.workload_id != request.id and p.excluded_for(request, now)]

    def access_key(self, access: Access) -> tuple:
        """The parts of `access` that can change the answer on this cluster (more sharing of memos)."""
        known = self._access_keys.get(access.key)
        if known is None:
            reserved = bool(self.reserved_teams)
            known = (
                (
                    access.team if access.team in self.reserved_teams else None,
                    access.preemptible and reserved,
                    access.tolerations if self.has_taints else (),
                    access.healed,
                    access.unreserved and reserved,
                ),
                access.uses_extras(self.state, self.reserved_teams),
            )
            self._access_keys[access.key] = known
        return known[0]

    def uses_extras(self, access: Access) -> bool:
        """`access.uses_extras(...)` for this cycle (it depends only on the access and the snapshot)."""
        known = self._access_keys.get(access.key)
        if known is None:
            self.access_key(access)
            known = self._access_keys[access.key]
        return known[1]

    def extras_for(self, access: Access) -> list:
        """The free extras `access` may use, as (rank, slot), ranked once per access and filtered once per
        change of the state's holders (callers only read the list)."""
        key = self.access_key(access)
        known = self._extras_cache.get(key)
        if known is None:
            candidates = []
            for slot in self.state.extras:
                rank = access.rank(slot)
                if rank is not None:
                    candidates.append((rank, slot))
            known = self._extras_cache[key] = [candidates, None, None]
        changes = self.state.changes
        if known[1] != changes:
            known[1], known[2] = changes, [(rank, slot) for rank, slot in known[0] if slot.holder is None]
        return known[2]

    def view(self, class_name: str, access: Access, excluded=frozenset(), more=()) -> View:
        extra = self.extras_for(access) if self.uses_extras(access) else []
        return View(self.state, self.state.class_index[class_name], extra + list(more), excluded)

    def find_plan(self, request: Request, class_name: str, access: Access | None = None, excluded=frozenset()):
        """Placement of `request` with one class on the current free state; failures are memoised
        because free capacity only shrinks during a cycle."""
        access = access or request.default_access
        if request.workload.group_claims:
            # Its own answer: the claims' devices are the workload's own, not its shape's.
            return self.grouped_plan(request, class_name, access, excluded)
        if request.claimed:
            key = (None, request.demands, request.required, request.preferred, self.access_key(access), excluded)
            if key in self._failed:
                return None
            plan = self.claim_plan(request, access, excluded)
            if plan is None:
                self._failed.add(key)
            return plan
        if request.shared_amounts is not None:
            amounts = tuple(sorted(request.shared_amounts.items()))
            key = (class_name, request.demands, request.required, amounts, self.access_key(access), excluded)
            if key in self._failed:
                return None
            plan = self.shared_plan(request, class_name, access, excluded)
            if plan is None:  # what is left on shared devices only shrinks during a cycle
                self._failed.add(key)
            return plan
        if request.simple and not self.uses_extras(access):
            if not excluded:
                # Answered from the bucketed free counts, a failure as fast as a memo lookup: no memo.
                return self._simple_plan(self.state.class_index[class_name], request.demands[0])
            # With nodes held for the head of the line the memo stays: a failure remembered here is
            # one the general path would remember too, so both paths keep the same answers.
            key = (class_name, request.demands, None, None, self.access_key(access), excluded)
            if key in self._failed:
                return None
            plan = self._simple_plan(self.state.class_index[class_name], request.demands[0], excluded)
            if plan is None:
                self._failed.add(key)
            return plan
        key = (
            class_name,
            request.demands,
            request.required,
            request.preferred,
            self.access_key(access),
            excluded,
        )
        if key in self._failed:
            return None
        plan = self.plan_now(request, class_name, access, excluded)
        if plan is None:
            self._failed.add(key)
        return plan

    def plan_now(self, request: Request, class_name: str, access: Access, excluded=frozenset()):
        """Placement of `request` with one class on the current free state, remembering nothing (for
        callers during whose questions free capacity also grows, like the estimated-start simulation)."""
        if request.workload.group_claims:
            return self.grouped_plan(request, class_name, access, excluded)
        if request.claimed:
            return self.claim_plan(request, access, excluded)
        if request.shared_amounts is not None:
            # Only the estimate simulation asks here, and its releases give back whole devices, not
            # shares: the ledger cannot follow it, so it is never told a time-sliced start.
            return None
        if request.simple and not self.uses_extras(access):
            return self._simple_plan(self.state.class_index[class_name], request.demands[0], excluded)
        levels = self.state.levels
        return place_gang(
            self.view(class_name, access, excluded),
            request.demands,
            levels.index(request.required) if request.required else None,
            levels.index(request.preferred) if request.preferred else None,
        )

    def _simple_plan(self, class_index: int, demand, excluded=frozenset()) -> GangPlan | None:
        """`place_gang` for a simple request (see Request.simple) on plain devices only, minus the
        `excluded` nodes: the same plan, straight from the nodes bucketed by free count, fullest (fewest
        free) first."""
        state = self.state
        per_pod = demand.per_pod
        wanted = demand.min_count
        buckets = state.buckets[class_index]
        # One pod needs no counting first: the scan below yields a node with room at once, or none
        # past the few excluded ones.
        if wanted > 1:
            counts = state.node_free[class_index]
            free = state.total_free[class_index]
            fitting = buckets.pods_that_fit(per_pod)
            if excluded:
                free -= sum([counts[node] for node in excluded])
                fitting -= sum([counts[node] // per_pod for node in excluded])
            if free < per_pod * wanted or fitting < wanted:
                return None
        free_plain = state.free_plain
        name = demand.name
        values, members = buckets.values, buckets.members
        # Devices consuming shared counters: free ones may not all fit together, so their nodes are
        # chosen from with the counters checked (placement.choose_counted).
        counted = state.counted and state.class_names[class_index] in state.class_counted
        if wanted == 1 and not excluded and not counted:
            # Most plans: one pod, on the first node of the fullest bucket with room. Its count is of its
            # free plain devices of this class, so it has `per_pod` of them.
            first = bisect_left(values, per_pod)
            if first == len(values):
                return None
            node = members[values[first]][0]
            if per_pod == 1:
                for slot in free_plain[node]:
                    if class_index in slot.classes:
                        chosen = (slot,)
                        break
            else:
                chosen = tuple([slot for slot in free_plain[node] if class_index in slot.classes][:per_pod])
            # tuple.__new__ is what the NamedTuples' generated __new__ calls, less a Python frame.
            return new_tuple(GangPlan, (class_index, ROOT, (new_tuple(PlannedPod, (name, 0, node, chosen)),)))
        pods = []
        # buckets.nodes_with_at_least(per_pod), without a generator.
        for value in values[bisect_left(values, per_pod) :]:
            for node in members[value]:
                if node in excluded:
                    continue
                slots = [slot for slot in free_plain[node] if class_index in slot.classes]
                if counted and any(slot.consumes is not None for slot in slots):
                    spent: dict = {}
                    while len(slots) >= per_pod:
                        chosen = choose_counted(slots, demand, state, spent)
                        if chosen is None:
                            break
                        pods.append(new_tuple(PlannedPod, (name, len(pods), node, tuple(chosen))))
                        if len(pods) == wanted:
                            return new_tuple(GangPlan, (class_index, ROOT, tuple(pods)))
                        spend(spent, chosen)
                        slots = [slot for slot in slots if slot not in chosen]
                    continue
                start = 0
                while start + per_pod <= len(slots):
                    pods.append(new_tuple(PlannedPod, (name, len(pods), node, tuple(slots[start : start + per_pod]))))
                    if len(pods) == wanted:
                        return new_tuple(GangPlan, (class_index, ROOT, tuple(pods)))
                    start += per_pod
        return None  # no node outside `excluded` has room for the one pod (more: the counts said they fit)

    def unreserve(self, slots) -> None:
        """An open reservation ends, as the estimated-start simulation reaches its end: its devices are
        anyone's from then on, so the usable extras remembered per access (ranked by owner) are made anew."""
        self.state.unreserve(slots)
        self._extras_cache.clear()

    def slots_held_by(self, workload_id: str) -> list:
        plan = self.log.admitted_plans.get(workload_id) or self.simulated_plans.get(workload_id)
        if plan is not None:
            return list(plan.slots())
        workload = self.running.get(workload_id) or self.leaving.get(workload_id)
        if workload is None:
            return []
        slots = self.state.slot_by_id
        holder = workload.id  # a shrunk victim's leaving pods are still held under its own id
        return [
            slots[device_id]
            for pod in workload.pods
            for device_id in pod.device_ids
            if device_id in slots and slots[device_id].holder == holder
        ]

    def empty_state(self) -> CapacityState:
        if self._empty_state is None:
            self._empty_state = CapacityState.as_built(self.state)
        return self._empty_state

    def pending_decision_for_invalid(self, workload_id: str) -> PendingDecision:
        return explanation.invalid_decision(workload_id, self.log.invalid[workload_id])


_by_id = attrgetter("id")
_by_age = attrgetter("submitted", "id")
new_tuple = tuple.__new__
_by_workload_id = attrgetter("workload_id")


def _pod_order(pod: PlannedPod) -> tuple:
    return (pod.pod_set, pod.index)


def _trim_to_quota(
    plan: GangPlan, request: Request, available: float | None, consumption: Consumption | None = None, consumed=()
) -> GangPlan:
    """Drop optional pods (beyond min_count) until the plan fits the quota still available; a pod
    counts for its devices, or with `consumption` for what they consume."""
    if available is None:
        return plan

    def charge(pod) -> float:
        if consumption is None:
            return len(pod.slots)
        return consumption.of_devices([slot.id for slot in pod.slots], consumed)

    pods = list(plan.pods)
    total = sum(charge(pod) for pod in pods)
    if total <= available + EPSILON:
        return plan
    minimum = {demand.name: demand.min_count for demand in request.demands}
    while total > available + EPSILON:
        optional = [pod for pod in pods if pod.index >= minimum[pod.pod_set]]
        if not optional:
            break
        last = max(optional, key=lambda pod: (pod.index, pod.pod_set))
        pods.remove(last)
        total -= charge(last)
    if isinstance(plan, group_claims.GroupedPlan):
        return plan._replace(pods=tuple(pods))
    return GangPlan(plan.class_index, plan.scope, tuple(pods))
