"""A Kubernetes API server for the tests, on localhost HTTP, built on KMock (PyPI `kmock`).

KMock serves the HTTP side: the aiohttp server, request parsing into Kubernetes terms (resource,
namespace, name, subresource, action), errors rendered as `Status` objects, and a record of every request
for assertions. Its own stateful emulator keeps no resource versions, so this adds what the broker's
client relies on and KMock lacks:

- a resourceVersion on every object and list, one counter for the whole server as etcd's revision;
- watches from a resourceVersion (ADDED / MODIFIED / DELETED replayed from the history, then live),
  BOOKMARK events when asked for, `timeoutSeconds`, and `410 Gone` (an ERROR event, as the real server
  streams it) for a version older than the last compaction;
- `409 Conflict` for a write that carries a stale resourceVersion, and `409 AlreadyExists`;
- the `status` subresource (replace and patch), merge and JSON patches, equality label and field selectors;
- the pods' `binding` subresource (409 when already bound) and `eviction` subresource;
- the validation the models cannot express that the broker relies on (a ResourceSlice publishes devices
  or shared counters, not both; a PriorityClass's value and preemptionPolicy cannot be updated).

Every object stored is deserialized into the official client's own model (and its keys checked against
what the model serializes back), so what is served cannot drift from the real shapes. The server runs
on its own event loop in a thread, so the synchronous Django tests and the synchronous client can use it.
"""

import asyncio
import bisect
import copy
import json
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace

import jsonpatch
import kmock
from kubernetes import client

API = client.ApiClient()


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    model: str
    namespaced: bool
    status: bool = True  # has a status subresource

    @property
    def api_version(self):
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS = {
    kind.plural: kind
    for kind in (
        Kind("", "v1", "nodes", "Node", "V1Node", False),
        Kind("", "v1", "pods", "Pod", "V1Pod", True),
        Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", "V1ResourceSlice", False, status=False),
        Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", "V1DeviceClass", False, status=False),
        Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", "ResourceV1ResourceClaim", True),
        Kind("resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule", "V1beta2DeviceTaintRule", False),
        Kind("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup", "V1alpha2PodGroup", True),
        Kind("scheduling.k8s.io", "v1alpha2", "workloads", "Workload", "V1alpha2Workload", True, status=False),
        Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", "V1PriorityClass", False, status=False),
    )
}
BY_KIND = {kind.kind: kind for kind in KINDS.values()}


class ShapeError(ValueError):
    """An object the client's models cannot represent."""


def to_dict(obj):
    """A client model (or a dict) as the JSON the API server speaks."""
    return API.sanitize_for_serialization(obj)


def as_model(data, model):
    return API.deserialize(SimpleNamespace(data=json.dumps(data)), model)


def same_keys(sent, served, path="") -> list:
    """Where `served` (the model's serialization) lost keys of `sent`: a misspelled or unknown field."""
    if isinstance(sent, dict) and isinstance(served, dict):
        missing = [f"{path}.{key}" for key in sent if key not in served and sent[key] is not None]
        return missing + [
            problem for key in sent if key in served for problem in same_keys(sent[key], served[key], f"{path}.{key}")
        ]
    if isinstance(sent, list) and isinstance(served, list):
        return [
            problem
            for i, (a, b) in enumerate(zip(sent, served, strict=False))
            for problem in same_keys(a, b, f"{path}[{i}]")
        ]
    return []


def checked(kind, data):
    """`data` deserialized into the client's model and back; raises ShapeError if it does not fit."""
    if data.get("metadata", {}).get("name") is None:
        raise ShapeError(f"{kind.kind} needs metadata.name")
    try:
        model = as_model(data, kind.model)
    except (ValueError, TypeError) as error:
        raise ShapeError(f"{kind.kind} does not fit {kind.model}: {error}") from error
    lost = same_keys(data, to_dict(model))
    if lost:
        raise ShapeError(f"{kind.kind} has fields {kind.model} does not know: {', '.join(lost)}")
    return data


def defaulted(kind, data):
    """The defaults the API server fills in that the broker reads."""
    if kind.kind == "PriorityClass" and not data.get("preemptionPolicy"):
        data["preemptionPolicy"] = "PreemptLowerPriority"
    return data


