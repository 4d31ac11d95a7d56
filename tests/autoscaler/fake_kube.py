"""A local stand-in for kube-apiserver that speaks the real REST API for the endpoints we use.

No kube-apiserver can run on the test machines, so the controller is tested with the real
``kubernetes`` client pointed at this server. Every response has the JSON shape the API server
sends (objects with ``metadata.resourceVersion``, ``Status`` objects for errors with the right
``reason`` and ``code``), optimistic concurrency is enforced on writes that carry a
``resourceVersion``, and faults can be injected per request. Endpoints:

- ``apis/apps/v1/namespaces/{ns}/{deployments,statefulsets}/{name}[/scale]``: GET; the scale
  also PUT, PATCH
- ``api/v1/namespaces/{ns}/pods``: GET with ``labelSelector``
- ``api/v1/namespaces/{ns}/events[/{name}]``: POST; PATCH (merge patch) of one Event
- ``apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}[/status]]``: GET, list, PATCH status
  (a ``metadata.resourceVersion`` in the patch is a precondition, as on the API server)
- ``apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]``: GET, POST, PUT
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client

from tests.http_thread import ThreadedHTTPServer

WORKLOAD_KINDS = {"deployments": "Deployment", "statefulsets": "StatefulSet"}


class ApiError(Exception):
    """Turned into a ``Status`` response by the handler."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status_object(self) -> dict:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any


