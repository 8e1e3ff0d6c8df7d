"""The history store stands alone (DESIGN.md "Layout": history/): no kopf, MQTT or MCP, no other Corral package,
so a CLI, a bench or a test opens a history file without the controller, and the controller wires it in from above."""

from __future__ import annotations

from tests.imports import CORRAL, imports, within

HISTORY = "corral.history"
FORBIDDEN = ("kopf", "paho", "mcp", "aiohttp", "kubernetes", "kubernetes_asyncio", "uvicorn", "starlette")


def test_history_imports_no_kopf_mqtt_mcp_nor_any_other_corral_package() -> None:
    found = [imp for imp in imports(CORRAL) if within(imp.source, HISTORY)]
    assert found, "corral.history has no imports at all? the walker did not find the package"
    wrong = [str(imp) for imp in found if any(within(imp.target, f) for f in FORBIDDEN)
             or (within(imp.target, "corral") and not within(imp.target, HISTORY))]
    assert not wrong, "corral.history must stand alone:\n" + "\n".join(wrong)


def test_nothing_in_the_pure_layers_imports_history() -> None:
    wrong = [str(imp) for imp in imports(CORRAL) if within(imp.target, HISTORY)
             and any(within(imp.source, p) for p in ("corral.decide", "corral.contract", "corral.api", "corral.kube"))]
    assert not wrong, "the pure layers and the Kubernetes floor do not keep history:\n" + "\n".join(wrong)