def validated(kind, data, current=None):
    """What the API server's validation refuses that the models cannot: `data` (replacing `current`, if
    given), or raises ShapeError."""
    if kind.kind == "ResourceSlice":
        spec = data.get("spec") or {}
        if spec.get("devices") and spec.get("sharedCounters"):
            raise ShapeError("ResourceSlice: only one of devices and sharedCounters may be set")
    if kind.kind == "PriorityClass":
        if data.get("value") is None:
            raise ShapeError("PriorityClass: value: Required value")
        if current is not None:
            # ValidatePriorityClassUpdate: a new value is a new PriorityClass (delete, then create).
            for field in ("value", "preemptionPolicy"):
                if data.get(field) != current.get(field):
                    raise ShapeError(f"PriorityClass: {field}: Forbidden: may not be changed in an update.")
    return data


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def dotted(obj, path):
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def selected(obj, params):
    """Equality-based labelSelector and fieldSelector (`a=b,c!=d`)."""
    for selector, lookup in (
        (params.get("labelSelector", ""), lambda key: (obj.get("metadata", {}).get("labels") or {}).get(key)),
        (params.get("fieldSelector", ""), lambda key: dotted(obj, key)),
    ):
        for term in filter(None, selector.split(",")):
            if "!=" in term:
                key, value = term.split("!=", 1)
                if str(lookup(key) or "") == value:
                    return False
            else:
                key, value = term.split("=", 1)
                if str(lookup(key.rstrip("=")) or "") != value:
                    return False
    return True


def status_error(code, reason, message, **details):
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details or {"causes": []})