@dataclass
class FakeKube:
    """The cluster state plus a log of every request the client made."""

    objects: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    # Injected faults: (method, path regex, remaining count, status code, reason)
    faults: list[list] = field(default_factory=list)
    # Other writers racing the client: before each incoming write to a workload's scale, the
    # next count in this list is written first, as a `kubectl scale` or a second controller would
    # (spec.replicas changes and the resourceVersion moves on), so a write that carries the
    # version it read gets 409 and a write that re-read just before it silently overwrites.
    concurrent_scale_changes: list[int] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _rv: itertools.count = field(default_factory=lambda: itertools.count(1000))

    # --- state helpers used by tests -----------------------------------------------------------

    def next_rv(self) -> str:
        return str(next(self._rv))

    def add_workload(
        self,
        namespace: str,
        name: str,
        replicas: int,
        labels: dict[str, str],
        resource: str = "deployments",
        requests: dict[str, str] | None = None,
    ) -> None:
        """A workload whose pod template's one container requests ``requests`` (default: one
        GPU, as :meth:`add_pod`)."""
        template = {
            "metadata": {"labels": dict(labels)},
            "spec": {
                "containers": [
                    {
                        "name": "server",
                        "image": "example/server:1",
                        "resources": {"requests": dict(requests or {"nvidia.com/gpu": "1"})},
                    }
                ]
            },
        }
        with self.lock:
            self.objects[(resource, namespace, name)] = {
                "apiVersion": "apps/v1",
                "kind": WORKLOAD_KINDS[resource],
                "metadata": self._meta(namespace, name),
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": dict(labels)},
                    "template": template,
                },
                "status": {"replicas": replicas},
            }

    def add_pod(
        self,
        namespace: str,
        name: str,
        labels: dict[str, str],
        ready: bool = True,
        start_time: str = "2024-01-01T00:00:00Z",
        phase: str = "Running",
        deleting: bool = False,
        requests: dict[str, str] | None = None,
    ) -> None:
        """A pod whose one container requests ``requests`` (default: one GPU)."""
        if requests is None:
            requests = {"nvidia.com/gpu": "1"}
        with self.lock:
            meta = self._meta(namespace, name)
            meta["labels"] = dict(labels)
            if deleting:
                meta["deletionTimestamp"] = "2024-01-01T00:10:00Z"
            self.objects[("pods", namespace, name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "example/server:1",
                            "resources": {"requests": dict(requests)},
                        }
                    ]
                },
                "status": {
                    "phase": phase,
                    "startTime": start_time,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True" if ready else "False",
                            "lastTransitionTime": start_time,
                        }
                    ],
                },
            }

    def add_custom(self, plural: str, obj: dict) -> None:
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta.update(self._meta(meta.get("namespace", "default"), meta["name"]))
            meta.setdefault("generation", 1)
            self.objects[(plural, meta["namespace"], meta["name"])] = obj

    def get(self, resource: str, namespace: str, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self.objects[(resource, namespace, name)])

    def list(self, resource: str, namespace: str) -> list[dict]:
        with self.lock:
            return [
                copy.deepcopy(o)
                for (r, ns, _), o in sorted(self.objects.items())
                if r == resource and ns == namespace
            ]

    def replicas(self, namespace: str, name: str, resource: str = "deployments") -> int:
        return self.get(resource, namespace, name)["spec"]["replicas"]

    def set_replicas(self, namespace: str, name: str, replicas: int, resource: str = "deployments"):
        """Change a workload's size as another actor (kubectl scale) would."""
        with self.lock:
            obj = self.objects[(resource, namespace, name)]
            obj["spec"]["replicas"] = obj["status"]["replicas"] = replicas
            obj["metadata"]["resourceVersion"] = self.next_rv()

    def inject(self, method: str, path_regex: str, code: int, reason: str, times: int = 1) -> None:
        """Answer the next ``times`` matching requests with an error Status."""
        with self.lock:
            self.faults.append([method, re.compile(path_regex), times, code, reason])

    def writes(self, path_part: str = "") -> list[Request]:
        return [
            r
            for r in self.requests
            if r.method in ("POST", "PUT", "PATCH", "DELETE") and path_part in r.path
        ]

    def events(self, namespace: str) -> list[dict]:
        return self.list("events", namespace)

    def _meta(self, namespace: str, name: str) -> dict:
        return {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": self.next_rv(),
            "creationTimestamp": "2024-01-01T00:00:00Z",
        }

    # --- request dispatch ----------------------------------------------------------------------

    def handle(self, req: Request) -> tuple[int, dict]:
        with self.lock:
            self.requests.append(req)
            for fault in self.faults:
                method, pattern, remaining, code, reason = fault
                if remaining > 0 and method == req.method and pattern.search(req.path):
                    fault[2] -= 1
                    raise ApiError(code, reason, f"injected fault: {reason}")
            for pattern, handler in self._routes():
                m = re.fullmatch(pattern, req.path)
                if m:
                    return handler(req, **m.groupdict())
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({req.path})"
            )

    def _routes(self) -> list[tuple[str, Callable[..., tuple[int, dict]]]]:
        ns = r"(?P<ns>[a-z0-9-]+)"
        name = r"(?P<name>[a-z0-9.-]+)"
        custom = rf"/apis/(?P<group>[a-z0-9.-]+)/(?P<version>v[a-z0-9]+)/namespaces/{ns}"
        custom += r"/(?P<plural>[a-z]+)"
        workload = rf"/apis/apps/v1/namespaces/{ns}/(?P<res>deployments|statefulsets)/{name}"
        leases = rf"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        return [
            (rf"{workload}/scale", self._scale),
            (workload, self._workload),
            (rf"/api/v1/namespaces/{ns}/pods", self._pods),
            (rf"/api/v1/namespaces/{ns}/events", self._events),
            (rf"/api/v1/namespaces/{ns}/events/{name}", self._event),
            (leases, self._leases),
            (rf"{leases}/{name}", self._lease),
            (custom, self._customs),
            (rf"{custom}/{name}(?P<status>/status)?", self._custom),
        ]

    def _not_found(self, resource: str, group: str, name: str) -> ApiError:
        full = f"{resource}.{group}" if group else resource
        return ApiError(
            404,
            "NotFound",
            f'{full} "{name}" not found',
            {"name": name, "group": group, "kind": resource},
        )

    def _conflict(self, resource: str, group: str, name: str) -> ApiError:
        full = f"{resource}.{group}" if group else resource
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {full} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            {"name": name, "group": group, "kind": resource},
        )

    def _scale(self, req: Request, ns: str, res: str, name: str) -> tuple[int, dict]:
        key = (res, ns, name)
        if key not in self.objects:
            raise self._not_found(res, "apps", name)
        obj = self.objects[key]
        if req.method in ("PUT", "PATCH"):
            body = req.body or {}
            if req.method == "PATCH" and "merge-patch" not in req.content_type:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported {req.content_type}")
            if self.concurrent_scale_changes:
                other = self.concurrent_scale_changes.pop(0)
                obj["spec"]["replicas"] = obj["status"]["replicas"] = other
                obj["metadata"]["resourceVersion"] = self.next_rv()
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if req.method == "PUT" and not sent_rv:
                raise ApiError(422, "Invalid", "metadata.resourceVersion: Invalid value: 0x0")
            if sent_rv and sent_rv != obj["metadata"]["resourceVersion"]:
                raise self._conflict(res, "apps", name)
            replicas = (body.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
            obj["spec"]["replicas"] = replicas
            obj["status"]["replicas"] = replicas
            obj["metadata"]["resourceVersion"] = self.next_rv()
        elif req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{req.method} is not allowed on scale")
        labels = obj["spec"]["selector"]["matchLabels"]
        return 200, {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: obj["metadata"][k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            },
            "spec": {"replicas": obj["spec"]["replicas"]},
            "status": {
                "replicas": obj["status"]["replicas"],
                "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            },
        }

    def _workload(self, req: Request, ns: str, res: str, name: str) -> tuple[int, dict]:
        if req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"only get is served for {res} here")
        if (res, ns, name) not in self.objects:
            raise self._not_found(res, "apps", name)
        return 200, copy.deepcopy(self.objects[(res, ns, name)])

    def _pods(self, req: Request, ns: str) -> tuple[int, dict]:
        if req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", "only list is served for pods here")
        selector = parse_label_selector((req.query.get("labelSelector") or [""])[0])
        items = [p for p in self.list("pods", ns) if selector(p["metadata"].get("labels") or {})]
        return 200, {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": self.next_rv()},
            "items": items,
        }

    def _events(self, req: Request, ns: str) -> tuple[int, dict]:
        if req.method != "POST":
            raise ApiError(405, "MethodNotAllowed", "only create is served for events here")
        body = copy.deepcopy(req.body)
        meta = body.setdefault("metadata", {})
        if "name" not in meta:
            if "generateName" not in meta:
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        missing = [k for k in ("involvedObject", "reason", "message", "type") if not body.get(k)]
        if missing:
            raise ApiError(422, "Invalid", f"{missing[0]}: Required value")
        meta.update(self._meta(ns, meta["name"]))
        self.objects[("events", ns, meta["name"])] = body
        return 201, body

    def _event(self, req: Request, ns: str, name: str) -> tuple[int, dict]:
        if req.method != "PATCH":
            raise ApiError(405, "MethodNotAllowed", "only patch is served for an event here")
        if "merge-patch" not in req.content_type:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported {req.content_type}")
        key = ("events", ns, name)
        if key not in self.objects:
            raise self._not_found("events", "", name)
        event = self.objects[key]
        event.update(copy.deepcopy(req.body or {}))
        event["metadata"]["resourceVersion"] = self.next_rv()
        return 200, event

    def expire_events(self, namespace: str) -> None:
        """Drop every Event, as the API server does once their TTL (1 h by default) passes."""
        with self.lock:
            for key in [k for k in self.objects if k[0] == "events" and k[1] == namespace]:
                del self.objects[key]

    def _leases(self, req: Request, ns: str) -> tuple[int, dict]:
        if req.method != "POST":
            raise ApiError(405, "MethodNotAllowed", "only create is served for the lease list")
        body = copy.deepcopy(req.body)
        name = body["metadata"]["name"]
        if ("leases", ns, name) in self.objects:
            raise ApiError(
                409,
                "AlreadyExists",
                f'leases.coordination.k8s.io "{name}" already exists',
                {"name": name, "group": "coordination.k8s.io", "kind": "leases"},
            )
        body["metadata"].update(self._meta(ns, name))
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        body.setdefault("kind", "Lease")
        self.objects[("leases", ns, name)] = body
        return 201, copy.deepcopy(body)

    def _lease(self, req: Request, ns: str, name: str) -> tuple[int, dict]:
        key = ("leases", ns, name)
        if key not in self.objects:
            raise self._not_found("leases", "coordination.k8s.io", name)
        if req.method == "PUT":
            body = copy.deepcopy(req.body)
            if (
                body["metadata"].get("resourceVersion")
                != self.objects[key]["metadata"]["resourceVersion"]
            ):
                raise self._conflict("leases", "coordination.k8s.io", name)
            body["metadata"]["resourceVersion"] = self.next_rv()
            self.objects[key] = body
        elif req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{req.method} is not served for leases")
        return 200, copy.deepcopy(self.objects[key])

    def _customs(self, req: Request, group: str, version: str, ns: str, plural: str):
        if req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", "only list is served here")
        return 200, {
            "apiVersion": f"{group}/{version}",
            "kind": "GPUAutoscalerList",
            "metadata": {"resourceVersion": self.next_rv()},
            "items": self.list(plural, ns),
        }

    def _custom(self, req, group, version, ns, plural, name, status=None):
        key = (plural, ns, name)
        if key not in self.objects:
            raise self._not_found(plural, group, name)
        obj = self.objects[key]
        if req.method == "PATCH":
            if not status:
                raise ApiError(405, "MethodNotAllowed", "only the status is patched here")
            if "merge-patch" not in req.content_type:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported {req.content_type}")
            patch = req.body or {}
            sent_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != obj["metadata"]["resourceVersion"]:
                raise self._conflict(plural, group, name)  # a resourceVersion is a precondition
            # The status subresource ignores everything but .status.
            obj["status"] = merge_patch(obj.get("status") or {}, patch.get("status") or {})
            obj["metadata"]["resourceVersion"] = self.next_rv()
        elif req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{req.method} is not served here")
        return 200, copy.deepcopy(obj)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: null deletes, objects merge, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_SET_RE = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def parse_label_selector(text: str) -> Callable[[dict[str, str]], bool]:
    """A matcher for label selectors (``a=b``, ``a!=b``, ``a in (x,y)``, ``!a``, ``a``)."""
    clauses: list[Callable[[dict[str, str]], bool]] = []
    for part in _split_selector(text):
        part = part.strip()
        if not part:
            continue
        m = _SET_RE.match(part)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                clauses.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                clauses.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif "!=" in part:
            key, value = (s.strip() for s in part.split("!=", 1))
            clauses.append(lambda lb, k=key, v=value: lb.get(k) != v)
        elif "=" in part:
            key, value = (s.strip() for s in part.replace("==", "=").split("=", 1))
            clauses.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif part.startswith("!"):
            absent = part[1:].strip()
            clauses.append(lambda lb, k=absent: k not in lb)
        else:
            clauses.append(lambda lb, k=part: k in lb)
    return lambda labels: all(c(labels) for c in clauses)


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


class _Handler(BaseHTTPRequestHandler):
    fake: FakeKube

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        req = Request(
            self.command, url.path, parse_qs(url.query), self.headers.get("Content-Type", ""), body
        )
        try:
            code, payload = self.fake.handle(req)
        except ApiError as err:
            code, payload = err.code, err.status_object()
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


class FakeKubeServer:
    """Serves a :class:`FakeKube` on 127.0.0.1 on a free port until :meth:`stop`."""

    def __init__(self, fake: FakeKube | None = None) -> None:
        self.fake = fake or FakeKube()
        handler = type("Handler", (_Handler,), {"fake": self.fake})
        self._http = ThreadedHTTPServer(handler)

    @property
    def url(self) -> str:
        return self._http.url()

    def start(self) -> FakeKubeServer:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def api_client(self) -> kubernetes.client.ApiClient:
        """A real ``kubernetes`` client configured to talk to this server."""
        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        return kubernetes.client.ApiClient(cfg)
