"""Turns a Snapshot into exposition bytes, once per collection, so a scrape only copies bytes.

Both formats (Prometheus text 0.0.4 and OpenMetrics 1.0) are rendered, and gzipped, when a
collection completes; a scrape appends one line that cannot be pre-rendered (the snapshot's age)
and returns. That is how the exporter beats prometheus_client, whose scrape walks every metric
object, formats every value and compresses the result on each request.

Two naming schemes (see :mod:`exporter.fields`):

* ``dcgm`` (default): dcgm-exporter's metric names, units and labels (``gpu``, ``UUID``,
  ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, MIG
  ``GPU_I_PROFILE``/``GPU_I_ID``, and ``container``/``namespace``/``pod`` when attributed), so
  existing dashboards and rules work unchanged.
* ``prometheus``: the same values under conventional names in base units with snake_case labels.

A GPU used by several pods (time-slicing) gets one series per pod, as dcgm-exporter does; that
holds for the Xid history too (``autoglm_gpu_xid_errors_total{xid}``,
``autoglm_gpu_last_xid_timestamp_seconds``), whose counters for the critical Xid codes
(``exporter.fields.CRITICAL_XIDS``: 48, 63, 64, 74, 79, 94, 95) exist at 0 from the start.
The exporter's per-GPU health series (``autoglm_exporter_gpu_up``,
``autoglm_exporter_collect_errors_total``) carry the naming's host label (``Hostname`` or
``hostname``) besides their own ``gpu`` label; ``autoglm_exporter_gpu_up`` also carries the
naming's GPU identity labels with the values the GPU series have (the physical GPU's ``UUID``,
and ``GPU_I_ID`` on a MIG instance), so ``on(UUID)`` joins it with the DCGM series.

In OpenMetrics, a DCGM counter whose name does not end in ``_total`` is typed ``unknown``:
OpenMetrics would otherwise require renaming its samples to ``..._total`` and dashboards written
for dcgm-exporter (which only speaks the text format) would lose the series.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest as generate_text
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.utils import floatToGoString

from exporter.collector import Snapshot
from exporter.fields import CRITICAL_XIDS, FIELDS, FieldSpec
from exporter.histogram import Histogram
from exporter.model import DeviceInfo

Naming = Literal["dcgm", "prometheus"]
Format = Literal["text", "openmetrics"]

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_GZIP_LEVEL = 6


class PodRefLike(Protocol):
    """A container holding a GPU, read-only (the watcher's are frozen)."""

    @property
    def namespace(self) -> str: ...

    @property
    def pod(self) -> str: ...

    @property
    def container(self) -> str: ...


class PodResourcesStatus(Protocol):
    """What the renderer reads from the pod-resources watcher."""

    @property
    def healthy(self) -> bool: ...

    @property
    def last_success(self) -> float | None: ...


Attribution = Mapping[str, Sequence[PodRefLike]]  # GPU or MIG UUID -> pods using it


@dataclass(frozen=True)
class LabelNames:
    """The label names of one naming scheme."""

    gpu: str
    uuid: str
    pci_bus_id: str
    device: str
    model_name: str
    hostname: str
    driver_version: str
    mig_profile: str
    mig_instance_id: str
    container: str = "container"
    namespace: str = "namespace"
    pod: str = "pod"


DCGM_LABELS = LabelNames(
    "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
    "GPU_I_PROFILE", "GPU_I_ID",
)  # fmt: skip
PROMETHEUS_LABELS = LabelNames(
    "gpu", "uuid", "pci_bus_id", "device", "model_name", "hostname", "driver_version",
    "gpu_instance_profile", "gpu_instance_id",
)  # fmt: skip
LABELS: dict[str, LabelNames] = {"dcgm": DCGM_LABELS, "prometheus": PROMETHEUS_LABELS}


def escape_label_value(value: str) -> str:
    """Escape a label value for both exposition formats (backslash, double quote, newline)."""
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def format_value(value: float) -> str:
    """A sample value as Prometheus parses it; integers without a trailing ``.0``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def label_block(pairs: Iterable[tuple[str, str]]) -> str:
    """``{a="x",b="y"}`` with values escaped; empty string when there are no labels."""
    inner = ",".join(f'{name}="{escape_label_value(value)}"' for name, value in pairs)
    return "{" + inner + "}" if inner else ""


@dataclass
class Family:
    """One metric family ready to write: its samples are (what follows the family name, value)
    pairs. That is the label block for gauges and counters; a histogram's samples also carry
    their suffix (``_bucket{le="0.1"}``, ``_count``, ``_sum``), so both writers stay one loop."""

    name: str
    kind: Literal["gauge", "counter", "histogram"]
    help: str
    samples: list[tuple[str, float]] = field(default_factory=list)


def histogram_samples(histogram: Histogram) -> list[tuple[str, float]]:
    """A histogram's samples in exposition order: cumulative buckets up to ``+Inf``, then
    ``_count`` and ``_sum``. ``le`` is written as Go writes floats (``1.0``, ``+Inf``), the form
    OpenMetrics requires, so a series keeps its labels whichever format Prometheus negotiates."""
    out = [
        (f"_bucket{label_block([('le', floatToGoString(le))])}", float(count))
        for le, count in histogram.cumulative()
    ]
    out += [("_count", float(histogram.count)), ("_sum", histogram.sum)]
    return out


def _write_text(families: Sequence[Family]) -> str:
    out: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        help_text = fam.help.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {fam.name} {help_text}\n# TYPE {fam.name} {fam.kind}\n")
        out.extend(f"{fam.name}{labels} {format_value(v)}\n" for labels, v in fam.samples)
    return "".join(out)


def _write_openmetrics(families: Sequence[Family]) -> str:
    out: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        kind: str = fam.kind
        family_name = fam.name
        if kind == "counter":
            if fam.name.endswith("_total"):
                family_name = fam.name[: -len("_total")]
            else:
                kind = "unknown"
        help_text = fam.help.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        out.append(f"# HELP {family_name} {help_text}\n# TYPE {family_name} {kind}\n")
        out.extend(f"{fam.name}{labels} {format_value(v)}\n" for labels, v in fam.samples)
    return "".join(out)


def _device_labels(info: DeviceInfo, names: LabelNames, hostname: str) -> list[tuple[str, str]]:
    pairs = [
        (names.gpu, str(info.index)),
        (names.uuid, info.uuid),
        (names.pci_bus_id, info.pci_bus_id),
        (names.device, info.device),
        (names.model_name, info.model_name),
        (names.hostname, hostname),
        (names.driver_version, info.driver_version),
    ]
    if info.mig_profile is not None:
        pairs.append((names.mig_profile, info.mig_profile))
    if info.mig_instance_id is not None:
        pairs.append((names.mig_instance_id, str(info.mig_instance_id)))
    return pairs


def _pods_of(info: DeviceInfo, attribution: Attribution) -> Sequence[PodRefLike]:
    if info.mig_uuid is not None and info.mig_uuid in attribution:
        return attribution[info.mig_uuid]
    return attribution.get(info.uuid, ())


def _series_label_pairs(
    info: DeviceInfo, names: LabelNames, hostname: str, attribution: Attribution
) -> list[list[tuple[str, str]]]:
    """The labels of each series of one device: one per pod using it, or one without pods."""
    base = _device_labels(info, names, hostname)
    pods = _pods_of(info, attribution)
    if not pods:
        return [base]
    return [
        [*base, (names.container, p.container), (names.namespace, p.namespace), (names.pod, p.pod)]
        for p in pods
    ]


def _metric_name(spec: FieldSpec, naming: Naming) -> tuple[str, str, float]:
    if naming == "dcgm":
        return spec.dcgm_name, spec.dcgm_help, 1.0
    return spec.prom_name, spec.prom_help, spec.scale


def gpu_families(
    snapshot: Snapshot,
    naming: Naming,
    hostname: str,
    attribution: Attribution,
    fields: Sequence[FieldSpec] = FIELDS,
) -> list[Family]:
    """The families of ``fields`` (in that order) plus the Xid history."""
    names = LABELS[naming]
    families: list[Family] = []
    pairs = {
        d.key: _series_label_pairs(d.info, names, hostname, attribution) for d in snapshot.devices
    }
    series = {key: [label_block(p) for p in per_pod] for key, per_pod in pairs.items()}
    for spec in fields:
        name, help_text, scale = _metric_name(spec, naming)
        fam = Family(name, spec.kind, help_text)
        for device in snapshot.devices:
            value = device.values.get(spec.dcgm_name)
            if value is None:
                continue
            scaled = value * scale
            fam.samples.extend((labels, scaled) for labels in series[device.key])
        families.append(fam)
    # The Xid history carries pod labels like the GPU series (as dcgm-exporter's Xid field does),
    # so an alert on it names the workload the Xid hit.
    xid_total = Family(
        "autoglm_gpu_xid_errors_total",
        "counter",
        "Xid errors reported by the driver since the exporter started, by Xid code; the critical "
        f"codes ({', '.join(map(str, CRITICAL_XIDS))}) start at 0.",
    )
    last_xid = Family(
        "autoglm_gpu_last_xid_timestamp_seconds",
        "gauge",
        "Unix time of the most recent Xid error on this GPU, in seconds.",
    )
    for device in snapshot.devices:
        for code, count in sorted(device.xid_counts.items()):
            xid_total.samples.extend(
                (label_block([*p, ("xid", str(code))]), float(count)) for p in pairs[device.key]
            )
        if device.last_xid is not None:
            last_xid.samples.extend((labels, device.last_xid[1]) for labels in series[device.key])
    families += [xid_total, last_xid]
    return families


def exporter_families(
    snapshot: Snapshot,
    naming: Naming,
    hostname: str,
    pod_resources: PodResourcesStatus | None,
) -> list[Family]:
    """The exporter's own health: collection timing, errors, per-GPU up, pod-resources health.

    Per-GPU series carry the host name under the naming's label (``Hostname`` or ``hostname``),
    as the GPU series do, so an alert on them names the node without a join.
    """
    names = LABELS[naming]
    node = (names.hostname, hostname)
    up = Family(
        "autoglm_exporter_gpu_up",
        "gauge",
        "1 when the last collection read this GPU (or MIG instance) in time, else 0.",
    )
    for d in snapshot.devices:
        identity = [("gpu", d.key), (names.uuid, d.info.uuid)]
        if d.info.mig_instance_id is not None:
            identity.append((names.mig_instance_id, str(d.info.mig_instance_id)))
        up.samples.append((label_block([*identity, node]), 1.0 if d.up else 0.0))
    errors = Family(
        "autoglm_exporter_collect_errors_total",
        "counter",
        "Failed reads by GPU, field (all: the whole device; xid_events: the Xid event drain) "
        "and reason; failed series are dropped from the snapshot, never served stale.",
    )
    for (gpu, field_name, reason), count in sorted(snapshot.errors_total.items()):
        labels = label_block([("gpu", gpu), ("field", field_name), ("reason", reason), node])
        errors.samples.append((labels, float(count)))
    families = [
        up,
        Family(
            "autoglm_exporter_collection_duration_seconds",
            "gauge",
            "Wall time the last collection took, in seconds.",
            [("", snapshot.duration_seconds)],
        ),
        Family(
            "autoglm_exporter_collection_seconds",
            "histogram",
            "Wall time of every collection since the exporter started, in seconds.",
            histogram_samples(snapshot.collection_seconds),
        ),
        Family(
            "autoglm_exporter_collections_total",
            "counter",
            "Collections completed since the exporter started.",
            [("", float(snapshot.collections_total))],
        ),
        Family(
            "autoglm_exporter_collection_overruns_total",
            "counter",
            "Collections that reached their deadline with device reads still pending.",
            [("", float(snapshot.overruns_total))],
        ),
        Family(
            "autoglm_exporter_snapshot_timestamp_seconds",
            "gauge",
            "Unix time the snapshot being served was taken, in seconds.",
            [("", snapshot.taken_at)],
        ),
        errors,
        Family(
            "autoglm_exporter_hung_reads",
            "gauge",
            "Devices whose read outlived the collection deadline and is still running; they "
            "are not read again until it returns.",
            [("", float(len(snapshot.hung_devices)))],
        ),
    ]
    if snapshot.last_success is not None:
        families.append(
            Family(
                "autoglm_exporter_last_success_timestamp_seconds",
                "gauge",
                "Unix time of the last collection that read at least one GPU, in seconds.",
                [("", snapshot.last_success)],
            )
        )
    if pod_resources is not None:
        families.append(
            Family(
                "autoglm_exporter_pod_resources_up",
                "gauge",
                "1 when the last kubelet pod-resources List call succeeded, else 0.",
                [("", 1.0 if pod_resources.healthy else 0.0)],
            )
        )
        if pod_resources.last_success is not None:
            families.append(
                Family(
                    "autoglm_exporter_pod_resources_last_success_timestamp_seconds",
                    "gauge",
                    "Unix time of the last successful kubelet pod-resources List, in seconds.",
                    [("", pod_resources.last_success)],
                )
            )
    return families


_AGE_HELP = (
    "# HELP autoglm_exporter_snapshot_age_seconds Age of the served snapshot at scrape time, "
    "in seconds.\n# TYPE autoglm_exporter_snapshot_age_seconds gauge\n"
)


@dataclass(frozen=True)
class Exposition:
    """A snapshot rendered in both formats, plain and gzipped; ``body`` adds the age line."""

    taken_at: float
    text: bytes
    openmetrics: bytes  # without the closing ``# EOF``
    text_gzip: bytes
    openmetrics_gzip: bytes

    def body(self, fmt: Format, now: float, compressed: bool) -> bytes:
        """The bytes for one scrape at unix time ``now``.

        Only the age line and the OpenMetrics ``# EOF`` are built here; with ``compressed`` they
        go out as a second gzip member, which every gzip reader concatenates.
        """
        age = max(0.0, now - self.taken_at)
        tail = f"{_AGE_HELP}autoglm_exporter_snapshot_age_seconds {age!r}\n"
        if fmt == "openmetrics":
            tail += "# EOF\n"
        if compressed:
            head = self.openmetrics_gzip if fmt == "openmetrics" else self.text_gzip
            return head + gzip.compress(tail.encode(), compresslevel=1)
        head = self.openmetrics if fmt == "openmetrics" else self.text
        return head + tail.encode()


def render(
    snapshot: Snapshot,
    naming: Naming,
    hostname: str,
    attribution: Attribution | None = None,
    pod_resources: PodResourcesStatus | None = None,
    registries: Sequence[CollectorRegistry] = (),
    fields: Sequence[FieldSpec] = FIELDS,
) -> Exposition:
    """Render ``snapshot`` (with pod labels from ``attribution``) and ``registries`` once."""
    families = gpu_families(snapshot, naming, hostname, attribution or {}, fields)
    families += exporter_families(snapshot, naming, hostname, pod_resources)
    text = _write_text(families) + "".join(generate_text(r).decode() for r in registries)
    openmetrics = _write_openmetrics(families) + "".join(
        generate_openmetrics(r).decode().removesuffix("# EOF\n") for r in registries
    )
    text_bytes, om_bytes = text.encode(), openmetrics.encode()
    return Exposition(
        taken_at=snapshot.taken_at,
        text=text_bytes,
        openmetrics=om_bytes,
        text_gzip=gzip.compress(text_bytes, compresslevel=_GZIP_LEVEL),
        openmetrics_gzip=gzip.compress(om_bytes, compresslevel=_GZIP_LEVEL),
    )


def wants_openmetrics(accept: str | None) -> bool:
    """True when the Accept header lists OpenMetrics (as Prometheus's default scrape does)."""
    if not accept:
        return False
    return any(
        part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(",")
    )
