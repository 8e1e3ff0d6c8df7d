"""What another local account could see of our processes and files: the attacker's view in findings 1, 12
and 13 (a local user without credentials, or `nobody`).

Read from /proc as the kernel shows it (a process's tree, its arguments, its environment, its listening
sockets), and probes run as `nobody` in a process of their own: a real second account, not a simulation.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

NOBODY_PYTHON = "/usr/bin/python3"  # the system's: nobody may not enter the checkout's virtualenv


@dataclass(frozen=True)
class Exposed:
    pid: int
    argv: list[str]
    environ: dict[str, str]


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, from each process's parent pid in /proc/PID/stat."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def exposed(pid: int) -> Exposed | None:
    """What /proc shows of a process's arguments and environment (None once it is gone)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        raw = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return Exposed(pid, [a.decode(errors="replace") for a in argv], {k: v for k, _, v in pairs})


def listening(pid: int) -> set[tuple[str, int]]:
    """The TCP sockets `pid` listens on, as (address, port): /proc/PID/fd's sockets found in /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            found.add((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in words[12:])  # IPv4-mapped
    return ":".join(words[i:i + 2].hex() for i in range(0, 16, 2))


# Run by the system's Python as nobody: try each etcd port (plain, and TLS without a client certificate) with
# a range read of every key, the API server without credentials, and every file. Prints what it got.
_PROBE = r"""
import json, os, socket, ssl, sys
ask = json.loads(sys.argv[1])
body = json.dumps({"key": "Lw==", "range_end": "MA==", "count_only": True}).encode()  # every key under /
request = (b"POST /v3/kv/range HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
def attempt(port, tls, data=request):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            s = context.wrap_socket(s)
        s.sendall(data)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return answer.decode(errors="replace")[:400]
            answer += chunk
    except (OSError, ssl.SSLError) as err:
        return "refused: %s: %s" % (type(err).__name__, err)
result = {"uid": os.getuid(), "etcd": {}, "readable": [], "listable": []}
for port in ask["etcd_ports"]:
    result["etcd"][str(port)] = [attempt(port, False), attempt(port, True)]
result["api"] = attempt(ask["api_port"], True, b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
for path in ask["files"]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        result["readable"].append(path)
    except OSError:
        pass
for path in ask["dirs"]:
    try:
        os.listdir(path)
        result["listable"].append(path)
    except OSError:
        pass
print(json.dumps(result))
"""


def as_nobody(etcd_ports: list[int], api_port: int, files: list[Path], dirs: list[Path]) -> dict:
    """Run the probe as the account `nobody` (the tests run as root; without root there is no second account)."""
    if os.geteuid() != 0:
        pytest.skip("probing as another account (nobody) needs root to switch to it")
    ask = {"etcd_ports": etcd_ports, "api_port": api_port, "files": [str(f) for f in files],
           "dirs": [str(d) for d in dirs]}
    done = subprocess.run([NOBODY_PYTHON, "-c", _PROBE, json.dumps(ask)], user="nobody", group="nogroup",
                          extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))
