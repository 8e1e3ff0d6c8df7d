"""Installing Corral's API into a cluster without Helm: the generated CRDs, then the admission policies.

`corral demo` uses it, and so do the tests and benchmarks that bring up a plane of their own. Applied
server-side and forced, as an installer does: the generated manifests are the authority over these objects.
"""

from __future__ import annotations

import time

import kubernetes
import yaml

from corral.api import manifests
from corral.client.apply import apply_yaml

POLICIES = "admission-policies.yaml"


def install_api(admin: kubernetes.client.ApiClient, field_manager: str = "corral-install",
                timeout_s: float = 30.0) -> None:
    """Apply the CRDs, wait until the API server serves them (Established), then apply the policies."""
    rendered = manifests.rendered()
    crds = [text for name, text in rendered.items() if name != POLICIES]
    for text in crds:
        apply_yaml(admin, text, field_manager=field_manager, force=True)
    extensions = kubernetes.client.ApiextensionsV1Api(admin)
    deadline = time.monotonic() + timeout_s
    for text in crds:
        name = yaml.safe_load(text)["metadata"]["name"]
        while not any(c.type == "Established" and c.status == "True"
                      for c in extensions.read_custom_resource_definition(name).status.conditions or []):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} was not established within {timeout_s:g} s")
            time.sleep(0.2)
    apply_yaml(admin, rendered[POLICIES], field_manager=field_manager, force=True)
