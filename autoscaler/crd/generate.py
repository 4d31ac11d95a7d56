"""Write the CRDs' spec schemas from the models the autoscaler parses with.

The controller and the local mode validate a GPUAutoscaler's spec with :class:`autoscaler.spec.
GPUAutoscalerSpecModel`, and a GPUBudget's with :class:`autoscaler.budget_spec.
GPUBudgetSpecModel`; the API server validates them with the CRDs' ``openAPIV3Schema``. Both come
from the models, so a field added, renamed or bounded in one place reaches the other:
``python -m autoscaler.crd.generate`` rewrites ``spec.versions[0].schema.openAPIV3Schema.
properties.spec`` in ``gpuautoscaler.yaml`` and ``gpubudget.yaml`` (the chart's ``crds/`` links
to these files), and ``--check`` exits 1 when a file differs from what it would write (tests run
the same check). The status schemas, printer columns and names stay as written in the files: the
controller writes the status, no parser reads it.

pydantic writes JSON Schema 2020-12; the API server wants a structural OpenAPI v3.0 schema, so
references are inlined, ``X | None`` becomes ``X`` (an absent field and a null one mean the same
here), exclusive bounds become ``minimum`` with ``exclusiveMinimum: true``, and the keys the API
server refuses or ignores (``title``, ``additionalProperties: false``, a null default) go.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from autoscaler.budget_spec import GPUBudgetSpecModel
from autoscaler.spec import GPUAutoscalerSpecModel

HERE = Path(__file__).resolve().parent
# Each CRD file and the model of its spec.
CRDS: dict[Path, type[BaseModel]] = {
    HERE / "gpuautoscaler.yaml": GPUAutoscalerSpecModel,
    HERE / "gpubudget.yaml": GPUBudgetSpecModel,
}

_GENERATED = "# The spec schema is written by python -m autoscaler.crd.generate\n"

# Keys in the order a reader looks for them.
_KEY_ORDER = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "minItems",
    "minProperties",
    "x-kubernetes-int-or-string",
    "anyOf",
    "required",
    "properties",
    "items",
)


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema (by alias) as a Kubernetes structural OpenAPI v3.0 schema."""
    schema = model.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})
    schema.pop("description", None)  # the model's docstring is for developers
    return _structural(schema, defs)


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        target = dict(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        target.pop("description", None)  # a class docstring; the field's own description stays
        node = {**target, **node}
    branches = node.get("anyOf")
    if branches is not None:
        kept = [b for b in branches if b.get("type") != "null"]
        if len(kept) < len(branches):
            del node["anyOf"]
            if len(kept) == 1:
                node = {**kept[0], **node}
            else:
                node["anyOf"] = kept
    if "default" in node and node["default"] is None:
        del node["default"]
    node.pop("title", None)
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node[bound], bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if "$ref" in node:  # the one branch left of ``X | None`` was a reference
        return _structural(node, defs)
    if "properties" in node:
        node["properties"] = {k: _structural(v, defs) for k, v in node["properties"].items()}
    if "items" in node:
        node["items"] = _structural(node["items"], defs)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"], defs)
    if "anyOf" in node:
        node["anyOf"] = [_structural(b, defs) for b in node["anyOf"]]
    ordered = {k: node[k] for k in _KEY_ORDER if k in node}
    return {**ordered, **{k: v for k, v in node.items() if k not in ordered}}


def rendered_crd(current: str, model: type[BaseModel]) -> str:
    """``current`` (a CRD file's text) with its spec schema generated from ``model``."""
    header = ""
    for line in current.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        if "autoscaler.crd.generate" not in line:  # the marker below, in any earlier wording
            header += line
    crd = yaml.safe_load(current)
    (version,) = crd["spec"]["versions"]
    properties = version["schema"]["openAPIV3Schema"]["properties"]
    properties["spec"] = structural_schema(model)
    body = yaml.safe_dump(crd, sort_keys=False, width=100, allow_unicode=True)
    return header + _GENERATED + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autoscaler.crd.generate",
        description="Write the CRDs' spec schemas from autoscaler's spec models.",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a file is not what would be written"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, model in CRDS.items():
        current = path.read_text()
        wanted = rendered_crd(current, model)
        if current == wanted:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(wanted)
            print(f"wrote {path}")
    if args.check and stale:
        for path in stale:
            print(
                f"{path}: the spec schema differs from {CRDS[path].__module__}."
                f"{CRDS[path].__name__}; run python -m autoscaler.crd.generate",
                file=sys.stderr,
            )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
