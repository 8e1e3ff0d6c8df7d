"""Each action is one kind of Intent, found in a table: the verb its requester needs, whether interlocks judge it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.reconcile.intents.actuate import Actuate
from corral.reconcile.intents.execute import Handovers
from corral.reconcile.intents.kinds import Kinds
from corral.reconcile.intents.lease import Lease
from corral.reconcile.intents.overlay import Overlay
from corral.reconcile.intents.read import Read
from tests.unit.test_decide import DEVICE, intent

KINDS = Kinds(Actuate(Handovers()), Read(None, None), Overlay(None, None), Lease(None, None, None))


@pytest.mark.parametrize("action,actuator,kind,verb,interlocked", [
    ("set_state", "light", Actuate, "write", True),
    ("set_version", "firmware", Actuate, "config", True),
    ("set_mode", "no-such-actuator", Actuate, None, True),
    ("read", "temperature", Read, "read", False),
    ("set_alias", "alias", Overlay, "annotate", False),
    ("set_location", "location", Overlay, "annotate", False),
    ("acquire", "lease", Lease, "write", False),
    ("break", "lease", Lease, "approve", False),
])
def test_each_action_is_one_kind_with_its_verb(action: str, actuator: str, kind: type, verb: str | None,
                                               interlocked: bool) -> None:
    found = KINDS.of(action)
    assert isinstance(found, kind) and found.interlocked is interlocked
    assert found.verb(intent(action=action, actuator=actuator), DEVICE) == verb


def test_without_a_contract_nobody_may_actuate_or_read_but_the_overlay_and_leases_need_none() -> None:
    unknown = replace(DEVICE, contract=None)
    assert KINDS.of("set_state").verb(intent(), unknown) is None
    assert KINDS.of("read").verb(intent(action="read"), unknown) is None
    assert KINDS.of("set_note").verb(intent(action="set_note", actuator="notes"), unknown) == "annotate"
    assert KINDS.of("release").verb(intent(action="release", actuator="lease"), unknown) == "write"