class ApiServer(kmock.KubernetesScaffold):
    """The stateful part. All of its state is touched on its event loop only."""

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        self.objects = {}  # (plural, namespace, name) -> dict
        self.revision = 0
        self.history = []  # (revision, plural, event), in revision order
        self.history_revisions = []  # the revisions alone, to find where a watch resumes (bisect)
        self.compacted = 0  # watches from before this revision get 410 Gone
        self.bookmark_seconds = 1.0
        self.changed = asyncio.Event()
        self.faults = []  # [method, subresource, status, times] injected before the normal reaction

    async def _handle(self, request):
        # Straight to the resources' handler: KMock matches a request against its reactions by checking
        # it among every request each has seen, which grows with the requests served (100 ms a request
        # after a few thousand); its discovery and fallbacks still answer the other paths.
        if request.resource is None:
            return await super()._handle(request)
        result = await self.serve(request)
        response = result if isinstance(result, kmock.Response) else kmock.Response(payload=result)
        return await response(request)

    # --- state ---------------------------------------------------------------------------------------

    def next_revision(self):
        self.revision += 1
        return str(self.revision)

    def publish(self, kind, kind_of_event, obj):
        self.history.append((self.revision, kind.plural, {"type": kind_of_event, "object": copy.deepcopy(obj)}))
        self.history_revisions.append(self.revision)
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def store(self, kind, data, event):
        meta = data["metadata"]
        meta["resourceVersion"] = self.next_revision()
        key = (kind.plural, meta.get("namespace") if kind.namespaced else None, meta["name"])
        self.objects[key] = data
        self.publish(kind, event, data)
        return data

    def create(self, kind, data, namespace=None):
        data = copy.deepcopy(data)
        data.update(apiVersion=kind.api_version, kind=kind.kind)
        meta = data.setdefault("metadata", {})
        if kind.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        validated(kind, checked(kind, defaulted(kind, data)))
        key = (kind.plural, meta.get("namespace"), meta["name"])
        if key in self.objects:
            raise status_error(409, "AlreadyExists", f'{kind.plural} "{meta["name"]}" already exists')
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["generation"] = 1
        return self.store(kind, data, "ADDED")

    def existing(self, kind, namespace, name):
        obj = self.objects.get((kind.plural, namespace if kind.namespaced else None, name))
        if obj is None:
            raise status_error(404, "NotFound", f'{kind.plural} "{name}" not found', name=name, kind=kind.plural)
        return obj

    def replace(self, kind, namespace, name, data, subresource=None):
        current = self.existing(kind, namespace, name)
        wanted = (data.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise status_error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                name=name,
                kind=kind.plural,
            )
        updated = copy.deepcopy(current)
        if subresource == "status":
            updated["status"] = copy.deepcopy(data.get("status"))
        else:
            updated = copy.deepcopy(data)
            updated["metadata"] = {**current["metadata"], **(data.get("metadata") or {})}
            updated["status"] = current.get("status")
            if updated.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        updated = {key: value for key, value in updated.items() if value is not None}
        updated.update(apiVersion=kind.api_version, kind=kind.kind)
        validated(kind, checked(kind, defaulted(kind, updated)), current)
        return self.store(kind, updated, "MODIFIED")

    def patch(self, kind, namespace, name, body, content_type, subresource=None):
        current = self.existing(kind, namespace, name)
        if "json-patch" in content_type:
            if not isinstance(body, list):
                raise status_error(400, "BadRequest", "a JSON patch must be a list of operations")
            patched = jsonpatch.apply_patch(current, body)
        else:
            patched = merge_patch(current, body)
        if subresource == "status":
            patched = {**current, "status": patched.get("status")}
        else:
            patched["status"] = current.get("status")
        patched["metadata"] = {**patched["metadata"], "resourceVersion": patched["metadata"]["resourceVersion"]}
        return self.replace(kind, namespace, name, patched, subresource)

    def delete(self, kind, namespace, name):
        obj = self.existing(kind, namespace, name)
        del self.objects[(kind.plural, namespace if kind.namespaced else None, name)]
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self.next_revision()
        self.publish(kind, "DELETED", obj)
        return obj

    def listed(self, kind, namespace, params):
        return [
            obj
            for (plural, ns, _), obj in sorted(self.objects.items())
            if plural == kind.plural and (namespace is None or ns == namespace) and selected(obj, params)
        ]

    # --- HTTP ----------------------------------------------------------------------------------------

    async def serve(self, request):
        kind = KINDS.get(request.resource.plural)
        if kind is None or kind.group != request.resource.group or kind.version != request.resource.version:
            raise status_error(
                404, "NotFound", f"the server could not find the requested resource ({request.url.path})"
            )
        method = request.method.upper()
        for fault in self.faults:
            if fault[0] == method and fault[1] == request.subresource and fault[3] > 0:
                if fault[4] > 0:
                    fault[4] -= 1
                    continue
                fault[3] -= 1
                if fault[5]:
                    await asyncio.sleep(fault[5])  # a server that hangs: the client is killed meanwhile
                raise status_error(fault[2], "Conflict" if fault[2] == 409 else "InternalError", "injected fault")
        namespace, name, sub = request.namespace, request.name, request.subresource
        try:
            if method == "GET" and str(request.params.get("watch")).lower() in ("true", "1"):
                return self.watch(kind, namespace, request.params)
            if method == "GET" and name is None:
                return {
                    "apiVersion": kind.api_version,
                    "kind": f"{kind.kind}List",
                    "metadata": {"resourceVersion": str(self.revision)},
                    "items": self.listed(kind, namespace, request.params),
                }
            if method == "GET":
                return self.existing(kind, namespace, name)
            if method == "POST" and name is None:
                return kmock.Response(status=201, payload=self.create(kind, request.data, namespace))
            if method == "POST" and sub == "binding" and kind.plural == "pods":
                return kmock.Response(status=201, payload=self.bind(namespace, name, request.data))
            if method == "POST" and sub == "eviction" and kind.plural == "pods":
                self.delete(kind, namespace, name)
                return kmock.Response(status=201, payload=success("eviction"))
            if method == "PUT":
                return self.replace(kind, namespace, name, request.data, sub)
            if method == "PATCH":
                return self.patch(
                    kind,
                    namespace,
                    name,
                    request.data,
                    next((v for k, v in request.headers.items() if k.lower() == "content-type"), ""),
                    sub,
                )
            if method == "DELETE":
                return self.delete(kind, namespace, name)
        except ShapeError as error:
            raise status_error(422, "Invalid", str(error)) from error
        raise status_error(405, "MethodNotAllowed", f"{method} {request.url.path} is not served")

    def bind(self, namespace, name, body):
        pod = self.existing(KINDS["pods"], namespace, name)
        node = ((body or {}).get("target") or {}).get("name")
        if not node:
            raise status_error(422, "Invalid", "binding.target.name: Required value")
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            raise status_error(409, "Conflict", f'pod {name} is already assigned to node "{bound}"')
        updated = copy.deepcopy(pod)
        updated["spec"]["nodeName"] = node
        updated["status"] = {**(updated.get("status") or {}), "phase": "Pending"}
        self.store(KINDS["pods"], updated, "MODIFIED")
        return success("binding")

    async def watch(self, kind, namespace, params):
        since = params.get("resourceVersion") or "0"
        timeout = float(params.get("timeoutSeconds") or 3600)
        bookmarks = str(params.get("allowWatchBookmarks")).lower() in ("true", "1")
        deadline = asyncio.get_running_loop().time() + timeout
        yield b""
        if since == "0":
            seen = self.revision
            for obj in self.listed(kind, namespace, params):
                yield {"type": "ADDED", "object": obj}
        else:
            seen = int(since)
            if seen < self.compacted:
                yield {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": f"too old resource version: {seen} ({self.compacted})",
                        "reason": "Expired",
                        "code": 410,
                    },
                }
                return
        loop = asyncio.get_running_loop()
        while True:
            changed = self.changed
            start = bisect.bisect_right(self.history_revisions, seen)
            for _revision, plural, event in self.history[start:]:
                if plural == kind.plural:
                    meta = event["object"]["metadata"]
                    if (namespace is None or meta.get("namespace") == namespace) and selected(event["object"], params):
                        yield event
            seen = self.revision
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(changed.wait(), min(remaining, self.bookmark_seconds))
            except TimeoutError:
                if bookmarks:
                    yield {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind.kind,
                            "apiVersion": kind.api_version,
                            "metadata": {"resourceVersion": str(self.revision)},
                        },
                    }


