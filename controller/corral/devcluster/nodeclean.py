"""Removing what a node left on this machine once its processes are stopped: its containers' processes and
cgroups, mounts, iptables chains and rules, kube-router's ipsets, the cni0 bridge, the files the kubelet and the
CNI plugins keep outside the node's directory, and the sysctls the kubelet and the bridge changed.

kube-proxy's own `--cleanup` runs first (node.py); what it leaves (the kubelet's, CNI's and kube-router's chains)
is removed here by name prefix, because kube-router v2.1.0's --cleanup-config panicked. Parsing is pure and
unit-tested; the rest acts on the machine and says what it did.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from corral.devcluster.nodeconfig import BRIDGE, NETWORK_NAME, NodeLayout

Progress = Callable[[str], None]

OUR_CHAIN_PREFIXES = ("KUBE-", "CNI-")
# kube-router names its sets after the policies and Pods it selects; all start with these.
OUR_IPSET_PREFIXES = ("KUBE-", "kube-router", "inet6:KUBE-", "inet6:kube-router")
# What the kubelet (panic_on_oops, overcommit, panic), kube-proxy (route_localnet, conntrack) and the bridge
# plugin (ip_forward) may change; recorded before the node starts and written back after it stops.
SYSCTLS = (
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "kernel.panic",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv4.ip_forward",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
# Paths the kubelet and containerd use whatever they are told; removed only when the node made them.
MACHINE_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
    Path("/usr/libexec/kubernetes"),
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
_MNT_DETACH = 2


def iptables_restore_script(save_text: str) -> str:
    """An `iptables-restore --noflush` input removing our chains and every rule elsewhere that jumps into them.

    `save_text` is `iptables-save` output. Rules in the machine's own chains are deleted one by one (-D with the
    rule as saved); our chains are flushed, then deleted, in one transaction per table.
    """
    out: list[str] = []
    table = ""
    ours: list[str] = []
    deletes: list[str] = []

    def finish() -> None:
        if table and (ours or deletes):
            out.append(f"*{table}")
            out.extend(deletes)
            out.extend(f"-F {chain}" for chain in ours)
            out.extend(f"-X {chain}" for chain in ours)
            out.append("COMMIT")

    for line in save_text.splitlines():
        if line.startswith("*"):
            table, ours, deletes = line[1:].strip(), [], []
        elif line.startswith(":"):
            chain = line[1:].split()[0]
            if chain.startswith(OUR_CHAIN_PREFIXES):
                ours.append(chain)
        elif line.startswith("-A "):
            words = shlex.split(line)
            chain = words[1]
            if chain.startswith(OUR_CHAIN_PREFIXES):
                continue  # goes with its chain's flush
            if _jump_target(words).startswith(OUR_CHAIN_PREFIXES):
                deletes.append("-D" + line[2:])
        elif line.strip() == "COMMIT":
            finish()
            table, ours, deletes = "", [], []
    return "\n".join(out) + ("\n" if out else "")


def _jump_target(words: list[str]) -> str:
    for flag in ("-j", "--jump", "-g", "--goto"):
        if flag in words:
            index = words.index(flag)
            if index + 1 < len(words):
                return words[index + 1]
    return ""


def ipsets_to_destroy(names: Iterable[str]) -> list[str]:
    return [name for name in names if name.startswith(OUR_IPSET_PREFIXES)]


def mounts_under(mountinfo_text: str, roots: Iterable[Path]) -> list[str]:
    """Mount points (from /proc/self/mountinfo) at or under any of `roots`, deepest first, for unmounting."""
    prefixes = [str(root).rstrip("/") for root in roots]
    found = []
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if any(point == prefix or point.startswith(prefix + "/") for prefix in prefixes):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def read_sysctls(names: Iterable[str] = SYSCTLS) -> dict[str, str]:
    values = {}
    for name in names:
        with contextlib.suppress(OSError):
            values[name] = _sysctl_path(name).read_text().strip()
    return values


def restore_sysctls(values: dict[str, str], progress: Progress) -> None:
    changed = []
    for name, value in values.items():
        path = _sysctl_path(name)
        try:
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
                changed.append(f"{name}={value}")
        except OSError as err:
            progress(f"  could not restore {name} to {value}: {err}")
    if changed:
        progress(f"  restored {', '.join(changed)}")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def kill_pods(progress: Progress, timeout_s: float = 20.0) -> None:
    """SIGKILL every process in the kubelet's cgroups (every container and sandbox), and wait for them to go."""
    deadline = time.monotonic() + timeout_s
    killed: set[int] = set()
    while True:
        pids = _kubepods_pids()
        if not pids:
            break
        for pid in pids - killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        if time.monotonic() > deadline:
            progress(f"  {len(pids)} container processes did not exit within {timeout_s:.0f}s: {sorted(pids)[:10]}")
            break
        time.sleep(0.1)
    if killed:
        progress(f"  killed {len(killed)} container processes")


