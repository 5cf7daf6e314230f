"""One direction of dependency (issue 25): every module of broker/ and dashboard/ sits in one layer, and
imports only from its own layer or those below it, with no import circle anywhere.

1. the pure decision core (broker/scheduler/);
2. models: data and their own invariants, and the hooks through which lower layers announce events;
3. domain services: rules that read and write models in one transaction and announce events;
4. the cycle: load, decide, commit, the executor seam;
5. the edges: Celery tasks, Channels, the REST API, pages, commands, the demo and the replay, settings.

Every import counts, at module level or deferred inside a function alike: a deferred import is still a
dependency, only one that fails later. Tests, benchmarks and migrations are outside the layers.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "dashboard")

CORE, MODELS, SERVICES, CYCLE, EDGES = 1, 2, 3, 4, 5
LAYER_NAMES = {CORE: "core", MODELS: "models", SERVICES: "domain services", CYCLE: "cycle", EDGES: "edges"}

# The first pattern that matches a module's dotted name gives its layer: `*` stands for one name,
# a trailing `**` for one or more.
LAYERS = (
    ("broker.scheduler", CORE),
    ("broker.scheduler.**", CORE),
    # Edges wherever they sit: entry points, wiring (AppConfig.ready connects the hooks), HTTP, sockets, tasks.
    ("broker", EDGES),
    ("broker.settings", EDGES),
    ("broker.celery", EDGES),
    ("broker.asgi", EDGES),
    ("broker.wsgi", EDGES),
    ("broker.urls", EDGES),
    ("broker.live", EDGES),
    ("broker.sockets", EDGES),
    ("broker.api", EDGES),
    ("broker.api.**", EDGES),
    ("broker.*.api", EDGES),
    ("broker.*.api.**", EDGES),
    ("broker.*.apps", EDGES),
    ("broker.*.admin", EDGES),
    ("broker.*.admin_mixins", EDGES),
    ("broker.*.urls", EDGES),
    ("broker.*.views", EDGES),
    ("broker.*.forms", EDGES),
    ("broker.*.filtersets", EDGES),
    ("broker.*.consumers", EDGES),
    ("broker.*.tasks", EDGES),
    ("broker.*.management", EDGES),
    ("broker.*.management.**", EDGES),
    ("broker.*.templatetags", EDGES),
    ("broker.*.templatetags.**", EDGES),
    ("broker.demo", EDGES),
    ("broker.demo.**", EDGES),
    ("broker.cycle.replay", EDGES),
    ("broker.cycle.embedded", EDGES),
    ("broker.governance.notify", EDGES),
    ("broker.governance.access", EDGES),
    ("broker.metrics.collector", EDGES),
    ("dashboard", EDGES),
    ("dashboard.**", EDGES),
    # The cycle: everything else of broker/cycle/.
    ("broker.cycle", CYCLE),
    ("broker.cycle.**", CYCLE),
    # Models and what they need to keep their own invariants.
    ("broker.events", MODELS),
    ("broker.clock", MODELS),
    ("broker.flat_rows", MODELS),
    ("broker.limits", MODELS),
    ("broker.*.models", MODELS),
    ("broker.workloads.states", MODELS),
    ("broker.workloads.fields", MODELS),
    ("broker.workloads.changes", MODELS),
    ("broker.inventory.quantities", MODELS),
    ("broker.policy.roles", MODELS),
    ("broker.inventory", MODELS),
    ("broker.policy", MODELS),
    ("broker.workloads", MODELS),
    ("broker.audit", MODELS),
    ("broker.costs", MODELS),
    ("broker.governance", MODELS),
    ("broker.metrics", MODELS),
    # Domain services: the rest of the apps' modules.
    ("broker.inventory.services", SERVICES),
    ("broker.workloads.services", SERVICES),
    ("broker.governance.*", SERVICES),
    ("broker.costs.*", SERVICES),
    ("broker.metrics.*", SERVICES),
    # The Kubernetes bridge is an edge (its models, matched above, are models); the cycle reaches its
    # outbox only through the decisions_made hook.
    ("broker.kube", EDGES),
    ("broker.kube.**", EDGES),
)


def module_files():
    """{dotted name: path} of every module under the layered packages, migrations left out."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def matches(pattern, module):
    wanted, names = pattern.split("."), module.split(".")
    if wanted[-1] == "**":
        wanted = wanted[:-1]
        if len(names) <= len(wanted):
            return False
        names = names[: len(wanted)]
    return len(wanted) == len(names) and all(w in ("*", n) for w, n in zip(wanted, names, strict=True))


def layer_of(module):
    return next((layer for pattern, layer in LAYERS if matches(pattern, module)), None)


def owning_module(name, modules):
    """The module an imported name lives in: the longest dotted prefix that is one of ours."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module, path, modules):
    """Every module of ours that `module` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            # `from a import b` imports module a.b when there is one, else a name defined in a.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            target = owning_module(name, modules)
            if target is not None and target != module:
                targets.add(target)
    return targets


def import_graph():
    modules = module_files()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def unlayered(graph):
    return sorted(module for module in graph if layer_of(module) is None)


def upward_imports(graph):
    """(importer, its layer, imported, its layer) for each import of a higher layer."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                found.append((module, layer_of(module), target, layer_of(target)))
    return found


def import_circles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_it_places_every_module_in_a_layer(graph):
    assert unlayered(graph) == [], "modules in no layer: add them to LAYERS"


def test_it_finds_no_import_from_a_lower_layer_to_a_higher_one(graph):
    lines = [
        f"{module} ({LAYER_NAMES[below]}) imports {target} ({LAYER_NAMES[above]})"
        for module, below, target, above in upward_imports(graph)
    ]
    assert lines == [], "upward imports:\n" + "\n".join(lines)


def test_it_finds_no_import_circle(graph):
    circles = import_circles(graph)
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(circle) for circle in circles)


def test_it_reads_deferred_and_relative_imports():
    modules = {"pkg", "pkg.low", "pkg.high", "pkg.sub", "pkg.sub.leaf"}
    source = "from . import low\n\ndef later():\n    from pkg.high import thing\n    from .sub import leaf\n"
    path = ROOT / "var" / "layers-probe" / "pkg" / "mod.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    assert imports_of("pkg.mod", path, modules) == {"pkg.low", "pkg.high", "pkg.sub.leaf"}


def test_it_names_a_circle_and_an_upward_import():
    graph = {
        "broker.cycle.loader": {"broker.governance.approvals"},
        "broker.governance.approvals": {"broker.cycle.loader"},
        "broker.scheduler.cycle": set(),
    }
    assert import_circles(graph) == [["broker.cycle.loader", "broker.governance.approvals"]]
    assert upward_imports(graph) == [("broker.governance.approvals", SERVICES, "broker.cycle.loader", CYCLE)]
