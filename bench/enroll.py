"""Enrollment at scale: how long until N enrolled devices may log in, and what a controller restart costs.

1. `corral devices enroll` for N devices (their Devices and credential Secrets), 8 at a time;
2. the controller starts and makes one client and one role per device in Mosquitto's dynamic security
   plugin (the plugin rewrites its whole state file on every change: the cost grows with the fleet);
   timed until the broker lists all N;
3. the controller restarts and compares the broker's accounts with the enrollments (nothing to change):
   timed until it is healthy and the accounts are checked (its log says so).

    .venv/bin/python bench/enroll.py [--devices 5000] [--fresh-plane]

Prints the figures; writes bench/results/enroll-<time>.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import bench_plane, say, write_result
from corral.client.enroll import enroll
from corral.client.install import install_api
from corral.devcluster.plane import Plane
from corral.devices.accounts import ROLE_PREFIX
from tests.broker_harness import dynsec
from tests.controller_harness import ControllerProcess
from tests.harness import api_client, fresh_namespace


def broker_accounts(plane: Plane, slowest: list[float]) -> int | None:
    """Device roles the broker lists, or None when it did not answer within 10 s (busy rewriting its
    plugin state); `slowest` keeps the longest time an answer took."""
    started = time.monotonic()
    try:
        listed = dynsec(plane, [{"command": "listRoles", "count": -1}])
    except (AssertionError, OSError):
        slowest[0] = max(slowest[0], time.monotonic() - started)
        return None
    slowest[0] = max(slowest[0], time.monotonic() - started)
    return sum(1 for role in listed[0]["data"]["roles"] if str(role).startswith(ROLE_PREFIX))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=5000)
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    args = parser.parse_args()
    prefix = f"enroll-{uuid.uuid4().hex[:6]}"
    with bench_plane(args.fresh_plane) as plane, tempfile.TemporaryDirectory() as logs:
        admin = api_client(plane)
        install_api(admin)
        slowest = [0.0]
        before = broker_accounts(plane, slowest) or 0
        with fresh_namespace(admin, "bench-enroll") as namespace:
            say(f"  enrolling {args.devices} devices in {namespace}")
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: enroll(admin, namespace, f"relay-{i}", "relay"), range(args.devices)))
            enroll_s = time.monotonic() - started
            say(f"  enrolled in {enroll_s:.1f} s; starting the controller")
            controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log",
                                           "--max-devices-per-namespace", str(args.devices))
            started = time.monotonic()
            controller.start()
            last, unanswered, slowest[0] = -1, 0, 0.0
            while True:
                listed = broker_accounts(plane, slowest)
                if listed is None:
                    unanswered += 1
                    say("  the broker did not answer within 10 s")
                    continue
                if listed - before >= args.devices:
                    break
                if listed - before != last:
                    say(f"  {listed - before}/{args.devices} broker accounts")
                    last = listed - before
                time.sleep(1.0)
            accounts_s = time.monotonic() - started
            say(f"  all {args.devices} accounts after {accounts_s:.1f} s; restarting the controller")
            controller.stop()
            log = Path(logs) / "controller.log"
            offset = log.stat().st_size
            started = time.monotonic()
            controller.start()
            while "broker accounts" not in log.read_text(errors="replace")[offset:]:
                time.sleep(0.2)
            restart_s = time.monotonic() - started
            controller.stop()
            state = Path(plane.state_dir) / "broker" / "dynamic-security.json"
            size_mib = state.stat().st_size / 2**20 if state.exists() else float("nan")
    result = {"devices": args.devices, "enroll_s": round(enroll_s, 1), "broker_accounts_s": round(accounts_s, 1),
              "restart_checked_s": round(restart_s, 1), "dynsec_file_mib": round(size_mib, 1),
              "slowest_broker_answer_s": round(slowest[0], 1), "unanswered_listings": unanswered}
    print(f"{args.devices} devices: enrolled (Devices and Secrets) in {enroll_s:.1f} s; broker accounts made by "
          f"the controller in {accounts_s:.1f} s; after a restart checked in {restart_s:.1f} s; "
          f"plugin state file {size_mib:.1f} MiB; the broker's slowest answer meanwhile {slowest[0]:.1f} s "
          f"({unanswered} listings unanswered within 10 s)")
    write_result("enroll", result)


if __name__ == "__main__":
    main()
