"""An exact search for gangs the fullest-first packer cannot place: several pod sets of different pod
sizes inside one domain (a rack, a block, the cluster).

Placing pods of several sizes on nodes is bin packing; the packer's one greedy order misses feasible
placements (two nodes with 6 and 4 free devices hold 2 pods × 3 + 2 pods × 2 only with both 3s on the
6). This search is complete: it answers "no placement" only when none exists, within its step budget.

- It goes node by node, fullest first (as the packer), and chooses how many pods of each pod set the
  node takes, the fullest filling first; a failure is remembered by (node, pods still to place), so
  nodes that look alike and pods that are alike are never tried twice in another order.
- Pruning: the devices still needed fit in the nodes left, and for every pod size the pods at least
  that large fit in them by whole pods.
- Nodes that look alike to the gang (free count, and with a matchAttribute the free devices per value
  of the attribute) are one class; a class keeps at most as many nodes as the gang has pods, as no
  placement uses more, so a large scope costs no more than a rack.
- Gangs of up to EXACT_PODS pods (min_counts summed) are searched, for at most STEP_BUDGET node
  choices (tests/scheduler/test_gang_search.py measures how far under it random domains stay). Larger
  gangs, or a search that spends its budget, keep the packer's answer (a heuristic; the same test
  measures how often the search places a gang the packer misses).
- One matchAttribute name per gang (pods of sets without one may take any device); a gang whose pod sets
  match on different attributes keeps the packer's answer.
Pure and deterministic: the first placement in this order is returned.
"""

from __future__ import annotations

EXACT_PODS = 64
STEP_BUDGET = 20_000


class OutOfSteps(Exception):
    """The search spent its budget without an answer."""


class _Node:
    __slots__ = ("node", "free", "groups")

    def __init__(self, node: int, free: int, groups: dict):
        self.node = node
        self.free = free
        self.groups = groups  # attribute value -> free devices carrying it


