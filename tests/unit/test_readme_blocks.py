"""The README test's rules cover the README as it is: every shell block of its sections is run or skipped for a
stated reason, no block calls a bare `corral`, and no placeholder or fixed port survives the rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.readme_harness import README, SECTIONS, SKIPPED, Block, Ports, blocks, ready_check, runnable, script

PORTS = Ports(gateway=41000, reader=41001, own_gateway=41002, console=41003)


def _readme() -> list[Block]:
    return blocks(README.read_text())


def test_every_section_has_blocks_and_every_skip_rule_matches_one_block() -> None:
    found = _readme()
    for section in SECTIONS:
        assert [b for b in found if b.section.startswith(section)], f"no shell block in README section {section!r}"
    for skipped in SKIPPED:
        assert len([b for b in found if b.first.startswith(skipped)]) == 1, f"skip rule {skipped!r} matches no block"
    assert 0 < len(runnable(found)) == len(found) - len(SKIPPED)


def test_no_block_calls_a_bare_corral() -> None:
    # `.corral/dev/env` puts only kubectl on PATH: a bare `corral` is "command not found" for a newcomer.
    bare = [(b.line, line) for b in _readme() for line in b.text.splitlines()
            if re.match(r"\s*(\S+=\S+\s+)*corral\s", line)]
    assert bare == []


def test_the_rules_leave_no_placeholder_or_readme_port_and_every_background_command_is_waited_for() -> None:
    for index, block in enumerate(runnable(_readme())):
        text = script(block, PORTS, Path("/logs"), index)
        body = text.partition("# README.md line")[2]
        assert not re.search(r"@TS\b|\bNAME\b|\b(8000|8001|8080|8443)\b", body), body
        assert body.count(" &\n") == body.count("__wait 120 ")


def test_a_background_command_without_a_readiness_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="no readiness rule"):
        ready_check("sleep 100", PORTS)
    assert ready_check(".venv/bin/corral console -n home --port 8080", PORTS) == "__port 8080"


def test_the_step_by_step_hands_a_patched_field_back_before_an_intent_sets_it() -> None:
    steps = "".join(b.text for b in _readme() if b.section == "Step by step")
    patched = steps.index('"power":true')
    handed_back = steps.index('"power":null')
    assert patched < handed_back < steps.index("intents create porch-light power=")
