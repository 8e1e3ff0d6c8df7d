"""Canonical JSON and content hashes, so that equal contracts and equal parameters hash equally.

Canonical form: the validated model dumped to JSON types, keys sorted, no
insignificant white space, UTF-8. Hashes are SHA-256, hex.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from corral.contract.model import Contract

# Fields that differ between identical devices (or describe the announcement,
# not the device type) and so stay out of the Capability's content address.
_PER_DEVICE_FIELDS = {"device_id", "signature"}


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def capability_content(contract: Contract) -> dict[str, Any]:
    """The part of a contract that identical devices share: what a Capability stores."""
    return contract.model_dump(mode="json", exclude=_PER_DEVICE_FIELDS, exclude_none=True)


def capability_hash(contract: Contract) -> str:
    return sha256_hex(capability_content(contract))


def signed_bytes(contract: Contract) -> bytes:
    """What a contract signature covers: the device type's contract, as its firmware is built, so without the
    device id (each instance gets its own at run time) and the signature; exactly what a Capability stores.

    A signature vouches for what a device type can do, not for which device says it: that is the device's own
    broker account. A device announcing another type's genuine contract is a contract change like any other.
    """
    return canonical_json(capability_content(contract))


def device_bound_bytes(contract: Contract) -> bytes:
    """What a signature made for one device covers (the protocol's first form): the device id too."""
    return canonical_json(contract.model_dump(mode="json", exclude={"signature"}, exclude_none=True))
