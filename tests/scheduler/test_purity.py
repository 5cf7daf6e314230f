"""The decision core is pure Python over plain data: no framework, no I/O, no clock, no unseeded chance."""

import ast
from pathlib import Path

import broker.scheduler

PACKAGE = Path(broker.scheduler.__file__).parent
FORBIDDEN_MODULES = {
    "django", "celery", "channels", "rest_framework", "psycopg", "psycopg2", "redis", "time", "random",
    "socket", "requests", "urllib", "http", "subprocess", "threading", "multiprocessing", "asyncio",
    "os", "pathlib", "io", "shutil", "sqlite3",
}  # fmt: skip
# Modules allowed an exception, and why: synthetic snapshots draw from a seeded random.Random.
IO_ALLOWED = {"synthetic.py": {"random"}}
FORBIDDEN_CALLS = {
    ("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("time", "sleep"),
    ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
    ("random", "random"), ("random", "randint"), ("random", "choice"), ("random", "shuffle"),
    ("os", "getenv"), ("os", "environ"),
}  # fmt: skip
FORBIDDEN_NAMES = {"open", "input", "print", "eval", "exec", "__import__"}


def modules():
    return sorted(PACKAGE.glob("*.py"))


def imported_roots(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0], node.lineno


def test_it_has_modules_to_check():
    names = {path.name for path in modules()}
    assert {"snapshot.py", "selectors.py", "placement.py", "quota.py", "cycle.py", "scenario.py"} <= names


def test_it_imports_no_framework_io_clock_or_chance():
    problems = []
    for path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        allowed = IO_ALLOWED.get(path.name, set())
        for root, line in imported_roots(tree):
            if root in FORBIDDEN_MODULES and root not in allowed:
                problems.append(f"{path.name}:{line} imports {root}")
    assert not problems, problems


def test_it_reads_no_clock_and_opens_no_files():
    problems = []
    for path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                problems.extend(forbidden_attribute(path, node))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                problems.extend(forbidden_call(path, node))
    assert not problems, problems


def forbidden_attribute(path, node):
    if (node.value.id, node.attr) in FORBIDDEN_CALLS:
        yield f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}"


def forbidden_call(path, node):
    name = node.func.id
    if name in FORBIDDEN_NAMES:
        yield f"{path.name}:{node.lineno} calls {name}()"


def test_it_draws_synthetic_chance_only_from_a_seeded_generator():
    tree = ast.parse((PACKAGE / "synthetic.py").read_text())
    uses = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "random"
    }
    assert uses == {"Random"}


def test_it_finds_a_forbidden_import_when_there_is_one():
    tree = ast.parse("import time\nfrom django.db import models\nx = datetime.now()")
    assert {root for root, _ in imported_roots(tree)} == {"time", "django"}
