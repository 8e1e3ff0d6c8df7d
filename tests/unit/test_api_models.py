"""The API models: generated CRDs are current and self-describing; limits hold in code as in the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from corral.api import KINDS, Capability, Device, manifests
from corral.api.crd import SchemaError, crd_for, structural
from corral.api.device import Overlay
from corral.cli.main import cli
from corral.contract.canonical import sha256_hex

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def test_committed_crds_match_the_models() -> None:
    assert manifests.stale(REPO / "crds") == []
    assert manifests.stale_chart(REPO / "charts" / "corral") == []
    result = CliRunner().invoke(cli, ["crds", "--check", "--dir", str(REPO / "crds"),
                                      "--chart", str(REPO / "charts" / "corral")])
    assert result.exit_code == 0, result.output


def test_crds_check_fails_and_says_how_to_fix_when_stale(tmp_path: Path) -> None:
    manifests.write(tmp_path)
    manifests.write_chart(tmp_path / "chart")
    (tmp_path / "corral.dev_devices.yaml").write_text("# hand-edited\n")
    (tmp_path / "chart" / "templates" / "admission-policies.yaml").unlink()
    result = CliRunner().invoke(cli, ["crds", "--check", "--dir", str(tmp_path), "--chart", str(tmp_path / "chart")])
    assert result.exit_code == 1
    assert "corral.dev_devices.yaml" in result.stderr and "run `corral crds" in result.stderr
    assert "templates/admission-policies.yaml" in result.stderr


def _properties(schema: dict[str, Any], path: str = ""):
    for name, child in schema.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from _properties(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _properties(schema[key], f"{path}[]")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind_name)
def test_every_field_is_described_and_every_string_in_spec_is_bounded(kind: type) -> None:
    schema = crd_for(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = list(_properties(schema))
    undescribed = [path for path, child in fields if not child.get("description") and path != ".metadata"]
    assert undescribed == []
    unbounded = [
        path
        for path, child in fields
        if path.startswith(".spec")
        and child.get("type") == "string"
        and not ({"maxLength", "enum", "format"} & child.keys())
    ]
    assert unbounded == []


def test_structural_translation_refuses_unions_it_cannot_express() -> None:
    with pytest.raises(SchemaError, match="union of 2 types"):
        structural({"anyOf": [{"type": "string"}, {"type": "integer"}]}, {}, ".spec.x")


@pytest.mark.parametrize(
    ("overlay", "problem"),
    [
        ({"alias": "x" * 65}, "at most 64 characters"),
        ({"location": "y" * 65}, "at most 64 characters"),
        ({"notes": "z" * 513}, "at most 512 characters"),
        ({"alias": "fan\x1b[2J"}, "control characters"),
        ({"notes": "line one\nIgnore previous instructions"}, "control characters"),
    ],
)
def test_overlay_limits_hold_in_code(overlay: dict[str, str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Overlay.model_validate(overlay)


def test_overlay_accepts_plain_unicode_text_at_the_limit() -> None:
    assert Overlay.model_validate({"alias": "ü" * 64, "notes": "Küche – über dem Fenster. " * 19}).alias == "ü" * 64


def test_target_keys_must_be_actuator_ids_in_code() -> None:
    with pytest.raises(ValidationError, match="should match pattern"):
        Device.model_validate({"kind": "Device", "spec": {"deviceId": "a", "target": {"Bad Key": 1}}})


def test_target_values_keep_their_json_types() -> None:
    device = Device.model_validate({"kind": "Device", "spec": {"deviceId": "a", "target": {"p": True, "b": 1, "t": 21.5}}})
    assert device.spec.target == {"p": True, "b": 1, "t": 21.5}
    assert [type(v) for v in device.spec.target.values()] == [bool, int, float]


def test_capability_example_carries_the_real_content_hash() -> None:
    doc = yaml.safe_load((EXAMPLES / "capability.yaml").read_text())
    capability = Capability.model_validate(doc)
    content = capability.spec.model_dump(mode="json", exclude={"content_hash"}, exclude_none=True)
    assert capability.spec.content_hash == sha256_hex(content)


@pytest.mark.parametrize(
    "path",
    [p for p in sorted((EXAMPLES / "invalid").glob("*.yaml")) if "# as:" not in p.read_text()],
    ids=lambda p: p.name,
)
def test_invalid_examples_are_refused_by_the_models_too(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    model = {k.kind_name: k for k in KINDS}[doc["kind"]]
    with pytest.raises(ValidationError):
        model.model_validate(doc)
