"""Corral's layering, as rules over every import in controller/corral (tests/imports.py reads them with ast).

Every import counts: at the top, under TYPE_CHECKING and inside functions, since each is a dependency a reader
follows and a cycle through any of them is still a cycle. The layers, from the floor up:
- api, contract, decide: the vocabulary and the pure decisions, with no I/O, unit-tested without a cluster;
- kube: the shared Kubernetes floor (client, informer, caches, work queue, conditions, Events), which knows
  nothing of the controllers or the programs built on it;
- reconcile (the controllers), gateway, serving, cli: the programs. serving is started by the controller, so it
  must not import it back; the CLI starts the controller but does not reach into it.
"""

from __future__ import annotations

from collections.abc import Iterable

from tests.imports import CORRAL, Import, cycles, imports, shown, within

FOUND = imports(CORRAL)

# What "no I/O" means for the pure layers: Kubernetes, MQTT, MCP, HTTP and sockets, processes, the event loop.
IO_MODULES = ("kopf", "paho", "mcp", "aiohttp", "kubernetes", "kubernetes_asyncio", "socket", "ssl", "http", "urllib",
              "requests", "httpx", "asyncio", "subprocess", "os", "shutil", "starlette", "uvicorn", "anyio")
# The packages the pure layers may use of Corral's own: each other and the API vocabulary.
PURE = ("corral.decide", "corral.contract")
PURE_MAY_IMPORT = (*PURE, "corral.api")
# The programs built on the floor, which the floor must not know.
ABOVE_THE_FLOOR = ("corral.reconcile", "corral.gateway", "corral.cli", "corral.serving", "corral.notify")
# `corral run` (cli/run.py) is the controller's entry point: it builds the controller's settings from its options and
# hands them to the kopf registry. Those settings and that entry point, and nothing else of reconcile/, are the CLI's
# to import.
CLI_RUN = "corral.cli.run"
CLI_RUN_MAY_IMPORT = ("corral.reconcile.config", "corral.reconcile.intents.settings", "corral.reconcile.handlers")


def offenders(found: Iterable[Import]) -> str:
    return "\n".join(f"  {imp}" for imp in dict.fromkeys(found))  # one line per statement, not per imported name


def test_no_import_cycle_anywhere_in_corral() -> None:
    loops = cycles(imp for imp in FOUND if within(imp.target, "corral"))
    assert not loops, "import cycles (each shown the shortest way round):\n" + "\n".join(map(shown, loops))


def test_the_kubernetes_floor_imports_no_controller_gateway_cli_serving_or_notifier() -> None:
    wrong = [imp for imp in FOUND if within(imp.source, "corral.kube")
             and any(within(imp.target, above) for above in ABOVE_THE_FLOOR)]
    assert not wrong, "corral.kube must not import the code built on it:\n" + offenders(wrong)


def test_decide_and_contract_import_no_io_not_even_through_what_they_import() -> None:
    # Breadth first from the pure modules through every corral module they reach: an I/O import in corral.api would
    # make decide/ impure as surely as one in decide/ itself.
    chain: dict[str, list[Import]] = {imp.source: [] for imp in FOUND if any(within(imp.source, p) for p in PURE)}
    queue, wrong = list(chain), []
    for module in queue:
        for imp in (imp for imp in FOUND if imp.source == module):
            if any(within(imp.target, io) for io in IO_MODULES):
                wrong.append(" -> ".join([*(i.source for i in chain[module]), module, imp.target])
                             + f"  ({imp.path.name}:{imp.line}, {imp.how})")
            elif within(imp.target, "corral") and imp.target not in chain:
                chain[imp.target] = [*chain[module], imp]
                queue.append(imp.target)
    assert not wrong, ("decide/ and contract/ are pure: no Kubernetes, MQTT, MCP or other I/O, directly or through "
                       "what they import:\n" + "\n".join(f"  {line}" for line in dict.fromkeys(wrong)))


def test_decide_and_contract_import_only_each_other_and_the_api_of_corral() -> None:
    wrong = [imp for imp in FOUND if any(within(imp.source, pure) for pure in PURE) and within(imp.target, "corral")
             and not any(within(imp.target, allowed) for allowed in PURE_MAY_IMPORT)]
    assert not wrong, "decide/ and contract/ may import only decide, contract and api of corral:\n" + offenders(wrong)


def test_serving_does_not_import_the_controller_that_starts_it() -> None:
    wrong = [imp for imp in FOUND if within(imp.source, "corral.serving") and within(imp.target, "corral.reconcile")]
    assert not wrong, "serving/ is started by reconcile/controller.py and must not import reconcile/:\n" + offenders(wrong)


def test_the_cli_imports_of_the_controller_only_what_corral_run_starts_it_with() -> None:
    wrong = [imp for imp in FOUND if within(imp.source, "corral.cli") and within(imp.target, "corral.reconcile")
             and not (imp.source == CLI_RUN and imp.target in CLI_RUN_MAY_IMPORT)]
    assert not wrong, (f"of reconcile/, the CLI imports only {', '.join(CLI_RUN_MAY_IMPORT)}, and only in cli/run.py "
                       "(`corral run`):\n" + offenders(wrong))


# scale/ (issue 31) is read by every door of the controller: it stands on the Kubernetes floor and knows none of the
# programs built on it; its plan and its hash are pure, so the fleet's arithmetic is unit-tested without a cluster.
SCALE = "corral.scale"
SCALE_PURE = ("corral.scale.plan", "corral.scale.hashing")


def test_scale_imports_only_the_kubernetes_floor_and_its_pure_parts_no_io() -> None:
    above = [imp for imp in FOUND if within(imp.source, SCALE)
             and any(within(imp.target, program) for program in ABOVE_THE_FLOOR)]
    assert not above, "scale/ must not import the programs that ask it who owns what:\n" + offenders(above)
    impure = [imp for imp in FOUND if imp.source in SCALE_PURE
              and (any(within(imp.target, io) for io in IO_MODULES)
                   or (within(imp.target, "corral") and imp.target not in SCALE_PURE))]
    assert not impure, "scale/plan.py and scale/hashing.py are pure (no I/O, no other corral module):\n" + offenders(impure)
