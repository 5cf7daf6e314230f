"""Why a workload is pending: reason codes in DESIGN.md §5 order, the numbers behind them, its position,
an estimated start and suggestions that were verified to work.

Every code is decided by re-running placement on a changed copy of the end-of-cycle free state
(a counterfactual), never by guessing from totals:
- InvalidRequest: it does not fit on the cluster as built (everything healthy, free, unreserved);
- QuotaExceeded: no device class passes the queue's quota (nominal + borrowable);
- DeviceUnhealthy / Reserved: it does not fit now, but would with unhealthy / tainted / cordoned devices
  healed, or with other teams' reservations lifted, and those devices would not all go to workloads
  ahead of it first (Assessor.share_out_pools);
- InsufficientCapacity: it does not fit now and fewer matching devices than it needs are free at all;
- TopologyFragmented: it does not fit now although enough matching devices are free in total;
- Priority: it fits now, but only on capacity held for the head of the line;
- PreemptionPending: victims are being evicted for it (primary whenever it applies: it is the news).
The counterfactuals depend only on the request's shape and who asks, so they are computed once per
distinct shape, not once per workload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from heapq import nlargest

from broker.scheduler import claims, estimate, preemption, sharing
from broker.scheduler.capacity import BLOCKED, NODE_LEVEL, ROOT, TAINTED, CapacityState, View
from broker.scheduler.placement import place_gang
from broker.scheduler.requests import Request, approval_problem, entitlement_problem
from broker.scheduler.snapshot import (
    REASON_CODES,
    CycleResult,
    PendingDecision,
    PodSet,
    Snapshot,
    Suggestion,
    held_outside,
    label,
    made,
    span,
)

CAPACITY_CODES = ("DeviceUnhealthy", "Reserved", "InsufficientCapacity", "TopologyFragmented", "Priority")
# Codes that point at a finite pool of devices (healed, or freed of other teams' reservations), by the
# details field that counts it, and what the pool is called in a message.
POOLED_CODES = {
    "DeviceUnhealthy": ("unhealthy", "unhealthy, tainted or cordoned"),
    "Reserved": ("reserved", "reserved"),
}


def invalid_decision(workload_id: str, message: str) -> PendingDecision:
    return PendingDecision(
        workload_id=workload_id,
        reason="InvalidRequest",
        message=message,
        details={"invalid": message},
    )


def explain_all(cycle, rerun: Callable[[Snapshot], CycleResult]) -> list[PendingDecision]:
    """Every workload the cycle did not admit, explained; `rerun` decides a changed snapshot anew (the
    cycle's own `decide`, handed down so this module need not import the one that calls it)."""
    decisions = [cycle.pending_decision_for_invalid(workload_id) for workload_id in sorted(cycle.log.invalid)]
    waiting = [workload_id for workload_id in cycle.log.cluster_order if workload_id not in cycle.log.admitted]
    assessor = Assessor(cycle, rerun)
    # Decisions of a shape are shared (under the id of its first workload); each gets its own id below.
    assessed = {workload_id: assessor.shape_decision(cycle.log.outcomes[workload_id]) for workload_id in waiting}
    assessor.share_out_pools(waiting, assessed)
    # Last: the simulation behind estimated starts consumes the cycle's free-capacity state.
    estimates = {}
    if cycle.config.explain:
        reasons = {workload_id: decision.reason for workload_id, decision in assessed.items()}
        estimates = estimate.estimated_starts(cycle, waiting, reasons)
    in_queue: dict[str, int] = {}
    for position, workload_id in enumerate(waiting, start=1):
        queue = cycle.requests[workload_id].queue.name
        in_queue[queue] = in_queue.get(queue, 0) + 1
        decision = assessed[workload_id]
        start, start_note = estimates.get(workload_id, (None, "not computed"))
        # Built field by field: dataclasses.replace's generic path costs several times more per workload.
        decisions.append(
            made(
                PendingDecision,
                workload_id=workload_id,
                reason=decision.reason,
                secondary=decision.secondary,
                message=decision.message,
                details={**decision.details, "estimate": start_note},
                position_in_queue=in_queue[queue],
                position_in_cluster=position,
                estimated_start=start,
                suggestions=decision.suggestions,
            )
        )
    return decisions


class Assessor:
    """Reason codes, messages, details and suggestions on the end-of-cycle state."""

    def __init__(self, cycle, rerun: Callable[[Snapshot], CycleResult]):
        self.cycle = cycle
        self.rerun = rerun
        self.state: CapacityState = cycle.state
        self._capacity_cache: dict = {}
        self._invalid_cache: dict = {}
        self._numbers_cache: dict = {}
        self._shape_decisions: dict = {}
        # By decision identity: (it, every code's message, the pooled codes it was demoted from).
        self._codes: dict[int, tuple[PendingDecision, dict, frozenset]] = {}
        self._demoted: dict[int, PendingDecision] = {}
        snapshot = cycle.snapshot
        # Quota suggestions are verified by re-running the cycle for the very workload (see _increase_quota).
        self._verifies_by_rerun = len(snapshot.pending) <= snapshot.config.rerun_verification_limit

    # --- codes ---

    def decide(self, outcome) -> PendingDecision:
        decision = self.shape_decision(outcome)
        if decision.workload_id != outcome.request.id:
            decision = replace(decision, workload_id=outcome.request.id)
        return decision

    def shape_decision(self, outcome) -> PendingDecision:
        """The decision of the outcome's workload, or the same decision made for an earlier workload of
        its shape (`_shape_key`), which carries that workload's id."""
        if outcome.victims or outcome.waiting_for_evictions or outcome.quota_short:
            return self._decide(outcome)
        key = self._shape_key(outcome.request)
        decision = self._shape_decisions.get(key)
        if decision is None:
            decision = self._shape_decisions[key] = self._decide(outcome)
        return decision

    def _shape_key(self, request: Request) -> tuple:
        """Everything of a request (without victims of its own) that its decision reads: requests equal
        in all of it are decided alike, as the end-of-cycle state does not change while they are."""
        workload = request.workload
        return (
            request.queue.name,
            request.team,
            request.resource_class.name if request.resource_class else None,
            request.classes,
            request.demands,
            request.shared_amounts and tuple(sorted(request.shared_amounts.items())),
            request.required,
            request.preferred,
            request.preemptible,
            request.tolerations,
            workload.approved,
            workload.priority,  # named in the lent-out message
            self.cycle.excluded_for(request),  # from the expected duration and the head's protection
            request.id if self._verifies_by_rerun else None,
            workload.group_claims,
        )

    def _decide(self, outcome) -> PendingDecision:
        request: Request = outcome.request
        codes: dict[str, str] = {}
        details: dict = {"needed": self._needed(request)}
        invalid = self._invalid_message(request)
        if invalid:
            codes["InvalidRequest"] = invalid
        not_entitled = entitlement_problem(request)
        if not_entitled:
            codes["NotEntitled"] = not_entitled
        awaiting = approval_problem(request)
        if awaiting:
            codes["AwaitingApproval"] = awaiting
        need = self.cycle.quota_need(request)
        checks = [self.cycle.quota.check(request.queue.name, name, need) for name in request.classes]
        details["quota"] = checks[0].details()
        passing = tuple(check.device_class for check in checks if check.fits)
        if not passing:
            lent = preemption.lent_out(self.cycle, request, request.classes[0])
            codes["QuotaExceeded"] = lent["message"] if lent else checks[0].message()
            if lent:
                details["lent_out"] = lent["borrowers"]
        elif outcome.quota_short:  # placed, but what its claim took is more than the quota left
            device_class, amount = outcome.quota_short
            check = self.cycle.quota.check(request.queue.name, device_class, amount)
            if not check.fits:
                codes["QuotaExceeded"] = check.message()
                details["quota"] = check.details()
        capacity = self.capacity(request, passing or request.classes)
        details.update(capacity["details"])
        codes.update(capacity["codes"])
        if outcome.victims or outcome.waiting_for_evictions:
            running = self.cycle.running
            codes["PreemptionPending"] = _preemption_message(outcome, running, self.state.levels)
            details["victims"] = [victim.workload.id for victim in outcome.victims]
            evicting = outcome.waiting_for_evictions
            details["evicting"] = sorted({_whole_id(running, workload_id) for workload_id in evicting})
        ordered = [code for code in REASON_CODES if code in codes]
        if "PreemptionPending" in codes:
            ordered.remove("PreemptionPending")
            ordered.insert(0, "PreemptionPending")
        if not ordered:
            # Cannot happen if capacity only shrinks during a cycle; say so rather than invent a cause.
            ordered = ["Priority"]
            codes["Priority"] = "fits now; it will be admitted in the next cycle"
        primary = ordered[0]
        suggestions = ()
        if self.cycle.config.suggestions and primary in ("QuotaExceeded",) + CAPACITY_CODES:
            suggestions = self.suggestions(request, codes)
        decision = PendingDecision(
            workload_id=request.id,
            reason=primary,
            secondary=tuple(ordered[1:]),
            message=codes[primary],
            details=details,
            suggestions=suggestions,
        )
        if primary in POOLED_CODES:
            self._codes[id(decision)] = (decision, codes, frozenset())
        return decision

    # --- contended pools ---

    def share_out_pools(self, waiting: list[str], assessed: dict[str, PendingDecision]) -> None:
        """DeviceUnhealthy and Reserved say a workload would fit if a pool of devices were usable; the pool
        is there for only so many of them. In cluster order each workload given such a code takes its
        devices from the class's free count plus the pool (an upper bound on what healing or lifting the
        reservations could make room for); once that is spent, later workloads get their next code, with
        this one as secondary. Otherwise every workload in a full cluster would blame the same few broken
        devices. Changes `assessed` in place."""
        left: dict[tuple[str, str], int] = {}
        for workload_id in waiting:
            decision = assessed[workload_id]
            while decision.reason in POOLED_CODES and self._next_code(decision) is not None:
                field, _ = POOLED_CODES[decision.reason]
                details = decision.details
                key = (decision.reason, details["device_class"])
                pool = left.get(key)
                if pool is None:
                    pool = details["free"] + details[field]
                needed = details["needed"]["devices"]
                if pool >= needed:
                    left[key] = pool - needed
                    break
                left[key] = pool
                decision = self._demote(decision)
            assessed[workload_id] = decision

    def _demote(self, decision: PendingDecision) -> PendingDecision:
        """The decision with its primary (a pooled code whose pool is spent) made secondary and the next
        code primary; one per decision, so the workloads of a shape still share it."""
        demoted = self._demoted.get(id(decision))
        if demoted is None:
            original, codes, spent = self._codes[id(decision)]
            details = original.details
            primary = self._next_code(decision)
            spent = spent | {original.reason}
            pools = " and ".join(
                f"the {details[POOLED_CODES[code][0]]} {POOLED_CODES[code][1]}"
                for code in REASON_CODES
                if code in spent
            )
            message = (
                f"{codes[primary]}; {pools} {details['device_class']} devices would go to workloads ahead of it first"
            )
            secondary = tuple(
                code for code in REASON_CODES if code != primary and code in (original.reason, *original.secondary)
            )
            demoted = PendingDecision(
                workload_id=original.workload_id,
                reason=primary,
                secondary=secondary,
                message=message,
                details=details,
                suggestions=original.suggestions,
            )
            if primary in POOLED_CODES:
                self._codes[id(demoted)] = (demoted, codes, spent)
            self._demoted[id(decision)] = demoted
        return demoted

    def _next_code(self, decision: PendingDecision) -> str | None:
        """The code a pooled decision is demoted to: its first secondary code that is not a pooled code it
        was already demoted from (DeviceUnhealthy demoted to Reserved has DeviceUnhealthy among its
        secondary codes, ahead of InsufficientCapacity); None when only those are left."""
        spent = self._codes[id(decision)][2]
        return next((code for code in decision.secondary if code not in spent), None)

    def _invalid_message(self, request: Request) -> str | None:
        amounts = request.shared_amounts and tuple(sorted(request.shared_amounts.items()))
        key = (
            request.classes,
            request.demands,
            request.required,
            request.preferred,
            amounts,
            request.workload.group_claims,
        )
        if key not in self._invalid_cache:
            self._invalid_cache[key] = self._compute_invalid(request)
        return self._invalid_cache[key]

    def _compute_invalid(self, request: Request) -> str | None:
        empty = self.cycle.empty_state()
        levels = empty.levels
        required = levels.index(request.required) if request.required else None
        if request.claimed:
            views = {name: View(empty, empty.class_index[name]) for name in request.classes}
            planner = claims.Planner(empty, views, request.demands, self.cycle.selectors)
            if planner.place(required, None, empty.class_index[request.classes[0]]) is not None:
                return None
            fresh = claims.Planner(empty, views, request.demands, self.cycle.selectors)
            return "never fits the cluster as built: " + claims.why_not(fresh, request.required)
        if request.shared_amounts is not None:
            ledger = sharing.Ledger(replace(self.cycle.snapshot, running=()), empty)
            for class_name in request.classes:
                plan = sharing.place_shared(
                    empty, ledger, empty.class_index[class_name], request.demands, request.shared_amounts,
                    request.access(), required, frozenset(),
                )  # fmt: skip
                if plan is not None:
                    return None
            wanted = ", ".join(f"{amount:g} {name}" for name, amount in sorted(request.shared_amounts.items()))
            return (
                f"no shared devices of {' or '.join(request.classes)} hold its pods' {wanted} each, "
                "even with the cluster as built"
            )
        problems = []
        for class_name in request.classes:
            view = View(empty, empty.class_index[class_name])
            if place_gang(view, request.demands, required, None) is not None:
                return None
            problems.append(_why_never(view, request, class_name))
        return "; ".join(problems)

    def capacity(self, request: Request, classes: tuple[str, ...]) -> dict:
        excluded = self.cycle.excluded_for(request)
        key = (
            classes,
            request.demands,
            request.required,
            request.preferred,
            self.cycle.access_key(request.default_access),
            excluded,
            request.team,  # the Reserved message names it, though the access key may leave it out
            request.workload.group_claims,
        )
        cached = self._capacity_cache.get(key)
        if cached is None:
            cached = self._compute_capacity(request, classes, excluded)
            self._capacity_cache[key] = cached
        return cached

    def _fits_any(self, request, classes, access, excluded=frozenset()) -> bool:
        return any(self._fits(request, name, access, excluded) for name in classes)

    def _fits(self, request, class_name, access, excluded=frozenset()) -> bool:
        return self.cycle.find_plan(request, class_name, access=access, excluded=excluded) is not None

    def _compute_capacity(self, request: Request, classes, excluded) -> dict:
        codes: dict[str, str] = {}
        access = request.default_access
        numbers = [self._numbers(request, name) for name in classes]
        focus = next((n for n in numbers if n["free"] >= request.needed), numbers[0])
        details = {
            "device_class": focus["device_class"],
            "free": focus["free"],
            "largest_free_domain": focus["largest_free_domain"],
            "unhealthy": focus["unhealthy"],
            "reserved": focus["reserved"],
        }
        needs = _needs_text(request, focus["device_class"])
        fits_unheld = self._fits_any(request, classes, access)
        if not fits_unheld:
            binding = _binding_domain_text(request, focus)
            if self._fits_any(request, classes, request.access(healed=True)):
                codes["DeviceUnhealthy"] = (
                    f"{needs}; {_free_text(focus)} free{binding}; it would fit if the "
                    f"{focus['unhealthy']} unhealthy, tainted or cordoned ones were healthy"
                )
            if self._fits_any(request, classes, request.access(unreserved=True)):
                codes["Reserved"] = (
                    f"{needs}; {_free_text(focus)} free for team {request.team}{binding}; "
                    f"it would fit without the {focus['reserved']} free devices reserved for other teams"
                    f" ({_owners_text(focus['reserved_by'])})"
                )
            if request.shared_amounts is not None:
                # Time-sliced: what is left on the shared devices, not free devices, says why.
                room = [sharing.room_for(self.cycle.state, self.cycle.ledger, self.cycle.state.class_index[name],
                                         request.shared_amounts, access) for name in classes]  # fmt: skip
                code, text = sharing.why_not(
                    request.demands, classes, room, request.shared_amounts, request.needed, request.required
                )
                codes[code] = text
            elif all(n["free"] < request.needed for n in numbers):
                codes["InsufficientCapacity"] = f"{needs}; {_free_text(focus, 'only ')} free in the cluster"
            else:
                codes["TopologyFragmented"] = _fragmented_text(request, needs, focus)
        elif excluded and not self._fits_any(request, classes, access, excluded):
            holding = self.cycle.protections_holding(request)
            windows = self.cycle.windows_blocking(request)
            ahead = frozenset().union(*(protection.nodes for protection in holding))
            if windows and (not holding or self._fits_any(request, classes, access, ahead)):
                # The binding constraint is a window about to open, not the work ahead.
                duration = request.workload.expected_duration
                runs = (
                    f"would run {span(duration)}, past its start"
                    if duration is not None
                    else ("has no expected duration, so it may run past its start")
                )
                opening = "; and of ".join(window.describe(self.state.levels) for window in windows[:2])
                codes["Reserved"] = f"{needs}; it fits now, but only on the nodes of {opening}, and it {runs}"
                details["reservation"] = windows[0].reservation.name
                return {"codes": codes, "details": details}
            described = "; and ".join(protection.describe(self.state) for protection in holding[:2])
            more = f" (and {len(holding) - 2} more gangs ahead)" if len(holding) > 2 else ""
            codes["Priority"] = f"{needs}; it fits now, but {described}{more}"
            details["held_for"] = holding[0].workload_id
            details["held_for_all"] = [protection.workload_id for protection in holding]
        if request.workload.group_claims and ("InsufficientCapacity" in codes or "TopologyFragmented" in codes):
            # The gang alone would fit: name the group claim whose devices no region of room reaches.
            short = "InsufficientCapacity" in codes
            codes.pop("InsufficientCapacity", None)
            codes.pop("TopologyFragmented", None)
            if not short and self._fits_any(request.with_group_claims(()), classes, access):
                code, message = self.cycle.group_why_not(request)
                codes[code] = message
            else:
                codes["InsufficientCapacity" if short else "TopologyFragmented"] = (
                    claims.why_not(self.cycle.claim_planner(request), request.required)
                    if request.claimed
                    else _fragmented_text(request, needs, focus)
                    if not short
                    else f"{needs}; {_free_text(focus, 'only ')} free in the cluster"
                )
            return {"codes": codes, "details": details}
        if request.claimed and ("InsufficientCapacity" in codes or "TopologyFragmented" in codes):
            # Name the request that cannot be met, rather than a count of one of its classes; too few
            # free devices in all is told by each class's own need, not by the claim's total.
            codes.pop("InsufficientCapacity", None)
            codes.pop("TopologyFragmented", None)
            need: dict[str, int] = {}
            for demand in request.demands:
                for device_request in demand.claim.requests:
                    ways = device_request.alternatives
                    if len(ways) == 1:
                        name = ways[0].device_class
                        need[name] = need.get(name, 0) + ways[0].count * demand.min_count
            short = any(self._numbers(request, name)["free"] < count for name, count in need.items())
            code = "InsufficientCapacity" if short else "TopologyFragmented"
            codes[code] = claims.why_not(self.cycle.claim_planner(request), request.required)
        return {"codes": codes, "details": details}

    def _numbers(self, request: Request, class_name: str) -> dict:
        """Free, unhealthy and reserved counts of one class as the request sees them; the same for every
        request of one access key and required level (the state no longer changes), so made once."""
        access = request.default_access
        key = (class_name, self.cycle.access_key(access), request.required)
        numbers = self._numbers_cache.get(key)
        if numbers is None:
            numbers = self._numbers_cache[key] = self._count(request, class_name)
        return numbers

    def _count(self, request: Request, class_name: str) -> dict:
        access = request.default_access
        view = self.cycle.view(class_name, access)
        class_index = view.class_index
        unhealthy = 0
        reserved_by: dict[str, int] = {}
        for slot in self.state.extras:
            if slot.holder is not None or class_index not in slot.classes or access.rank(slot) is not None:
                continue
            if slot.taints and held_outside(slot.taints):
                continue  # another scheduler's: busy, neither unhealthy nor reserved
            if slot.category in (BLOCKED, TAINTED):
                unhealthy += 1
            elif slot.owner is not None:
                reserved_by[slot.owner] = reserved_by.get(slot.owner, 0) + 1
        level = request.required or NODE_LEVEL
        return {
            "device_class": class_name,
            "free": view.total(),
            "largest_free_domain": _largest_domain(view, self.state.levels.index(level), level),
            "unhealthy": unhealthy,
            "reserved": sum(reserved_by.values()),
            "reserved_by": reserved_by,
        }

    def _needed(self, request: Request) -> dict:
        needed = {
            "devices": request.needed,
            "pods": [
                # A several-request claim's devices per pod are its fewest; `claim` says what it asks.
                {"pod_set": demand.name, "pods": demand.min_count, "devices_per_pod": demand.per_pod}
                | ({"claim": claims.claim_text(demand.claim)} if demand.claim is not None else {})
                for demand in request.demands
            ],
            "device_classes": list(request.classes),
            "topology_required": request.required,
        }
        if request.workload.group_claims:
            # Allocated once for the gang, beside `devices` (its pods'): claim name -> what it asks.
            needed["group_claims"] = {
                claim.name: claims.claim_text(claims.Claim(claim.requests, claim.constraints))
                for claim in request.workload.group_claims
            }
        return needed

    # --- suggestions ---

    def starts_now(self, request: Request) -> bool:
        """Would this (changed) request be admitted on the end-of-cycle state? Exact for shape changes:
        at its turn in a re-run it sees at least this much free capacity and quota."""
        excluded = self.cycle.excluded_for(request)
        for class_name in request.classes:
            if not self.cycle.quota.fits(request.queue.name, class_name, self.cycle.quota_need(request)):
                continue
            if self._fits(request, class_name, request.default_access, excluded):
                return True
        return False

    def suggestions(self, request: Request, codes: dict) -> tuple[Suggestion, ...]:
        found = []
        for make in (self._relax_topology, self._fallback_class, self._shrink_gang, self._increase_quota):
            suggestion = make(request, codes)
            if suggestion is not None:
                found.append(suggestion)
        return tuple(found)

    def _relax_topology(self, request: Request, codes) -> Suggestion | None:
        if request.required is None or not _own_requirement(request):
            return None
        levels = self.state.levels
        for index in range(levels.index(request.required) - 1, -2, -1):
            coarser = levels[index] if index >= 0 else None
            preferred = request.preferred or request.required
            if self.starts_now(request.with_topology(coarser, preferred)):
                where = f"one {coarser}" if coarser else "the whole cluster"
                return Suggestion(
                    "RelaxTopology",
                    f"require one {coarser} instead of one {request.required} (prefer one {preferred}): "
                    f"starts now in {where}"
                    if coarser
                    else f"drop the one-{request.required} requirement (prefer one {preferred}): starts now",
                    {"topology_required": coarser or "", "topology_preferred": preferred},
                )
        return None

    def _fallback_class(self, request: Request, codes) -> Suggestion | None:
        if request.claimed:  # its requests name their classes (and their fallbacks) themselves
            return None
        offered = request.resource_class.device_classes if request.resource_class else self.cycle.class_names
        prices = {dc.name: dc.price_per_hour for dc in self.cycle.snapshot.device_classes}
        others = sorted((name for name in offered if name not in request.classes), key=lambda n: (prices[n], n))
        for name in others:
            if self.starts_now(request.with_classes((name,))):
                return Suggestion(
                    "FallbackClass",
                    f"use device class {name} (${prices[name]:g}/device-hour): starts now",
                    {"device_classes": [name]},
                )
        return None

    def _shrink_gang(self, request: Request, codes) -> Suggestion | None:
        if len(request.demands) != 1 or request.demands[0].min_count <= 1:
            return None
        demand = request.demands[0]

        def starts(size: int) -> bool:
            return self.starts_now(request.with_demands((demand._replace(count=size, min_count=size),)))

        low, high = 0, demand.min_count - 1
        while low < high:
            middle = (low + high + 1) // 2
            if starts(middle):
                low = middle
            else:
                high = middle - 1
        if low < 1:
            return None
        return Suggestion(
            "ShrinkGang",
            f"run {pods(low)} instead of {demand.min_count} ({low * demand.per_pod} devices): starts now",
            {"pod_sets": {demand.name: {"count": low, "min_count": low}}},
        )

    def _increase_quota(self, request: Request, codes) -> Suggestion | None:
        if "QuotaExceeded" not in codes:
            return None
        snapshot = self.cycle.snapshot
        if len(snapshot.pending) > snapshot.config.rerun_verification_limit:
            return None
        quota = self.cycle.quota
        for class_name in request.classes:
            check = quota.check(request.queue.name, class_name, request.needed)
            if check.nominal is None:
                continue
            excluded = self.cycle.excluded_for(request)
            if not self._fits(request, class_name, request.default_access, excluded):
                continue
            increase = max(check.more_needed, request.needed - (check.maximum or 0))
            suggestion = Suggestion(
                "IncreaseQuota",
                f"raise queue {request.queue.name}'s {class_name} quota from {check.nominal} to "
                f"{check.nominal + increase}: starts now",
                {
                    "queue": request.queue.name,
                    "device_class": class_name,
                    "nominal": check.nominal + increase,
                },
            )
            # A quota change moves the queue in the fair-share order, so only a full re-run can tell.
            if _admitted_after(snapshot, request.id, suggestion, self.rerun):
                return suggestion
        return None


def _own_requirement(request: Request) -> bool:
    """Whether the required level is the workload's own choice, which its submitter may change: one its
    resource class sets is the class's promise (a training class keeps its gangs in one rack), and
    relaxing it is no change the submit form or the API offers within the class."""
    own = request.workload.topology_required
    resource_class = request.resource_class
    return bool(own) and (resource_class is None or own != resource_class.topology_required)


def _admitted_after(snapshot: Snapshot, workload_id: str, suggestion: Suggestion, rerun) -> bool:
    changed = apply_suggestion(snapshot, workload_id, suggestion)
    changed = replace(changed, config=replace(changed.config, suggestions=False, explain=False))
    return any(admission.workload_id == workload_id for admission in rerun(changed).admissions)


def apply_suggestion(snapshot: Snapshot, workload_id: str, suggestion: Suggestion) -> Snapshot:
    """The snapshot with the suggested change made (to verify it, or to show what it would do)."""
    change = suggestion.change
    if suggestion.kind == "IncreaseQuota":
        queues = tuple(
            replace(queue, quota={**(queue.quota or {}), change["device_class"]: change["nominal"]})
            if queue.name == change["queue"]
            else queue
            for queue in snapshot.queues
        )
        return replace(snapshot, queues=queues)
    pending = tuple(
        _changed_workload(workload, change) if workload.id == workload_id else workload for workload in snapshot.pending
    )
    return replace(snapshot, pending=pending)


def _changed_workload(workload, change: dict):
    updates = {}
    if "topology_required" in change:
        updates["topology_required"] = change["topology_required"]
    if "topology_preferred" in change:
        updates["topology_preferred"] = change["topology_preferred"]
    pod_sets = list(workload.pod_sets)
    if "device_classes" in change:
        pod_sets = [replace(pod_set, device_classes=tuple(change["device_classes"])) for pod_set in pod_sets]
    for name, counts in change.get("pod_sets", {}).items():
        pod_sets = [_resized(pod_set, counts) if pod_set.name == name else pod_set for pod_set in pod_sets]
    updates["pod_sets"] = tuple(pod_sets)
    return replace(workload, **updates)


def _resized(pod_set: PodSet, counts: dict) -> PodSet:
    return replace(pod_set, count=counts.get("count", pod_set.count), min_count=counts.get("min_count"))


# --- text ---


def pods(count: int) -> str:
    return f"{count} pod" if count == 1 else f"{count} pods"


def _needs_text(request: Request, class_name: str) -> str:
    parts = [
        f"{pods(demand.min_count)} × ({claims.claim_text(demand.claim)})"
        if demand.claim is not None
        else f"{pods(demand.min_count)} × {demand.per_pod} {class_name}"
        for demand in request.demands
    ]
    text = "needs " + " + ".join(parts)
    if len(request.demands) > 1 or request.demands[0].min_count > 1:
        text += f" ({request.needed} in all)"
    if request.required:
        text += f" in one {request.required}"
    return text


def _free_text(focus: dict, few: str = "") -> str:
    """ "no h100" rather than "0 h100"; `few` goes before a count ("only 3 h100")."""
    if not focus["free"]:
        return f"no {focus['device_class']}"
    return f"{few}{focus['free']} {focus['device_class']}"


def _fragmented_text(request: Request, needs: str, focus: dict) -> str:
    largest = focus["largest_free_domain"]
    free = f"{needs}; {focus['free']} {focus['device_class']} free in the cluster"
    if largest["level"] == NODE_LEVEL:
        biggest_pod = max(demand.per_pod for demand in request.demands)
        if largest["free"] >= biggest_pod:
            # Every pod fits some node: the binding constraint is the arrangement, never "at most N".
            matched = " sharing the matched attribute" if any(d.match_attribute for d in request.demands) else ""
            return f"{free}, but the nodes' free devices ({_node_counts_text(largest)}) cannot hold its pods{matched}"
        name = f" ({largest['name']})" if largest["name"] else ""
        return f"{free}, at most {largest['free']} free in any node{name}"
    if largest["free"] >= request.needed:
        # Enough devices in the best domain, in the wrong shape: say so, never "at most N" with N >= needed.
        return (
            f"{free}; {largest['level']} {largest['name']} has the most ({largest['free']}), but its nodes' "
            f"free devices ({_node_counts_text(largest)}) cannot hold the gang's pods"
        )
    return f"{free}, at most {largest['free']} free in any {largest['level']} ({largest['name']})"


def _binding_domain_text(request: Request, focus: dict) -> str:
    """For a gang bound to one domain: the best domain and what is free there, when it is short."""
    largest = focus["largest_free_domain"]
    if not request.required or largest["level"] == NODE_LEVEL or not 0 < largest["free"] < request.needed:
        return ""
    return f", at most {largest['free']} of {request.needed} in any {largest['level']} ({largest['name']})"


def _node_counts_text(largest: dict) -> str:
    counts = largest["nodes"]
    more = largest["nodes_with_free"] - len(counts)
    return ", ".join(map(str, counts)) + (f" and {more} more nodes" if more > 0 else "")


def _owners_text(reserved_by: dict) -> str:
    return ", ".join(f"{team}: {count}" for team, count in sorted(reserved_by.items())) or "none"


def _whole_id(running, workload_id: str) -> str:
    record = running.get(workload_id)
    return record.workload_id if record is not None else workload_id


def _pods_text(count: int) -> str:
    return "1 pod" if count == 1 else f"{count} pods"


def _preemption_message(outcome, running, levels) -> str:
    leaving = []
    for victim in outcome.victims:
        workload = victim.workload
        shrunk = f"{_pods_text(len(workload.pods))}, " if workload.partial else ""
        leaving.append(f"{label(workload)} ({shrunk}{victim.rule}, priority {workload.priority})")
    for workload_id in outcome.waiting_for_evictions:
        record = running.get(workload_id)
        if record is not None and record.part_of is not None:
            # The pods split off a shrunk workload carry its name; their id is not one anybody knows.
            leaving.append(f"{record.name or record.part_of} ({_pods_text(len(record.pods))} being evicted)")
        else:
            leaving.append(f"{workload_id if record is None else label(record)} (being evicted)")
    noun = "victim" if len(leaving) == 1 else "victims"
    return f"waiting for {len(leaving)} {noun} to leave: {', '.join(leaving)}{_why_victims(outcome, levels)}"


def _why_victims(outcome, levels) -> str:
    """Why these victims (preemption.cost_key): the lowest priority first, then pods before groups, then
    the fewest and smallest."""
    if not outcome.victims:
        return ""
    scope = outcome.victim_scope
    where = f"in {levels[len(scope) - 1]} {scope[-1]}" if scope else "in the cluster"
    highest = max(victim.workload.priority for victim in outcome.victims)
    shrunk = all(victim.workload.partial for victim in outcome.victims)
    how = "by shrinking elastic work, " if shrunk else ""
    return (
        f"; chosen lowest priority first, {how}then fewest and smallest: no set of workloads below priority "
        f"{highest} makes room {where}"
    )


def _largest_domain(view: View, level_index: int, level: str) -> dict:
    counts = view.domain_counts(level_index)
    if not counts:
        return {"level": level, "name": None, "free": 0}
    # The most free devices, ties to the first name: the maximum at C speed, then only its holders
    # compared (at the node level there are as many domains as nodes).
    most = max(counts.values())
    key = min(key for key, count in counts.items() if count == most)
    largest = {"level": level, "name": key[-1], "free": most}
    # Free devices per node there (every node at the node level), most first: the shape a gang's pods
    # must fit; kept short, as the details are stored with every explanation.
    nodes = view.state.nodes_of(key if level != NODE_LEVEL else ROOT)
    counts = list(filter(None, view.node_counts(nodes)))
    largest["nodes"] = nlargest(8, counts)
    largest["nodes_with_free"] = len(counts)
    return largest


def _why_never(view: View, request: Request, class_name: str) -> str:
    state = view.state
    total = view.total()
    if total == 0:
        return f"no device in the cluster matches device class {class_name}"
    largest_pod = max(demand.per_pod for demand in request.demands)
    biggest_node = max(view.node_count(node) for node in range(len(state.node_names)))
    if largest_pod > biggest_node:
        return f"needs {largest_pod} {class_name} per pod; the largest node has {biggest_node}"
    if request.needed > total:
        return f"needs {request.needed} {class_name}; the whole cluster has {total}"
    if request.required:
        level_index = state.levels.index(request.required)
        largest = _largest_domain(view, level_index, request.required)
        if largest["free"] >= request.needed:
            return (
                f"{_needs_text(request, class_name)}: the largest {request.required} ({largest['name']}) has "
                f"{largest['free']}, but its nodes ({_node_counts_text(largest)}) cannot hold the "
                "gang's pods"
            )
        return (
            f"needs {request.needed} {class_name} in one {request.required}; the largest "
            f"{request.required} ({largest['name']}) has {largest['free']}"
        )
    if any(demand.match_attribute for demand in request.demands):
        return f"no node has enough {class_name} sharing the matched attribute"
    return f"{_needs_text(request, class_name)}: no arrangement of the cluster's nodes holds it"
