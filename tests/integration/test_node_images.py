"""The node's images as their users meet them: what each archive's config says, what runs inside, and that
containerd takes them from the cache without a registry.

Builds what is missing (minutes cold, with progress; `scripts/bootstrap` builds them first), then reads the
archives with skopeo and runs commands in them with buildah, removing every container it made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corral.devcluster.imagecache import NodeImage
from corral.devcluster.images import PAUSE_REF, ensure_images, import_images

pytestmark = pytest.mark.integration

_TOOLS = ("buildah", "skopeo", "umoci", "mmdebstrap", "go")
_missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
if os.geteuid() != 0:
    pytest.skip("the node's images need root (mmdebstrap's root mode, buildah's storage)", allow_module_level=True)
if _missing:
    pytest.skip(f"making the node's images needs {', '.join(_missing)} (Debian packages; Go on PATH)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def images(request: pytest.FixtureRequest) -> dict[str, NodeImage]:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"[images] {line}")

    return ensure_images(say)


def config(image: NodeImage) -> dict[str, object]:
    out = subprocess.run(["skopeo", "inspect", "--config", f"docker-archive:{image.archive}"],
                         capture_output=True, text=True, check=True)
    parsed: dict[str, object] = json.loads(out.stdout)["config"]
    return parsed


@contextmanager
def container_of(image: NodeImage) -> Iterator[str]:
    """A buildah working container of the image, removed afterwards."""
    # The Corral image is in buildah's storage already (built there); reading a 400 MB archive again costs seconds.
    stored = subprocess.run(["buildah", "inspect", "--type", "image", image.ref], capture_output=True).returncode == 0
    source = ["--pull=never", image.ref] if stored else [f"docker-archive:{image.archive}"]
    made = subprocess.run(["buildah", "from", "--quiet", *source], capture_output=True, text=True, check=True)
    container = made.stdout.strip().splitlines()[-1]
    try:
        yield container
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=True)


def run_in(image: NodeImage, *command: str, user: str | None = None) -> str:
    """Run `command` in a container of the image (buildah, no network), as `user` or the image's own; the output."""
    with container_of(image) as container:
        user_args = ["--user", user] if user else []
        done = subprocess.run(["buildah", "run", "--network", "none", *user_args, container, "--", *command],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command} in {image.ref} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.timeout(3600)  # a cold cache builds them all; warm, this is a hash check
def test_every_image_is_named_under_corral_local_and_cached_as_an_archive(images: dict[str, NodeImage]) -> None:
    assert set(images) == {"pause", "busybox", "coredns", "local-path-provisioner", "mosquitto", "python", "corral"}
    assert images["pause"].ref == PAUSE_REF == "corral.local/pause:3.10"
    for image in images.values():
        assert image.ref.startswith(f"corral.local/{image.name}:"), image.ref
        assert image.archive.is_file(), image.archive
    assert images["corral"].ref.split(":")[1].startswith("0.1.0-")
    # A warm run is a hash check. Not Corral's: its tag follows the working tree, which may change during a run.
    others = [name for name in images if name != "corral"]
    started = time.monotonic()
    again = ensure_images(lambda line: pytest.fail(f"a warm run built something: {line}"), names=others)
    assert again == {name: images[name] for name in others}
    assert time.monotonic() - started < 10


def test_the_corral_image_runs_corral_as_10001(images: dict[str, NodeImage]) -> None:
    cfg = config(images["corral"])
    assert cfg["User"] == "10001:10001"
    assert cfg["Entrypoint"] == ["corral"]
    assert "0.1.0" in run_in(images["corral"], "corral", "--version")
    assert run_in(images["corral"], "id", "-u").strip() == "10001"