def success(what):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201, "details": {}}


class MockCluster:
    """The API server on a thread of its own; every method here is safe to call from the test's thread.

    Objects go in as client models (or their dicts), so a test cannot build a shape the client does not know."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="kube-apiserver", daemon=True)
        self.ready = threading.Event()
        self.handler = None
        self.server = None
        self.url = None

    def __enter__(self):
        self.thread.start()
        if not self.ready.wait(20):
            raise RuntimeError("the mock API server did not start")
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self._stopping.set)
        self.thread.join(20)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self):
        self._stopping = asyncio.Event()
        async with ApiServer() as handler, kmock.Server(handler) as server:
            self.handler, self.server = handler, server
            self.url = str(server.url).rstrip("/")
            self.ready.set()
            await self._stopping.wait()

    def call(self, function, *args):
        async def run():
            return function(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(20)

    # --- what the tests do ---------------------------------------------------------------------------

    def configuration(self):
        configuration = client.Configuration()
        configuration.host = self.url
        return configuration

    def create(self, obj):
        data = to_dict(obj)
        return self.call(self.handler.create, BY_KIND[data["kind"]], data)

    def apply(self, obj):
        """Create, or replace the spec (and metadata) of, the object."""
        data = to_dict(obj)
        kind = BY_KIND[data["kind"]]
        meta = data["metadata"]
        namespace = meta.get("namespace", "default") if kind.namespaced else None
        if self.get(data["kind"], meta["name"], namespace) is None:
            return self.create(data)
        data["metadata"].pop("resourceVersion", None)
        return self.call(self.handler.replace, kind, namespace, meta["name"], data)

    def set_status(self, kind_name, name, status, namespace=None):
        kind = BY_KIND[kind_name]
        return self.call(self.handler.replace, kind, namespace, name, {"metadata": {}, "status": status}, "status")

    def delete(self, kind_name, name, namespace=None):
        return self.call(self.handler.delete, BY_KIND[kind_name], namespace, name)

    def get(self, kind_name, name, namespace=None):
        kind = BY_KIND[kind_name]
        key = (kind.plural, namespace if kind.namespaced else None, name)
        return self.call(lambda: copy.deepcopy(self.handler.objects.get(key)))

    def items(self, kind_name):
        kind = BY_KIND[kind_name]
        return self.call(
            lambda: [copy.deepcopy(o) for (p, _, _), o in sorted(self.handler.objects.items()) if p == kind.plural]
        )

    def compact(self):
        """Forget the history so far: a watch from an older resourceVersion gets 410 Gone."""
        self.call(lambda: setattr(self.handler, "compacted", self.handler.revision + 1))

    def fail(self, method, subresource, status, times=1, after=0, hang=0.0):
        """After `after` more requests of `method` on `subresource` (None: the object itself), the next
        `times` fail with `status`, each after hanging `hang` seconds first."""
        self.call(lambda: self.handler.faults.append([method.upper(), subresource, status, times, after, hang]))

    def requests(self, method, subresource=None, plural=None):
        """The requests KMock recorded, as (method, path)."""

        def pick():
            return [
                (r.method.upper(), r.url.path)
                for r in self.handler._requests
                if r.method.upper() == method.upper()
                and r.subresource == subresource
                and (plural is None or (r.resource is not None and r.resource.plural == plural))
            ]

        return self.call(pick)

    def verbs(self):
        """{(API group, resource or resource/subresource, RBAC verb)} of every request served so far."""

        def verb(request):
            method = request.method.upper()
            if method == "GET":
                if str(request.params.get("watch")).lower() in ("true", "1"):
                    return "watch"
                return "list" if request.name is None else "get"
            return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]

        def collect():
            return {
                (
                    r.resource.group,
                    f"{r.resource.plural}/{r.subresource}" if r.subresource else r.resource.plural,
                    verb(r),
                )
                for r in self.handler._requests
                if r.resource is not None
            }

        return self.call(collect)
