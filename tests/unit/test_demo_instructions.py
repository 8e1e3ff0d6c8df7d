"""What `corral demo` prints when it is ready: commands a person can paste as they are."""

from __future__ import annotations

import re
from pathlib import Path

from corral.cli.demo import _instructions
from corral.devcluster.demo import Ready


def test_the_ready_message_names_the_corral_beside_its_interpreter_never_a_bare_corral(tmp_path: Path) -> None:
    ready = Ready(kubeconfig=tmp_path / "kubeconfig", namespace="home", mqtt_url="mqtt://127.0.0.1:1883",
                  gateway_url="http://127.0.0.1:8000/mcp", token_file=tmp_path / "agent-token", devices=43,
                  own_plane=True)
    text = _instructions(ready)
    commands = re.findall(r"(\S*corral) (?:mcp|intents|approve)\b", text)
    assert len(commands) == 3, text
    for command in commands:
        assert command != "corral", f"a bare corral is not on the env file's PATH: {text}"
        assert Path(command).is_file()
