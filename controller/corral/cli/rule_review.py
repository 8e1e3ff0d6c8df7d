"""What a person is shown before `corral rules accept` or `restore` acts, and how the act is bound to it.

Both commands print the exact spec they act on (canonical JSON, ASCII only, so that no text an agent wrote can
move the terminal's cursor) and a unified diff against the revision it replaces or follows, and act only on a
revision the controller recorded (rule.revised, status.revisions). The act is then bound to the revision shown:
`--generation N` names it (the number `corral rules show` prints), and a different current revision is refused;
without it, a person at a terminal types the number after reading, and anyone else is refused, since a script that
accepts "whatever is current" accepts what an agent wrote a moment before.
"""

from __future__ import annotations

import difflib
import json
import sys

import click

from corral.api.rule import Rule, RuleRevision, RuleSpec
from corral.decide.approvals import DEFAULT_PEOPLE
from corral.decide.revisions import previous_spec, spec_document
from corral.decide.rules import recorded_as


def interactive() -> bool:
    """Whether a person is at a terminal to read and answer (stdin is a TTY)."""
    return sys.stdin.isatty()


def spec_lines(spec: RuleSpec | None) -> list[str]:
    if spec is None:
        return []
    return json.dumps(spec_document(spec), indent=2, sort_keys=True, ensure_ascii=True).splitlines()


def echo_spec(spec: RuleSpec) -> None:
    for line in spec_lines(spec):
        click.echo(line)


def echo_diff(before: RuleSpec | None, after: RuleSpec, before_label: str, after_label: str) -> None:
    lines = list(difflib.unified_diff(spec_lines(before), spec_lines(after), before_label, after_label, lineterm="",
                                      n=2))
    for line in lines or ["  (no change)"]:
        click.echo(line)


def whose(revision: RuleRevision) -> str:
    person = DEFAULT_PEOPLE.includes(revision.author)
    return f"revision {revision.generation} by {revision.author}{'' if person else ', who is not a person'}"


def kept_line(rule: Rule) -> str | None:
    """What the kept previous revision is on record as, for `show`; None when none is kept."""
    kept = previous_spec(rule.metadata.annotations)
    if kept is None:
        return None
    revision = recorded_as(rule, kept)
    if revision is None:
        return ("The kept previous revision matches no revision the controller recorded: it was written into the "
                "annotation, not made as this Rule's spec. corral rules restore refuses it.")
    return f"The kept previous revision is {whose(revision)} (on record: rule.revised)."


def refuse_early(name: str, current: int, given: int | None, verb: str) -> None:
    """What `bind` would refuse without asking anyone, said before anything is read or shown."""
    if (given is not None and given != current) or (given is None and not interactive()):
        bind(name, current, given, verb)


def bind(name: str, current: int, given: int | None, verb: str) -> None:
    """The act is bound to the revision shown: `--generation` must name the current one; without it a person at a
    terminal types it; anyone else is refused (ClickException saying what to do)."""
    if given is not None:
        if given != current:
            raise click.ClickException(f"Rule {name} is at revision {current}, not {given}: it changed since you "
                                       f"looked, and nothing was done. Read it again (corral rules show {name}).")
        return
    if not interactive():
        raise click.ClickException(f"--generation is required when not interactive: read the Rule first (corral "
                                   f"rules show {name}), then {verb} it with --generation N, N being the revision "
                                   "shown, so that what you act on is what you read. Nothing was done.")
    typed = click.prompt(f"Type {current}, the revision shown above, to {verb} it (anything else stops)", default="",
                         show_default=False)
    if typed.strip() != str(current):
        raise click.ClickException(f"Nothing was done: you typed {typed.strip()!r}, not {current}.")