def kill_shims(containerd_socket: Path, progress: Progress) -> None:
    """The runc shims of our containerd (they outlive it by design) and nothing else's: matched by -address."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and _option(argv, b"-address") == \
                str(containerd_socket).encode():
            found.append(int(proc.name))
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if found:
        progress(f"  stopped {len(found)} containerd shims")


def _option(argv: list[bytes], name: bytes) -> bytes | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def remove_kubepods_cgroups(progress: Progress, timeout_s: float = 10.0) -> None:
    directories = sorted(_kubepods_dirs(), key=lambda p: -len(p.parts))
    deadline = time.monotonic() + timeout_s
    left = []
    for directory in directories:
        while True:
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as err:
                if time.monotonic() > deadline:
                    left.append(f"{directory} ({err.strerror})")
                    break
                time.sleep(0.1)
    if directories:
        progress(f"  removed {len(directories) - len(left)} kubepods cgroups"
                 + (f"; left: {', '.join(left[:5])}" if left else ""))


def _kubepods_dirs() -> list[Path]:
    found: list[Path] = []
    for hierarchy in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
        for top in hierarchy.glob("kubepods*"):
            # os.walk passes over a cgroup that goes while it looks (the kubelet or a dying Pod removes them).
            for directory, _, _ in os.walk(top):
                found.append(Path(directory))
    return found


def _kubepods_pids() -> set[int]:
    pids: set[int] = set()
    for directory in _kubepods_dirs():
        with contextlib.suppress(OSError):
            pids.update(int(word) for word in (directory / "cgroup.procs").read_text().split())
    return pids


def unmount_under(roots: Iterable[Path], progress: Progress) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    points = mounts_under(Path("/proc/self/mountinfo").read_text(), roots)
    failed = []
    for point in points:
        if libc.umount2(point.encode(), _MNT_DETACH) != 0:
            errno = ctypes.get_errno()
            if errno not in (22, 2):  # EINVAL: no longer a mount point (a parent took it along); ENOENT
                failed.append(f"{point} ({os.strerror(errno)})")
    if points:
        progress(f"  unmounted {len(points) - len(failed)} mounts" + (f"; failed: {failed[:5]}" if failed else ""))


def remove_network(progress: Progress) -> None:
    for family in ("iptables", "ip6tables"):
        save, restore = shutil.which(f"{family}-save"), shutil.which(f"{family}-restore")
        if save is None or restore is None:
            continue
        saved = subprocess.run([save], capture_output=True, text=True, check=False)
        script = iptables_restore_script(saved.stdout)
        if not script:
            continue
        result = subprocess.run([restore, "--noflush"], input=script, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            progress(f"  {family}-restore could not remove the node's chains: {result.stderr.strip()[:500]}")
        else:
            progress(f"  removed {script.count(chr(10) + '-X ')} {family} chains and "
                     f"{script.count(chr(10) + '-D ')} rules jumping into them")
    ipset = shutil.which("ipset")
    if ipset:
        names = subprocess.run([ipset, "list", "-n"], capture_output=True, text=True, check=False).stdout.split()
        doomed = ipsets_to_destroy(names)
        for name in doomed:
            subprocess.run([ipset, "destroy", name], capture_output=True, check=False)
        if doomed:
            progress(f"  destroyed {len(doomed)} kube-router ipsets")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
        progress(f"  deleted the {BRIDGE} bridge")


def remove_machine_files(layout: NodeLayout, made_by_node: list[str], progress: Progress) -> None:
    """The files the kubelet, containerd and the CNI plugins keep outside the node's directory."""
    removed = []
    for path in (Path("/var/lib/kubelet/device-plugins"), Path("/var/lib/kubelet/plugins"),
                 Path("/var/lib/kubelet/plugins_registry"), Path("/var/lib/kubelet/pod-resources")):
        if path.exists() and str(path.parent) in made_by_node:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    results = Path("/var/lib/cni/results")
    for entry in results.glob(f"{NETWORK_NAME}-*") if results.is_dir() else []:
        entry.unlink(missing_ok=True)
    for path in (Path("/var/log/containers"),):
        for link in path.glob("*.log") if path.is_dir() else []:
            if str(layout.pod_logs) in os.readlink(link) if link.is_symlink() else False:
                link.unlink(missing_ok=True)
    for path in (Path("/run/containerd/s"), Path("/run/containerd/io.containerd.runtime.v2.task/k8s.io")):
        if path.is_dir() and "/run/containerd" in made_by_node:
            shutil.rmtree(path, ignore_errors=True)
    for name in made_by_node:
        path = Path(name)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    if removed:
        progress(f"  removed {', '.join(removed)}")
