"""Building blocks shared by the four kinds: the model base, object metadata, conditions, free JSON values.

Python attributes are snake_case; on the wire (and in the CRD schemas) they
are camelCase, as Kubernetes API conventions ask. Every field carries a
description, because the CRD schema is generated from these models and
`kubectl explain` shows what is written here.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# No C0/C1 control characters: text from agents and devices ends up in prompts
# and terminals, where such characters can hide or forge content.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
SHA256_HEX = r"^[0-9a-f]{64}$"


def _no_control_characters(text: str) -> str:
    if _CONTROL.search(text):
        raise ValueError("must not contain control characters (newlines, tabs, escape sequences)")
    return text


# The same rule for the API server, as CEL so that its rejection says why in words.
_NO_CONTROL_RULE = {
    "rule": "!self.matches('[\\\\x00-\\\\x1f\\\\x7f-\\\\x9f]')",
    "message": "must not contain control characters (newlines, tabs, escape sequences)",
}


_NO_CONTROL = AfterValidator(_no_control_characters)
_NO_CONTROL_SCHEMA: dict[str, Any] = {"x-kubernetes-validations": [_NO_CONTROL_RULE]}

# Strings of bounded length without control characters, checked by the models and the API server alike.
Text16 = Annotated[str, Field(max_length=16, json_schema_extra=_NO_CONTROL_SCHEMA), _NO_CONTROL]
Text64 = Annotated[str, Field(max_length=64, json_schema_extra=_NO_CONTROL_SCHEMA), _NO_CONTROL]
Text512 = Annotated[str, Field(max_length=512, json_schema_extra=_NO_CONTROL_SCHEMA), _NO_CONTROL]
Text1024 = Annotated[str, Field(max_length=1024, json_schema_extra=_NO_CONTROL_SCHEMA), _NO_CONTROL]


# Any JSON value (a target state may be a bool, a number or a string, as the
# contract says). The API server keeps such a field as it is; the contract, not
# the schema, decides what is valid.
# The groups Kubernetes authenticated the creator with, filled in by clients (from a SelfSubjectReview); an
# admission policy requires them to equal request.userInfo.groups, so the controller may use them in its reviews.
Groups = Annotated[list[Annotated[str, Field(min_length=1, max_length=512)]], Field(max_length=64)]

JsonValue = Annotated[
    bool | int | float | str,
    WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True}),
]


class KubeModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
    )


class ObjectMeta(KubeModel):
    """The subset of Kubernetes object metadata Corral reads; everything else is kept as it came."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Condition(KubeModel):
    """One aspect of the object's state, as Kubernetes API conventions define conditions."""

    type: str = Field(max_length=316, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", description="Condition type in CamelCase, e.g. Ready or ContractValid.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", description="Machine-readable CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable details of the last transition.")
    last_transition_time: datetime = Field(description="When the status last changed.")
    observed_generation: int | None = Field(default=None, ge=0, description="The .metadata.generation the condition was set for.")


class Resource(KubeModel):
    """Base of the four kinds: apiVersion, kind and metadata, plus what the CRD needs to know."""

    # The CRD's names and presentation; set by each kind.
    kind_name: ClassVar[str]
    plural: ClassVar[str]
    singular: ClassVar[str]
    scope: ClassVar[Literal["Namespaced", "Cluster"]]
    short_names: ClassVar[list[str]]
    printer_columns: ClassVar[list[dict[str, object]]]
    # CEL rules on the whole object (they may read metadata.name).
    root_validations: ClassVar[list[dict[str, str]]] = []

    # codes.API_VERSION, spelled out because a Literal type needs the text itself (test_api_names holds them equal).
    api_version: Literal["corral.dev/v1alpha1"] = "corral.dev/v1alpha1"
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
