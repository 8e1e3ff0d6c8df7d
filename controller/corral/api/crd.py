"""CustomResourceDefinitions generated from the models: the models are the single source of truth.

Pydantic writes JSON Schema; Kubernetes wants a *structural* OpenAPI v3
schema: no $ref, no anyOf for optional fields, no additionalProperties: false,
booleans for exclusive bounds, and x-kubernetes-* extensions where they apply.
`structural()` makes that translation and refuses what it cannot translate,
so a model that Kubernetes could not represent fails here, not at apply time.
"""

from __future__ import annotations

from typing import Any

from corral.api.base import Resource
from corral.api.codes import API_VERSION, GROUP, VERSION

CATEGORIES = ["corral"]
_DROPPED = {"title", "$defs", "examples"}
_EMPTY_DEFAULTS: tuple[object, ...] = (None, "", [], {})


class SchemaError(ValueError):
    """A model uses a construct that has no structural OpenAPI form."""


def structural(node: dict[str, Any], defs: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Translate one pydantic JSON Schema node (and its children) into structural OpenAPI v3."""
    node = dict(node)
    merged: dict[str, Any] = {}

    if "$ref" in node:
        merged.update(structural(defs[node.pop("$ref").rsplit("/", 1)[-1]], defs, path))
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise SchemaError(f"{path or '<root>'}: allOf with {len(parts)} parts has no structural form")
        merged.update(structural(parts[0], defs, path))
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(
                f"{path or '<root>'}: a union of {len(options)} types has no structural form; "
                "use JsonValue (x-kubernetes-preserve-unknown-fields) for free values"
            )
        merged.update(structural(options[0], defs, path))

    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "default" and value in _EMPTY_DEFAULTS:
            continue
        if key == "additionalProperties" and value is False:
            continue  # Kubernetes prunes unknown fields itself; `false` is not allowed next to properties
        if key == "propertyNames":
            continue  # no structural form: map keys are checked by the models and the controller
        if key == "patternProperties":
            # A map with constrained keys; Kubernetes has no patternProperties, so the
            # key pattern is left to the models and the controller as above.
            (value_schema,) = value.values()
            merged["additionalProperties"] = structural(value_schema, defs, f"{path}{{}}")
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            merged["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            merged[key] = True
            continue
        if key == "properties":
            merged[key] = {name: structural(child, defs, f"{path}.{name}") for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            merged[key] = structural(value, defs, f"{path}[]")
        elif key == "x-kubernetes-validations":
            merged[key] = [*merged.get(key, []), *value]  # the type's rules and the field's rules both hold
        else:
            merged[key] = value  # a field's own description wins over its type's

    if "type" not in merged and not merged.get("x-kubernetes-preserve-unknown-fields"):
        raise SchemaError(f"{path or '<root>'}: no type; structural schemas need one")
    if "required" in merged and not merged["required"]:
        del merged["required"]
    return merged


def crd_for(kind: type[Resource]) -> dict[str, Any]:
    raw = kind.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    root = structural(raw, defs)
    properties = root["properties"]
    # apiVersion, kind and metadata are the API server's to validate.
    properties["apiVersion"] = {"type": "string", "description": API_VERSION}
    properties["kind"] = {"type": "string", "description": kind.kind_name}
    properties["metadata"] = {"type": "object"}
    required = [name for name in root.pop("required", []) if name not in ("apiVersion", "kind", "metadata")]
    if required:  # an empty list is not stored, and server-side apply would then see a change that is not one
        root["required"] = required
    if kind.root_validations:
        root["x-kubernetes-validations"] = kind.root_validations

    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": root},
        "subresources": {"status": {}},
        "additionalPrinterColumns": [
            *kind.printer_columns,
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": kind.scope,
            "names": {
                "kind": kind.kind_name,
                "listKind": f"{kind.kind_name}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": kind.short_names,
                "categories": CATEGORIES,
            },
            "versions": [version],
        },
    }
