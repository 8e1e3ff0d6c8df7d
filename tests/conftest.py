"""Session fixtures: one real control plane and one real broker per test run, a namespace per test.

If `corral dev up` already runs in this checkout (.corral/dev), the tests reuse
it; otherwise they start their own plane in a temporary directory and remove
it afterwards. They never read $KUBECONFIG, so a test run cannot touch any
other cluster. Under pytest-xdist (`-n 2 --dist loadgroup`) each worker starts
a plane of its own, a module runs on one worker, and the tests on the real
node (one per machine) all on the same one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from hypothesis import settings

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.client.install import install_api
from corral.devcluster.node import NodePlane
from corral.devcluster.plane import DevPlane, Plane
from tests.harness import api_client, fresh_namespace, wait_for
from tests.node_harness import node_plane_session

REPO_ROOT = Path(__file__).resolve().parents[1]
PLANE_SUMMARY = pytest.StashKey[list[str]]()


# Property tests and fuzzing: a short campaign by default, a long one with --slow.
settings.register_profile("default-run", max_examples=200, deadline=None)
settings.register_profile("campaign", max_examples=int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "20000")), deadline=None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run long fuzz and soak campaigns")


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("campaign" if config.getoption("--slow") else "default-run")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: scripts/test selects its tiers by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests on the real node run last, together: the node (kubelet, containerd, the chart's Pods) then lives
    # only for them instead of loading two cores under the rest of the suite. The sort is stable: file order holds.
    items.sort(key=_on_the_node)
    workers = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if _on_the_node(item):
            item.add_marker(pytest.mark.node)
        if workers:
            # With pytest-xdist's `--dist loadgroup`: a module stays on one worker (its module-scoped planes and
            # fleets start once), and every test on the real node on the same one (the machine has one node).
            item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="long campaign: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# Modules that must not run at the same moment on two workers: both start a demo, which takes the README's audit
# port 8443 when it is free (corral.devcluster.demo.AUDIT_PORT); two checking at once would both take it.
ONE_WORKER = {"tests/integration/test_demo.py": "demo", "tests/integration/test_readme.py": "demo"}


def _worker_group(item: pytest.Item) -> str:
    if _on_the_node(item):
        return "node"
    module = item.nodeid.split("::")[0]
    return ONE_WORKER.get(module, module)


def _on_the_node(item: pytest.Item) -> bool:
    return "node_plane" in getattr(item, "fixturenames", ())


def _say(config: pytest.Config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"[plane] {line}")

    return say


@pytest.fixture(scope="session")
def plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    say = _say(request.config)
    dev_dir = Path(os.environ.get("CORRAL_DEV_STATE_DIR", REPO_ROOT / ".corral" / "dev"))
    # Under pytest-xdist every worker starts a plane of its own: cluster-wide objects of fixed names (the readings
    # APIService, the admission policies) must not be shared by tests running at the same moment.
    running = DevPlane(dev_dir, progress=say).running() if "PYTEST_XDIST_WORKER" not in os.environ else None
    if running is not None:
        say(f"reusing the plane of `corral dev up` in {dev_dir}")
        request.config.stash[PLANE_SUMMARY] = _describe(running)
        yield running
        return
    own = DevPlane(tmp_path_factory.mktemp("plane"), progress=say)
    started = own.up()
    request.config.stash[PLANE_SUMMARY] = _describe(started)
    try:
        yield started
    finally:
        for line in own.down(purge=True):
            say(line)


@pytest.fixture(scope="session")
def node_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodePlane]:
    """A plane of its own with a real node (kubelet, containerd, CoreDNS, local-path, kube-router), Ready; skipped
    when not root (tests/node_harness.py)."""
    yield from node_plane_session(tmp_path_factory.mktemp("node"), _say(request.config))


@pytest.fixture(scope="session")
def kube(plane: Plane) -> kubernetes.client.ApiClient:
    """An admin client (system:masters) for the plane."""
    return api_client(plane)


@pytest.fixture(scope="session")
def corral_api(kube: kubernetes.client.ApiClient) -> kubernetes.client.ApiClient:
    """The plane with Corral's generated CRDs and admission policies installed (the content of crds/; a unit
    test keeps the two equal), and the policies in force."""
    install_api(kube)
    wait_for(lambda: _policies_enforced(kube), "the admission policies to take effect", timeout_s=30)
    return kube


def _policies_enforced(kube: kubernetes.client.ApiClient) -> bool:
    """True once a forged requester is refused (policies take a moment to be loaded after creation)."""
    forged = {
        "apiVersion": API_VERSION,
        "kind": "Intent",
        "metadata": {"name": "policy-probe"},
        "spec": {
            "device": "probe", "actuator": "probe", "action": "set_state", "params": {"value": True},
            "reason": "probe", "requester": "somebody-else",
        },
    }
    try:
        kubernetes.client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, "default", "intents", forged, dry_run="All"
        )
    except kubernetes.client.ApiException as err:
        return err.status == 403 and "corral-intent-requester" in err.body
    return False


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: kubernetes.client.ApiClient) -> Iterator[str]:
    """A fresh namespace for one test."""
    with fresh_namespace(kube, request.node.name) as name:
        yield name


def _describe(plane: Plane) -> list[str]:
    """What the run's log should show about the plane it tested against (read while it runs)."""
    version = kubernetes.client.VersionApi(api_client(plane)).get_code()
    return [
        f"kube-apiserver /version: gitVersion={version.git_version} major={version.major} minor={version.minor} "
        f"goVersion={version.go_version} platform={version.platform} at {plane.server}",
        f"MQTT broker: {plane.mqtt_url}",
    ]


def pytest_sessionfinish(session: pytest.Session) -> None:
    # On a pytest-xdist worker: the summary of its plane goes to the controller, which prints every worker's.
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["plane_summary"] = session.config.stash.get(PLANE_SUMMARY, [])


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a worker finished
def pytest_testnodedown(node) -> None:
    lines = getattr(node, "workeroutput", {}).get("plane_summary") or []
    worker = node.gateway.id
    node.config.stash.setdefault(PLANE_SUMMARY, []).extend(f"{worker}: {line}" for line in lines)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    lines = config.stash.get(PLANE_SUMMARY, None)
    if lines:
        terminalreporter.write_sep("-", "local plane")
        for line in lines:
            terminalreporter.write_line(line)
