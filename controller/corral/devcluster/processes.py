"""Background processes that outlive the command that started them, and stopping exactly those.

`corral dev up` returns while the plane keeps running, so each process is
started in its own session and recorded with its pid *and* its command line.
A pid alone is not an identity: after a reboot or a crash the number may
belong to somebody else's process, and `corral dev down` must never signal
that. A record counts as ours only while /proc shows the same command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    argv: list[str]

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcessRecord:
        pid, argv = data.get("pid"), data.get("argv")
        if not isinstance(pid, int) or not isinstance(argv, list):
            raise ValueError(f"not a process record: {data!r}")
        return cls(pid=pid, argv=[str(a) for a in argv])

    @classmethod
    def of_entry(cls, entry: Mapping[str, object]) -> ProcessRecord | None:
        """The record kept in a component's state entry (`{"process": {...}, ...}`), or None when there is none."""
        raw = entry.get("process")
        if not isinstance(raw, dict):
            return None
        try:
            return cls.from_json(raw)
        except ValueError:
            return None


def config_hash(argv: list[str], files_read: list[Path]) -> str:
    """A hash of a command line and the contents of the files it reads (certificates, once there are any): a
    running component started with another one is stale."""
    digest = hashlib.sha256(json.dumps(argv).encode())
    for path in files_read:
        digest.update(path.read_bytes() if path.exists() else b"(missing)")
    return digest.hexdigest()


# What a process the plane or the demo starts may inherit from whoever started it: where programs, the home
# directory, the locale and temporary files are, and how Python finds Corral. Nothing else: an exported token,
# password or proxy URL with credentials would sit in every child's /proc/PID/environ.
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV",
             "SSL_CERT_FILE", "SSL_CERT_DIR")


def child_environment(parent: Mapping[str, str], **extra: str) -> dict[str, str]:
    """A child's environment: INHERITED and the locale (LC_*) from `parent`, then `extra` (paths, never secrets)."""
    kept = {name: value for name, value in parent.items() if name in INHERITED or name.startswith("LC_")}
    return {**kept, **extra}


def start_detached(argv: list[str], log_file: Path, cwd: Path | None = None,
                   env: Mapping[str, str] | None = None) -> ProcessRecord:
    """Start argv in a new session with stdout and stderr appended to log_file, with only child_environment()
    and `env` (settings of the program's runtime, never secrets)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            env=child_environment(os.environ, **(env or {})),
        )
    return ProcessRecord(pid=proc.pid, argv=argv)


def is_ours(record: ProcessRecord) -> bool:
    """True while the pid is alive and still runs the recorded command line."""
    expected = [a.encode() for a in record.argv]
    for _ in range(50):
        try:
            raw = Path(f"/proc/{record.pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{record.pid}/stat").read_text()
        except OSError:
            return False
        # The state letter follows the command name, which is in parentheses and may hold spaces.
        if stat[stat.rindex(")") + 2] in "ZX":
            return False  # exited, not yet reaped
        if raw:
            return raw.rstrip(b"\0").split(b"\0") == expected
        # A live process reads an empty command line for a moment while it is
        # exec'ing (right after we started it); look again.
        time.sleep(0.01)
    return False


def stop(record: ProcessRecord, grace_s: float = 20.0) -> bool:
    """SIGTERM, then SIGKILL after grace_s. Returns False when the process was not ours to stop."""
    if not is_ours(record):
        return False
    try:
        os.kill(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_ours(record):
            _reap(record.pid)
            return True
        time.sleep(0.1)
    try:
        os.kill(record.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(record.pid)
    return True


def _reap(pid: int) -> None:
    # Only possible when we are the parent (tests that start and stop in one
    # process); otherwise init reaps it.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PICK_FROM = 8000  # ports below the ephemeral range to pick from
NODE_PORTS = range(30000, 32768)  # Kubernetes' default --service-node-port-range: a node's kube-proxy owns these
_handed_out: set[int] = set()
_random = random.SystemRandom()


def free_port() -> int:
    """A TCP port nothing listens on, for a server to be started on soon after.

    It is taken below the kernel's ephemeral range: a port from that range can be given to any outgoing
    connection (a fleet of 200 devices opens 200) between this check and the server's bind, which then fails
    with "address already in use". It is also below the NodePort range, which a node's Services claim. A port is
    handed out once per process."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    low = min(low, NODE_PORTS.start)
    for _ in range(100):
        port = _random.randint(max(1024, low - _PICK_FROM), low - 1)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded machine: any port the kernel gives
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    """Whether a server could listen on the port on every address (as the controller's health server does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def accepts_connections(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False
