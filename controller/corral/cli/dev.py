"""`corral dev up|down|status|build|images`: the local control plane and broker for development and tests."""

from __future__ import annotations

from pathlib import Path

import click

from corral.devcluster import files
from corral.devcluster.addonbinaries import ensure_kube_router
from corral.devcluster.errors import DevClusterError
from corral.devcluster.helmbinary import ensure_helm
from corral.devcluster.images import ensure_images
from corral.devcluster.images_corral import DEFAULT_VERSION
from corral.devcluster.kubebinary import ensure_binary
from corral.devcluster.node import DevNode
from corral.devcluster.plane import DEFAULT_STATE_DIR, DevPlane

state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="Where the plane keeps its data, logs, kubeconfig and env file.",
)


def _progress(line: str) -> None:
    click.echo(line, err=True)


@click.group()
def dev() -> None:
    """Local control plane (kube-apiserver + etcd) and Mosquitto broker."""


@dev.command()
@state_dir_option
@click.option("--node", is_flag=True,
              help="Also run a node on this machine, as a k3s server does: containerd, kubelet, scheduler, "
                   "controller-manager, kube-proxy, CoreDNS, local-path StorageClass, kube-router policies (root).")
def up(state_dir: Path, node: bool) -> None:
    """Start the plane, or reuse it if it already runs; build kube-apiserver on first use."""
    try:
        if node:
            with_node = DevNode(state_dir, progress=_progress).up()
            plane = with_node.plane
        else:
            plane = DevPlane(state_dir, progress=_progress).up()
    except DevClusterError as err:
        raise click.ClickException(str(err)) from None
    if node:
        click.echo(f"node {with_node.node_name} at {with_node.node_ip}: Ready (containerd {with_node.containerd_socket})")
    click.echo(f"kube-apiserver {plane.version} at {plane.server}")
    click.echo(f"MQTT broker at {plane.mqtt_url} and {plane.mqtt_tls_url} (CA {plane.mqtt_ca_file}); no anonymous "
               f"clients: the controller's account is named in the env file, its password in "
               f"{plane.password_file(files.BROKER_CONTROLLER)}; devices get theirs with `corral devices enroll`")
    click.echo(f"kubeconfig: {plane.kubeconfig}")
    click.echo(
        f"  contexts: {files.ADMIN_CONTEXT} (admin, current), {files.DEV_USER_CONTEXT} (no rights until you bind a role)"
    )
    click.echo(f"kubectl matching the server: {plane.kubectl}")
    click.echo(f"env: {plane.env_file}")
    click.echo(f"Try: source {plane.env_file} && kubectl get --raw /readyz")


@dev.command()
@state_dir_option
@click.option("--purge", is_flag=True, help="Also delete the state directory (etcd data, certificates, tokens).")
def down(state_dir: Path, purge: bool) -> None:
    """Stop the processes `corral dev up` started here (only those, identified by pid and command line); with a
    node, also remove its containers, mounts, iptables rules, cni0 bridge and cgroups, and restore its sysctls."""
    try:
        for line in DevNode(state_dir, progress=_progress).down(purge=purge):
            click.echo(line)
    except DevClusterError as err:
        raise click.ClickException(str(err)) from None


@dev.command()
@state_dir_option
def status(state_dir: Path) -> None:
    """Show whether the plane runs; exit 1 when any part of it does not."""
    try:
        components = DevPlane(state_dir, progress=_progress).status()
        components += DevNode(state_dir, progress=_progress).status()
    except DevClusterError as err:
        raise click.ClickException(str(err)) from None
    for c in components:
        pid = f"pid {c.pid}" if c.pid else "-"
        click.echo(f"{c.name:<23} {pid:<11} {c.endpoint or '-':<28} {c.detail}")
    if not all(c.running for c in components):
        raise SystemExit(1)


@dev.command()
@click.option("--node", is_flag=True,
              help="Also what `corral dev up --node` and the chart on it need: kube-router (CoreDNS and "
                   "local-path-provisioner come with their images), every image of `corral dev images`, and helm.")
def build(node: bool) -> None:
    """Build (or find in the cache) corral-kube and print its path; cold builds show progress and are cached."""
    try:
        binary = ensure_binary(_progress)
        if node:
            ensure_kube_router(_progress)
            ensure_images(_progress)
            ensure_helm(_progress)
    except DevClusterError as err:
        raise click.ClickException(str(err)) from None
    click.echo(binary.path)


@dev.command()
@click.option("--only", "only", multiple=True, metavar="NAME",
              help="Build only this image (repeatable): pause, busybox, coredns, local-path-provisioner, mosquitto, "
                   "python, corral.")
@click.option("--corral-version", default=DEFAULT_VERSION, show_default=True,
              help="The Corral image's version label and tag prefix (a newer one for an upgrade).")
def images(only: tuple[str, ...], corral_version: str) -> None:
    """Build (or find in the cache) the local node's images and print each one's name and archive."""
    try:
        built = ensure_images(_progress, names=only or None, corral_version=corral_version)
    except DevClusterError as err:
        raise click.ClickException(str(err)) from None
    for image in built.values():
        click.echo(f"{image.ref}\t{image.archive}")