class Search:
    """One search: `run()` returns node -> [(demand index, pods)] for the required pods, or None."""

    def __init__(self, demands, node_slots: dict[int, list], order: dict[int, tuple], attribute: str | None):
        self.demands = demands
        self.attribute = attribute
        # Pods of one size that match alike are interchangeable whichever pod set they belong to: the
        # search places kinds of pods, and `run` hands each kind's places back to its pod sets.
        self.kinds: list[tuple[int, bool]] = []
        self.kind_of: list[int] = []
        for demand in demands:
            kind = (demand.per_pod, bool(demand.match_attribute))
            if kind not in self.kinds:
                self.kinds.append(kind)
            self.kind_of.append(self.kinds.index(kind))
        self.sizes = tuple(size for size, _ in self.kinds)
        self.matched = tuple(matched for _, matched in self.kinds)
        self.steps = 0
        self.failed: set = set()
        self._fits_memo: dict = {}
        pods = sum(demand.min_count for demand in demands)
        kept: dict[tuple, int] = {}
        self.nodes: list[_Node] = []
        for node in sorted(node_slots, key=order.__getitem__):
            slots = node_slots[node]
            groups: dict = {}
            if attribute:
                for slot in slots:
                    if attribute in slot.attributes:
                        value = str(slot.attributes[attribute])
                        groups[value] = groups.get(value, 0) + 1
            signature = (len(slots), tuple(sorted(groups.values(), reverse=True)))
            if kept.get(signature, 0) >= pods:  # no placement uses more nodes of a class than it has pods
                continue
            kept[signature] = kept.get(signature, 0) + 1
            self.nodes.append(_Node(node, len(slots), groups))
        # Suffix sums for the bounds: free devices, and whole pods of each size, from each node on.
        distinct = sorted(set(self.sizes))
        count = len(self.nodes)
        self.suffix_free = [0] * (count + 1)
        self.suffix_fit = {size: [0] * (count + 1) for size in distinct}
        for position in range(count - 1, -1, -1):
            free = self.nodes[position].free
            self.suffix_free[position] = self.suffix_free[position + 1] + free
            for size in distinct:
                self.suffix_fit[size][position] = self.suffix_fit[size][position + 1] + free // size
        self.chosen: list[tuple[int, tuple]] = []

    def run(self) -> dict | None:
        """node -> [(demand index, pods)] for every pod set's min_count, or None when none exists."""
        remaining = [0] * len(self.kinds)
        for demand, kind in zip(self.demands, self.kind_of, strict=True):
            remaining[kind] += demand.min_count
        if not self._place(0, tuple(remaining)):
            return None
        owed = [demand.min_count for demand in self.demands]  # each pod set's pods still to hand out
        found: dict[int, list] = {}
        for position, counts in self.chosen:
            taken = []
            for kind, count in enumerate(counts):
                for index, demand_kind in enumerate(self.kind_of):
                    if demand_kind == kind and count and owed[index]:
                        share = min(count, owed[index])
                        owed[index] -= share
                        count -= share
                        taken.append((index, share))
            found[self.nodes[position].node] = taken
        return found

    def _place(self, position: int, remaining: tuple) -> bool:
        if not any(remaining):
            return True
        if position == len(self.nodes):
            return False
        self.steps += 1
        if self.steps > STEP_BUDGET:
            raise OutOfSteps
        key = (position, remaining)
        if key in self.failed or not self._bounds_hold(position, remaining):
            return False
        for counts in self._fillings(self.nodes[position], remaining):
            if any(counts):
                self.chosen.append((position, counts))
            left = tuple(have - take for have, take in zip(remaining, counts, strict=True))
            if self._place(position + 1, left):
                return True
            if any(counts):
                self.chosen.pop()
        self.failed.add(key)
        return False

    def _bounds_hold(self, position: int, remaining: tuple) -> bool:
        sizes = self.sizes
        needed = sum(count * size for count, size in zip(remaining, sizes, strict=True))
        if needed > self.suffix_free[position]:
            return False
        for size, fits in self.suffix_fit.items():
            at_least = sum(count for count, other in zip(remaining, sizes, strict=True) if other >= size)
            if at_least > fits[position]:
                return False
        return True

    def _fillings(self, node: _Node, remaining: tuple) -> list[tuple]:
        """Pod counts per pod set the node can take, the fullest filling first (larger pods first among
        equals); the empty filling last."""
        sizes = self.sizes
        fillings = []

        def extend(index: int, free: int, counts: list) -> None:
            if index == len(sizes):
                fillings.append(tuple(counts))
                return
            most = min(remaining[index], free // sizes[index])
            for count in range(most, -1, -1):
                counts.append(count)
                extend(index + 1, free - count * sizes[index], counts)
                counts.pop()

        extend(0, node.free, [])
        if self.attribute:
            fillings = [counts for counts in fillings if self._matched_fit(node, counts) is not None]
        fillings.sort(key=lambda counts: (-sum(c * s for c, s in zip(counts, sizes, strict=True)),
                                          tuple(-c * s for c, s in zip(counts, sizes, strict=True))))  # fmt: skip
        return fillings

    def _matched_fit(self, node: _Node, counts: tuple) -> dict | None:
        """Attribute value per matched pod ((demand index, pod) -> value) so that every matched pod lies
        within one value's devices, or None; pods without a matchAttribute take whatever is left."""
        pods = sorted(
            ((self.sizes[index], index) for index, count in enumerate(counts) if self.matched[index]
             for _ in range(count)),
            reverse=True,
        )  # fmt: skip
        key = (tuple(sorted(node.groups.items())), tuple(pods))
        if key in self._fits_memo:
            return self._fits_memo[key]
        left = dict(node.groups)
        values = sorted(left)
        assigned: list[str] = []

        def fit(at: int) -> bool:
            if at == len(pods):
                return True
            size = pods[at][0]
            tried = set()
            for value in values:
                if left[value] >= size and left[value] not in tried:
                    tried.add(left[value])
                    left[value] -= size
                    assigned.append(value)
                    if fit(at + 1):
                        return True
                    assigned.pop()
                    left[value] += size
            return False

        answer = None
        if fit(0):
            answer = {}
            for (_, index), value in zip(pods, assigned, strict=True):
                answer.setdefault(index, []).append(value)
        self._fits_memo[key] = answer
        return answer


def gang_attribute(demands) -> tuple[bool, str | None]:
    """(searchable, the one matchAttribute the gang's pod sets use or None)."""
    names = {demand.match_attribute for demand in demands if demand.match_attribute}
    if len(names) > 1:
        return False, None
    return True, next(iter(names), None)


def search(demands, node_slots: dict[int, list], order: dict[int, tuple]) -> dict | None:
    """Pods for every pod set's min_count on the given nodes, or None when no placement exists (or the
    gang is too large, or the budget ran out: then the caller's answer stands).

    node_slots: node -> its free usable slots in the order they should be taken (placement's View);
    order: node -> sort key, the preferred nodes first (fullest first).
    Returns node -> list of (demand index, slots) pods."""
    searchable, attribute = gang_attribute(demands)
    if not searchable or sum(demand.min_count for demand in demands) > EXACT_PODS:
        return None
    finder = Search(demands, node_slots, order, attribute)
    try:
        found = finder.run()
    except OutOfSteps:
        return None
    if found is None:
        return None
    return _assign_slots(finder, found, node_slots, attribute)


def _assign_slots(finder: Search, found: dict, node_slots, attribute) -> dict:
    """The concrete slots of each pod: on each node matched pods take devices of their value, then the
    others take what is left, each in the node's own slot order."""
    nodes = {entry.node: entry for entry in finder.nodes}
    result: dict[int, list] = {}
    for node, taken in found.items():
        counts = [0] * len(finder.kinds)
        for index, count in taken:
            counts[finder.kind_of[index]] += count
        # A copy: the answer is memoised for every node alike to this one, and its lists are popped here.
        fit = finder._matched_fit(nodes[node], tuple(counts)) if attribute else None
        values = {kind: list(chosen) for kind, chosen in fit.items()} if fit is not None else None
        left = list(node_slots[node])
        pods = []
        for index, count in sorted(taken, key=lambda entry: not finder.matched[finder.kind_of[entry[0]]]):
            kind = finder.kind_of[index]
            per_pod = finder.sizes[kind]
            for _ in range(count):
                if finder.matched[kind]:
                    value = values[kind].pop()
                    fitting = [slot for slot in left if attribute in slot.attributes
                               and str(slot.attributes[attribute]) == value][:per_pod]  # fmt: skip
                else:
                    fitting = left[:per_pod]
                chosen = {id(slot) for slot in fitting}
                left = [slot for slot in left if id(slot) not in chosen]
                pods.append((index, fitting))
        result[node] = pods
    return result


class _Unit:
    """A free device as the search sees it when only counts are known (no attributes to match)."""

    attributes: dict = {}


def fits_counts(demands, node_counts: list[int]) -> bool:
    """Whether the gang's required pods fit nodes with these free device counts (no matchAttribute):
    the search for gangs up to EXACT_PODS pods, whole pods per pod set and in all above it (a bound)."""
    needed = sum(demand.min_count * demand.per_pod for demand in demands)
    if needed > sum(node_counts):
        return False
    for demand in demands:
        if sum(count // demand.per_pod for count in node_counts) < demand.min_count:
            return False
    if sum(demand.min_count for demand in demands) > EXACT_PODS:
        return True
    unit = _Unit()
    node_slots = {node: [unit] * count for node, count in enumerate(node_counts) if count}
    order = {node: (count, node) for node, count in enumerate(node_counts)}
    try:
        return (
            Search(tuple(d._replace(match_attribute=None) for d in demands), node_slots, order, None).run() is not None
        )
    except OutOfSteps:
        return True


def domain_for_gang(domains: dict, demands) -> str | None:
    """The domain a reservation for the gang should pin (issue 27: an approval's reservation must be
    usable by the gang it was made for): among domains whose nodes, as built, hold the gang, the one
    with the most devices free now, then by name. `domains`: name -> (devices per node as built, free
    now). None when no domain holds it."""
    fitting = [(-free, name) for name, (built, free) in domains.items() if fits_counts(demands, built)]
    return min(fitting)[1] if fitting else None
