"""The location label the controller keeps on every Device: `corral.dev/location`, from the overlay's location.

Whoever set the overlay (a person with kubectl, or an overlay Intent), the label follows it (api/locations.py
says how the text becomes a label value), so that `kubectl get devices -l corral.dev/location=kitchen` and the
gateway's location selector agree. Written by server-side apply under a field manager of its own, only when the
label differs from what the overlay says. The Device controller calls it on every Device it reconciles (a new
Device, a spec change, a label someone changed by hand); an overlay Intent calls it right after writing the
location, so an agent's next group call finds the device at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.device import Device
from corral.api.locations import LOCATION_LABEL, LOCATIONS_MANAGER, location_label
from corral.kube.client import APPLY, MERGE, ApiError, path_of
from corral.kube.objects import Kube
from corral.kube.typed import Body

log = logging.getLogger(__name__)


class LocationLabels:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def sync_device(self, device: Device) -> Body | None:
        overlay = device.spec.overlay
        return await self.sync(device.metadata.namespace or "", device.metadata.name or "", device.metadata.labels,
                               overlay.location if overlay is not None else None)

    async def sync(self, namespace: str, name: str, labels: Mapping[str, str] | None, location: str | None
                   ) -> Body | None:
        """Bring the label of Device namespace/name (its labels as last seen) in step with `location`. The Device
        as the API server now has it, or None when nothing was written (in step already, or the Device is gone).
        A refusal other than 404 is logged, not raised: a label must never keep a device from being driven; the
        next reconcile of the Device tries again."""
        wanted = location_label(location)
        if (labels or {}).get(LOCATION_LABEL) == wanted:
            return None
        path = path_of(GROUP, VERSION, "devices", namespace, name)
        try:
            if wanted is not None:
                # force: the label is the overlay's, and the controller says what it is; a value someone set by hand
                # would make the label and the selector disagree.
                return await self._apply(path, name, {LOCATION_LABEL: wanted})
            # No location: give the label up. Applying without it removes it where this manager alone owned it;
            # one someone else set (kubectl label) is removed by a merge patch, for the same reason as the force.
            written = await self._apply(path, name, {})
            if LOCATION_LABEL not in ((written.get("metadata") or {}).get("labels") or {}):
                return written
            return await self.kube.api.request("PATCH", path, body={"metadata": {"labels": {LOCATION_LABEL: None}}},
                                               content_type=MERGE, params={"fieldManager": LOCATIONS_MANAGER})
        except ApiError as err:
            if err.status != 404:
                log.warning("could not bring the location label of Device %s/%s in step (%s): %s %s", namespace, name,
                            wanted or "none", err.status, err.message)
            return None

    async def _apply(self, path: str, name: str, labels: dict[str, str]) -> Body:
        patch = {"apiVersion": API_VERSION, "kind": "Device", "metadata": {"name": name, "labels": labels}}
        return await self.kube.api.request("PATCH", path, body=patch, content_type=APPLY,
                                           params={"fieldManager": LOCATIONS_MANAGER, "force": "true"})