def test_the_broker_is_laid_out_as_eclipse_mosquitto(images: dict[str, NodeImage]) -> None:
    broker = images["mosquitto"]
    cfg = config(broker)
    assert cfg["Entrypoint"] == ["/docker-entrypoint.sh"]
    assert cfg["Cmd"] == ["/usr/sbin/mosquitto", "-c", "/mosquitto/config/mosquitto.conf"]
    script = (
        "id -u mosquitto; id -g mosquitto; stat -c '%u:%g %n' /mosquitto/config /mosquitto/data /mosquitto/log; "
        "test -f \"$(readlink -f /usr/lib/mosquitto_dynamic_security.so)\" && echo plugin-present"
    )
    lines = run_in(broker, "sh", "-c", script).split("\n")
    assert lines[:2] == ["1883", "1883"]
    assert lines[2:5] == ["1883:1883 /mosquitto/config", "1883:1883 /mosquitto/data", "1883:1883 /mosquitto/log"]
    assert "plugin-present" in lines
    # As the chart runs it: as 1883, through the image's entrypoint, with the plugin the chart names loaded.
    start = (
        "cd /mosquitto/data && echo '{\"clients\":[],\"roles\":[],\"groups\":[]}' > dynsec.json && printf '"
        "plugin /usr/lib/mosquitto_dynamic_security.so\\nplugin_opt_config_file /mosquitto/data/dynsec.json\\n"
        "listener 1883 127.0.0.1\\nallow_anonymous false\\nlog_dest file /mosquitto/log/mosquitto.log\\n' > m.conf; "
        "/docker-entrypoint.sh /usr/sbin/mosquitto -c m.conf & "
        "for i in $(seq 100); do grep -q running /mosquitto/log/mosquitto.log 2>/dev/null && break; sleep 0.1; done; "
        "kill $!; wait; cat /mosquitto/log/mosquitto.log"
    )
    log = run_in(broker, "sh", "-c", start, user="1883:1883")
    assert "Loading plugin: /usr/lib/mosquitto_dynamic_security.so" in log, log
    assert "mosquitto version 2.0" in log and " running" in log, log
    assert "Error" not in log, log


def test_pause_busybox_coredns_and_local_path(images: dict[str, NodeImage]) -> None:
    assert config(images["pause"])["Entrypoint"] == ["/usr/bin/catatonit", "-P"]
    coredns = config(images["coredns"])
    assert coredns["User"] == "65532:65532" and coredns["Entrypoint"] == ["/coredns"]
    assert "CoreDNS-1.14" in run_in(images["coredns"], "/coredns", "-version")
    tools = run_in(images["busybox"], "which", "nc", "wget", "nslookup", "mkdir", "rm").split()
    assert tools == ["/usr/bin/nc", "/usr/bin/wget", "/usr/bin/nslookup", "/bin/mkdir", "/bin/rm"]
    assert "local-path-provisioner" in run_in(images["local-path-provisioner"], "local-path-provisioner", "--help")


def test_coredns_binds_port_53_as_65532_through_its_file_capability(images: dict[str, NodeImage]) -> None:
    with container_of(images["coredns"]) as container:
        proc = subprocess.Popen(["buildah", "run", "--network", "none", "--user", "65532:65532", container, "--",
                                 "/coredns", "-conf", "stdin"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(".:53 {\n  whoami\n}\n")
        proc.stdin.close()
        lines: list[str] = []
        try:
            # CoreDNS prints its zones and version once it listens; a refused bind ends it with the error.
            for line in proc.stdout:
                lines.append(line.rstrip())
                if line.startswith("CoreDNS-"):
                    break
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert ".:53" in lines and any(line.startswith("CoreDNS-1.14") for line in lines), lines


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Path]:
    """A private containerd (no CRI), so the import is tested without touching the node's."""
    address = tmp_path / "containerd.sock"
    conf = tmp_path / "config.toml"
    conf.write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
    log = (tmp_path / "containerd.log").open("w")
    proc = subprocess.Popen(["containerd", "--config", str(conf), "--root", str(tmp_path / "root"),
                             "--state", str(tmp_path / "state"), "--address", str(address)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["ctr", "-a", str(address), "version"], capture_output=True).returncode != 0:
            assert proc.poll() is None, (tmp_path / "containerd.log").read_text()
            assert time.monotonic() < deadline, "containerd did not answer within 30 s"
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.skipif(shutil.which("containerd") is None or shutil.which("ctr") is None, reason="needs containerd")
def test_containerd_imports_the_archives_under_their_names_once(
    images: dict[str, NodeImage], containerd: Path
) -> None:
    wanted = [images["pause"], images["busybox"]]
    said: list[str] = []
    import_images("ctr", containerd, wanted, said.append)
    assert len(said) == 2
    listed = subprocess.run(["ctr", "-a", str(containerd), "-n", "k8s.io", "images", "ls", "-q"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert {i.ref for i in wanted} <= set(listed)
    import_images("ctr", containerd, wanted, said.append)
    assert len(said) == 2, f"a second import loaded again: {said[2:]}"
