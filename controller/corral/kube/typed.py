"""Objects become typed once, where they enter: a raw body from a watch, a list or a write answer is validated
into its pydantic model here, and everything past this point reads `intent.spec.actuator`, not dicts.

A body its model refuses is not dropped silently and never crashes a handler: `Malformed` names the object and
says, field by field, what was wrong, so the caller can put that on the object as a condition or an Event.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Body = dict[str, Any]
M = TypeVar("M", bound=BaseModel)


class Malformed(ValueError):
    """A body its model refuses: which object, and what was wrong with it (at most a few fields, each named)."""

    def __init__(self, kind: str, namespace: str, name: str, problems: list[str]) -> None:
        self.kind, self.namespace, self.name, self.problems = kind, namespace, name, problems
        where = f"{namespace}/{name}" if namespace else name
        super().__init__(f"{kind} {where} is malformed: {'; '.join(problems)}")


def problems_of(err: ValidationError, limit: int = 5) -> list[str]:
    """`spec.actuator: String should have at most 64 characters`, one per refused field, at most `limit`."""
    found = [f"{'.'.join(str(part) for part in e['loc']) or '(object)'}: {e['msg']}" for e in err.errors()]
    return found[:limit] + ([f"and {len(found) - limit} more"] if len(found) > limit else [])


def parse(model: type[M], body: Body) -> M:
    """The body as its model; `Malformed` when the model refuses it."""
    try:
        return model.model_validate(body)
    except ValidationError as err:
        meta = body.get("metadata") if isinstance(body, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        raise Malformed(model.__name__, str(meta.get("namespace") or ""), str(meta.get("name") or "?"),
                        problems_of(err)) from None
