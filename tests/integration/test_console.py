"""The approval page (`corral console`) in a real browser: Debian's Chromium driven by Playwright.

One controller, two simulated locks, one console process and one browser for the module. People are
ServiceAccounts in the people namespace (corral-people) with their own tokens: an approver holding `approve`
on the test namespace's devices, and a viewer who may list Intents but approve nothing. An agent (a
ServiceAccount of the test namespace) asks for the high-risk actions. Everything runs against the real
kube-apiserver: the console holds no rights of its own and acts with the signed-in person's token.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright

from corral.api.codes import GROUP, PEOPLE_NAMESPACE, VERSION
from corral.client.intents import submit, wait_settled
from corral.console.guard import CONTENT_SECURITY_POLICY
from corral.devcluster.naming import name_devices
from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import CORRAL, ControllerProcess, device
from tests.fleet_harness import running_fleet
from tests.harness import (
    api_client,
    fresh_namespace,
    grant,
    healthz,
    person_name,
    person_user,
    service_account_token,
    token_of,
    wait_for,
    wait_until_allowed,
)

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
FLEET = {"front-lock": "lock", "back-lock": "lock"}
HOSTILE_ALIAS = "<img src=x onerror=window.xss=1>"
HOSTILE_LOCATION = "<script>window.xss=2</script>"
HOSTILE_REASON = "<img src=x onerror=alert(document.cookie)> open up"
# Each word of an element's text lies on one line (a Range over a word broken across lines has two boxes).
WHOLE_WORDS = """e => {
  const text = e.textContent;
  const words = [...text.matchAll(/\\S+/g)];
  const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  const nodes = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) nodes.push(n);
  return words.length > 0 && nodes.every((node) => [...node.data.matchAll(/\\S+/g)].every((m) => {
    const r = document.createRange();
    r.setStart(node, m.index);
    r.setEnd(node, m.index + m[0].length);
    return r.getClientRects().length === 1;
  }));
}"""
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console-phone.png"
PHONE = {"width": 390, "height": 844}

@dataclass
class Home:
    plane: Plane
    namespace: str
    admin: kubernetes.client.ApiClient
    agent: kubernetes.client.ApiClient
    approver_token: str
    approver: str  # username
    viewer_token: str
    alice_token: str  # a person named alice (ServiceAccount corral-people/alice), who may approve as the approver
    url: str  # the console
    console_log: Path
    browser: Browser

    def ask(self, device_name: str, value: bool = True, reason: str = "Everyone left the house") -> str:
        """The agent asks for a high-risk change; the name of its Intent, once it waits for approval."""
        name = f"lock-{uuid.uuid4().hex[:8]}"
        spec = {"device": device_name, "actuator": "locked", "action": "set_state", "params": {"value": value},
                "reason": reason, "requester": f"system:serviceaccount:{self.namespace}:agent"}
        assert submit(self.agent, self.namespace, name, spec).code == "CREATED"
        phase = (wait_settled(self.agent, self.namespace, name, timeout_s=20).get("status") or {}).get("phase")
        assert phase == "AwaitingApproval", phase
        return name

    def intent(self, name: str) -> dict[str, Any]:
        return dict(kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "intents", name))

    def approvals(self, intent_name: str) -> list[dict[str, Any]]:
        items = kubernetes.client.CustomObjectsApi(self.admin).list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "approvals")["items"]
        return [a for a in items if a["spec"]["intent"]["name"] == intent_name]

    def context(self) -> BrowserContext:
        return self.browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)

    def sign_in(self, page: Page, token: str, path: str = "/", name: str | None = None) -> None:
        """Sign in with a person's token; the header then names them (their own name, not the username)."""
        page.goto(self.url + path)
        page.get_by_label("Token").fill(token)
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#username")).to_have_text(name or person_name(self.namespace, "approver"))


def _alice(plane: Plane, admin: kubernetes.client.ApiClient, namespace: str) -> str:
    """A person named alice (ServiceAccount alice of the people namespace) bound to the approver's Role; her token."""
    token = service_account_token(admin, PEOPLE_NAMESPACE, "alice")
    kubernetes.client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(namespace, {
        "metadata": {"name": "alice"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "approver"},
        "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": PEOPLE_NAMESPACE}]})
    wait_until_allowed(api_client(plane, token=token), "approve", namespace, "devices")
    return token


def _read_contracts(admin: kubernetes.client.ApiClient, prefix: str, people: list[str]) -> str:
    """Let these people (ServiceAccounts of the people namespace) read Capabilities; the ClusterRole's name."""
    name = f"{prefix}-capabilities"
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [GROUP], "resources": ["capabilities"], "verbs": ["get", "list"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": who, "namespace": PEOPLE_NAMESPACE} for who in people]})
    return name


def _alive(process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"corral console exited with {process.returncode}:\n{log.read_text()[-3000:]}")
    return True


def _overlay(admin: kubernetes.client.ApiClient, namespace: str, name: str, alias: str, location: str) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": name},
            "spec": {"deviceId": name, "overlay": {"alias": alias, "location": location}}}
    kubernetes.client.CustomObjectsApi(admin).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "devices", name, body, field_manager="kubectl", force=True,
        _content_type="application/apply-patch+yaml")


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: scripts/bootstrap installs Debian's chromium")
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def home(plane: Plane, corral_api: kubernetes.client.ApiClient, playwright: Playwright,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    logs = tmp_path_factory.mktemp("console")
    prefix = f"con-{uuid.uuid4().hex[:8]}"
    core = kubernetes.client.CoreV1Api(corral_api)
    with fresh_namespace(corral_api, "console") as namespace:
        agent = grant(plane, corral_api, namespace, "agent", "[get, list, read, listen, write]", "[get]", "write")
        # People (ServiceAccounts of the people namespace): one who may approve, one who may only look.
        approver_token = token_of(grant(plane, corral_api, namespace, "approver", "[get, list, read, approve]",
                                        "[get, list, create]", "approve", person=True))
        viewer_token = token_of(grant(plane, corral_api, namespace, "viewer", "[get, list, read]", "[get, list]",
                                      "read", person=True))
        alice_token = _alice(plane, corral_api, namespace)
        # Device contracts are readable by everyone signed in, as the chart and the demo bind them (capability-reader
        # to system:authenticated); here only the two who approve, so the viewer shows a card without them.
        contracts = _read_contracts(corral_api, prefix, [person_name(namespace, "approver"), "alice"])
        wait_until_allowed(api_client(plane, token=alice_token), "get", "", "capabilities")
        port = free_port()
        console_log = logs / "console.log"
        with running_fleet(plane, prefix, FLEET, enroll_in=(corral_api, namespace)) as _fleet, \
                open(console_log, "ab") as log:
            # The admin kubeconfig on purpose: the console takes only the cluster's address and CA from it.
            console = subprocess.Popen([CORRAL, "console", "--port", str(port), "-n", namespace,
                                        "--kubeconfig", str(plane.kubeconfig)],
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log",
                                           "--intent-timeout", "4", "--approval-window", "120")
            browser = None
            try:
                controller.start()  # while the console starts
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
                wait_for(lambda: _alive(console, console_log) and healthz(port), "the console to serve", timeout_s=30)
                wait_for(lambda: all((device(corral_api, namespace, d).get("status") or {}).get("inSync") for d in FLEET),
                         "both locks registered and in sync", timeout_s=30)
                # As the demo names its household's devices (a merge patch, only where there is no alias yet).
                assert name_devices(corral_api, namespace, {"front-lock": {"alias": "Front door", "location": "Hallway"}},
                                    "corral-demo") == 1
                _overlay(corral_api, namespace, "back-lock", HOSTILE_ALIAS, HOSTILE_LOCATION)
                yield Home(plane, namespace, corral_api, agent, approver_token,
                           person_user(namespace, "approver"), viewer_token, alice_token, f"http://127.0.0.1:{port}",
                           console_log, browser)
            finally:
                if browser is not None:
                    browser.close()
                console.terminate()
                console.wait(10)
                if controller.proc is not None:
                    controller.stop()
                for who in ("approver", "viewer"):
                    # The people namespace itself stays: it is shared.
                    core.delete_namespaced_service_account(person_name(namespace, who), PEOPLE_NAMESPACE)
                core.delete_namespaced_service_account("alice", PEOPLE_NAMESPACE)
                rbac = kubernetes.client.RbacAuthorizationV1Api(corral_api)
                rbac.delete_cluster_role_binding(contracts)
                rbac.delete_cluster_role(contracts)


def test_an_approver_sees_the_request_in_context_approves_it_and_sees_it_executed(home: Home) -> None:
    name = home.ask("front-lock")
    context = home.context()
    page = context.new_page()
    try:
        home.sign_in(page, home.approver_token)
        cookie = next(c for c in context.cookies() if c["name"] == "corral-session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

        # The card leads with what the device is (name and type, as enrolled); what someone called it comes
        # second and says so (an agent may set an alias: a lock once headlined as "kitchen-light").
        card = page.locator("article.card", has=page.get_by_role("link", name="front-lock (lock)"))
        expect(card.get_by_role("heading")).to_have_text("front-lock (lock)")
        expect(card.locator("[data-f=named]")).to_have_text(
            "called “Front door” and said to be in “Hallway” by a person or agent")
        assert card.get_by_role("link", name="Front door").count() == 0
        expect(card.locator("[data-f=change]")).to_have_text("locked = true")
        expect(card.locator("[data-f=current]")).to_have_text("locked = false")
        expect(card.locator("[data-f=risk]")).to_have_text("high")
        expect(card.locator("[data-f=requester]")).to_have_text(f"agent in {home.namespace}")
        expect(card.locator("[data-f=reason]")).to_have_text("Everyone left the house")
        expect(card.locator("[data-f=left]")).to_have_text(re.compile(r"^\d+ (min \d\d )?s$"))

        card.get_by_role("button", name="Approve").click()  # a lock is high risk: it asks first
        card.get_by_role("button", name="Yes, approve").click()
        expect(page).to_have_url(f"{home.url}/intents/{home.namespace}/{name}")
        outcome = page.locator("#detail .outcome")
        expect(outcome.locator("[data-f=outcome_words]")).to_have_text("Done: Bolt → bolt thrown (locked).",
                                                                      timeout=20_000)
        expect(outcome.locator("[data-f=outcome]")).to_have_text("EXECUTED")  # the code, beside the words
        # ... and the agent, waiting with its own credentials, sees its request done.
        assert (wait_settled(home.agent, home.namespace, name, timeout_s=5).get("status") or {})["code"] == "EXECUTED"
        [approval] = home.approvals(name)
        assert approval["spec"]["approver"] == home.approver and approval["spec"]["decision"] == "Approve"
        assert set(approval["spec"]["approverGroups"]) == {
            "system:serviceaccounts", f"system:serviceaccounts:{PEOPLE_NAMESPACE}", "system:authenticated"}

        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("button", name="Sign in")).to_be_visible()
        assert _post(home, "/api/intents", None, {"Cookie": f"corral-session={cookie['value']}"}, "GET")[0] == 401
    finally:
        context.close()


def test_alice_reads_the_lock_in_its_contracts_words_and_her_approval_waits_for_a_second_click(home: Home) -> None:
    """The card of an unlock speaks a person's language: the contract's own words for the bolt and what unlocking
    does (marked as the device's), the agent named as an agent, alice as alice; and a high-risk approval is not sent
    on the first click."""
    name = home.ask("front-lock", value=False, reason="the plumber is at the door")
    context = home.context()
    page = context.new_page()
    decisions: list[str] = []
    missing: list[str] = []
    page.on("request", lambda r: decisions.append(r.url) if r.method == "POST" and r.url.endswith("/decision") else None)
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    try:
        home.sign_in(page, home.alice_token, name="alice")
        expect(page.locator("#username")).to_have_attribute("title", f"system:serviceaccount:{PEOPLE_NAMESPACE}:alice")
        card = page.locator("article.card", has=page.get_by_text("the plumber is at the door"))
        expect(card.get_by_role("heading")).to_have_text("front-lock (lock)")
        expect(card.locator("[data-f=named]")).to_have_text(
            "called “Front door” and said to be in “Hallway” by a person or agent")
        # The contract's own words, beside the exact change; and what the device is now, in the same words.
        expect(card.locator("[data-f=change_words]")).to_have_text("Bolt → unlocked")
        expect(card.locator("[data-f=change]")).to_have_text("locked = false")
        expect(card.locator("[data-f=contract_says]")).to_have_text(
            "true = bolt thrown (locked), false = unlocked. Unlocking lets anyone in.")
        expect(card.locator("[data-f=contract_whose]")).to_have_text(
            "the device's words (its “Door lock” contract), not Corral's")
        locked_now = device(home.admin, home.namespace, "front-lock")["status"]["reported"]["locked"]  # the order of tests
        expect(card.locator("[data-f=current_words]")).to_have_text(
            "Bolt → bolt thrown (locked)" if locked_now else "Bolt → unlocked")
        expect(card.locator("[data-f=requester]")).to_have_text(f"agent in {home.namespace}")
        expect(card.locator("[data-f=requester_kind]")).to_have_text("an agent, not a person")
        # A name is read whole at phone width: no word of it broken across lines (a hyphen is no place to break).
        expect(card.locator("[data-f=requester]")).to_have_attribute("title", f"system:serviceaccount:{home.namespace}:agent")
        assert card.locator("[data-f=requester]").evaluate(WHOLE_WORDS)
        page.screenshot(path=str(_screenshot_path(home)))

        card.get_by_role("button", name="Approve").click()
        expect(card.locator("[data-f=confirm]")).to_have_text(
            "Really set Bolt to “unlocked” on front-lock (lock)? This is high risk.")
        assert decisions == [] and home.approvals(name) == []  # the first click only asked
        card.get_by_role("button", name="No, go back").click()
        expect(card.get_by_role("button", name="Approve")).to_be_visible()
        assert decisions == [] and home.approvals(name) == []
        # Positive control: the second click sends alice's approval, and the lock opens.
        card.get_by_role("button", name="Approve").click()
        card.get_by_role("button", name="Yes, approve").click()
        expect(page.locator("#detail .outcome [data-f=outcome_words]")).to_have_text("Done: Bolt → unlocked.",
                                                                                     timeout=20_000)
        assert len(decisions) == 1
        [approval] = home.approvals(name)
        assert approval["spec"]["approver"] == f"system:serviceaccount:{PEOPLE_NAMESPACE}:alice"
        assert missing == []  # the favicon too
    finally:
        context.close()


def test_the_demo_names_a_device_once_and_leaves_a_persons_rename_alone(home: Home) -> None:
    assert name_devices(home.admin, home.namespace, {"front-lock": {"alias": "Back door", "location": "Garden"}},
                        "corral-demo") == 0
    assert device(home.admin, home.namespace, "front-lock")["spec"]["overlay"] == {
        "alias": "Front door", "location": "Hallway"}


def test_a_link_to_one_intent_signs_in_first_then_a_denial_ends_it_denied_by_approver(home: Home) -> None:
    name = home.ask("back-lock")
    context = home.context()
    page = context.new_page()
    try:
        page.goto(f"{home.url}/intents/{home.namespace}/{name}")
        page.get_by_label("Token").fill("not-a-token-of-this-cluster")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#signin-error")).to_contain_text("did not accept this token")

        page.get_by_label("Token").fill(home.approver_token)
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(f"{home.url}/intents/{home.namespace}/{name}")
        card = page.locator("#detail article.card")
        expect(card.locator("[data-f=change]")).to_have_text("locked = true")
        card.get_by_label("Reason").fill("not while the kids are out")
        card.get_by_role("button", name="Deny").click()  # a denial sends at once: nothing happens to the lock
        expect(card.locator("[data-f=outcome_words]")).to_have_text(
            f"Denied by {person_name(home.namespace, 'approver')}: not while the kids are out.", timeout=20_000)
        expect(card.locator("[data-f=outcome]")).to_have_text("DENIED_BY_APPROVER")
        expect(card.locator("[data-f=message]")).to_contain_text("not while the kids are out")
        assert home.intent(name)["status"]["code"] == "DENIED_BY_APPROVER"
    finally:
        context.close()


def test_a_person_who_may_list_intents_but_not_approve_sees_nothing_to_approve(home: Home) -> None:
    name = home.ask("front-lock", value=False, reason="unlock for the plumber")
    context = home.context()
    page = context.new_page()
    try:
        home.sign_in(page, home.viewer_token, name=person_name(home.namespace, "viewer"))
        expect(page.get_by_text("Nothing is waiting for your approval.")).to_be_visible()
        expect(page.locator("article.card")).to_have_count(0)
        # Its own page shows the request, but no buttons: the API server would refuse the Approval anyway.
        page.goto(f"{home.url}/intents/{home.namespace}/{name}")
        expect(page.get_by_text("You may not approve actions on this device.")).to_be_visible()
        # Nor read Capabilities here: the change in its exact form only, no contract words to show.
        expect(page.locator("#detail [data-f=change]")).to_have_text("locked = false")
        expect(page.locator("#detail [data-f=change_words]")).to_be_hidden()
        expect(page.locator("#detail [data-f=contract_says]")).to_be_hidden()
        expect(page.get_by_role("button", name="Approve")).to_be_hidden()
        status, answer = _post(home, f"/api/intents/{home.namespace}/{name}/decision",
                               {"decision": "Approve", "csrf": _csrf(page)}, _cookie_header(context))
        assert status == 403 and "The API server refused (403)" in answer, answer
        assert home.approvals(name) == []
    finally:
        context.close()
    # ... while the approver does see it.
    context = home.context()
    page = context.new_page()
    try:
        home.sign_in(page, home.approver_token)
        expect(page.locator("article.card", has=page.get_by_text("unlock for the plumber"))).to_be_visible()
    finally:
        context.close()


def test_a_post_from_another_origin_is_refused_even_with_the_stolen_cookie_and_csrf_token(home: Home) -> None:
    name = home.ask("front-lock", value=False, reason="let the courier in")
    uid = home.intent(name)["metadata"]["uid"]
    context = home.context()
    page = context.new_page()
    try:
        home.sign_in(page, home.approver_token)
        csrf, cookies = _csrf(page), _cookie_header(context)
        action = f"{home.url}/api/intents/{home.namespace}/{name}/decision"
        # A page of another origin: the same site (127.0.0.1, another port), so the browser does send the
        # SameSite=Strict session cookie with its form; only the origin check stands in the way.
        attack = (f'<!doctype html><form method="post" action="{action}">'
                  f'<input name="decision" value="Approve"><input name="uid" value="{uid}">'
                  f'<input name="csrf" value="{csrf}"><button>Win a prize</button></form>')
        with _serving(attack) as evil:
            page.goto(evil)
            with page.expect_response(lambda r: r.url == action) as answer:
                page.get_by_role("button", name="Win a prize").click()
            assert answer.value.status == 403
            expect(page.locator("body")).to_contain_text("Refused: this request")
            expect(page.locator("body")).to_contain_text("Approve and deny only on the approval page itself.")

        # Outside a browser, with everything stolen, from another origin: refused too.
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
            status, text = _post(home, f"/api/intents/{home.namespace}/{name}/decision",
                                 {"decision": "Approve", "uid": uid, "csrf": csrf}, {**cookies, **headers})
            assert status == 403 and text.startswith("Refused:"), text
        # From the page's own origin, without its CSRF token: refused.
        status, text = _post(home, f"/api/intents/{home.namespace}/{name}/decision",
                             {"decision": "Approve", "uid": uid}, {**cookies, "Origin": home.url})
        assert status == 403 and "CSRF" in text, text
        assert home.approvals(name) == []
        assert home.intent(name)["status"]["phase"] == "AwaitingApproval"
    finally:
        context.close()


def test_a_new_request_appears_without_a_reload_and_what_devices_and_agents_wrote_stays_text(home: Home) -> None:
    context = home.context()
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    try:
        home.sign_in(page, home.approver_token)
        expect(page.locator("#updated")).to_contain_text("Updated")
        page.evaluate("() => { window.sameDocument = true; }")  # gone if the page were loaded again
        home.ask("back-lock", reason=HOSTILE_REASON)
        card = page.locator("article.card", has=page.get_by_text(HOSTILE_REASON))
        expect(card.locator("[data-f=named]")).to_contain_text(HOSTILE_ALIAS)
        expect(card.locator("[data-f=named]")).to_contain_text(HOSTILE_LOCATION)
        expect(card.locator("[data-f=reason]")).to_have_text(HOSTILE_REASON)
        assert card.locator("img, script").count() == 0
        assert page.evaluate("() => window.xss") is None
        assert page.evaluate("() => window.sameDocument") is True
        assert dialogs == []
    finally:
        context.close()


def test_a_holds_then_is_on_the_card_and_its_page_and_in_the_question_before_approving(home: Home) -> None:
    """Issue 41, finding 2: an agent's `locked=true, holdFor: 8s, then: false` once showed only "locked = true";
    what the hold puts back is approved with it, so the card, the Intent's page and the high-risk question name it."""
    name = f"lock-{uuid.uuid4().hex[:8]}"
    spec = {"device": "front-lock", "actuator": "locked", "action": "set_state", "params": {"value": True},
            "reason": "lock for a moment, then open", "requester": f"system:serviceaccount:{home.namespace}:agent",
            "holdFor": "8s", "then": {"value": False}}
    assert submit(home.agent, home.namespace, name, spec).code == "CREATED"
    assert (wait_settled(home.agent, home.namespace, name, timeout_s=20).get("status") or {}).get("phase") == \
        "AwaitingApproval"
    plain = home.ask("front-lock", reason="lock it, no hold")  # positive control: no hold, no Then row
    context = home.context()
    page = context.new_page()
    decisions: list[str] = []
    page.on("request", lambda r: decisions.append(r.url) if r.method == "POST" and r.url.endswith("/decision") else None)
    try:
        home.sign_in(page, home.approver_token)
        card = page.locator("article.card", has=page.get_by_text("lock for a moment, then open"))
        expect(card.locator("[data-f=change]")).to_have_text("locked = true")
        expect(card.locator("[data-f=hold]")).to_have_text("locked = false after 8 s")
        expect(card.locator("[data-f=then_words]")).to_have_text("Bolt → unlocked")
        expect(card.locator("[data-f=hold]")).to_be_visible()
        without = page.locator("article.card", has=page.get_by_text("lock it, no hold"))
        expect(without.locator("[data-f=change]")).to_have_text("locked = true")
        expect(without.locator("[data-f=hold]")).to_be_hidden()
        card.get_by_role("button", name="Approve").click()
        expect(card.locator("[data-f=confirm]")).to_have_text(
            "Really set Bolt to “bolt thrown (locked)”, then to “unlocked” after 8 s, on front-lock (lock)? "
            "This is high risk.")
        card.get_by_role("button", name="No, go back").click()
        assert decisions == [] and home.approvals(name) == []

        page.goto(f"{home.url}/intents/{home.namespace}/{name}")  # the Intent's own page says the same
        detail = page.locator("#detail article.card")
        expect(detail.locator("[data-f=hold]")).to_have_text("locked = false after 8 s")
        expect(detail.locator("[data-f=then_words]")).to_have_text("Bolt → unlocked")
        detail.get_by_role("button", name="Deny").click()  # nothing happens to the lock
        expect(detail.locator("[data-f=outcome]")).to_have_text("DENIED_BY_APPROVER", timeout=20_000)
    finally:
        context.close()
    assert home.intent(plain)["status"]["phase"] == "AwaitingApproval"


def test_every_answer_carries_the_strict_headers(home: Home) -> None:
    for path in ("/", "/static/app.js", "/api/session", f"/intents/{home.namespace}/x", "/missing", "/api/intents",
                 "/favicon.ico"):
        request = urllib.request.Request(home.url + path)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                headers = response.headers
                if path == "/favicon.ico":  # it was a 404 in every browser's first request
                    assert response.status == 200 and response.read(4) == b"\x00\x00\x01\x00"
        except urllib.error.HTTPError as err:
            assert path != "/favicon.ico", err
            headers = err.headers
        assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY, path
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer", path


def test_while_agents_are_paused_the_page_says_so_above_everything_and_not_after_they_resume(home: Home) -> None:
    # The approver role reads the switch; this module's approver has only the rights grant() gave it, so add that.
    reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "switch-reader"},
              "rules": [{"apiGroups": [GROUP], "resources": ["agentpauses"], "verbs": ["get", "list"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "switch-reader"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "switch-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": person_name(home.namespace, "approver"),
                             "namespace": PEOPLE_NAMESPACE}]}
    rbac = kubernetes.client.RbacAuthorizationV1Api(home.admin)
    rbac.create_namespaced_role(home.namespace, reader)
    rbac.create_namespaced_role_binding(home.namespace, binding)
    # alice pauses agents (as herself: the admission policy wants `by` to be the writer).
    alice = kubernetes.client.CustomObjectsApi(api_client(home.plane, impersonate="alice", group="system:masters"))
    alice.create_namespaced_custom_object(GROUP, VERSION, home.namespace, "agentpauses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentPause", "metadata": {"name": "agents"},
        "spec": {"paused": True, "reason": "water in the basement", "by": "alice", "since": "2026-12-01T22:00:00Z"}})
    context = home.context()
    page = context.new_page()
    try:
        home.sign_in(page, home.approver_token)
        banner = page.locator("#paused")
        expect(banner).to_contain_text(f"Agents are paused in namespace {home.namespace} since 2026-12-01 22:00:00 "
                                       "UTC by alice: water in the basement.", timeout=10_000)
        expect(banner).to_contain_text("Your own requests still run.")
        alice.delete_namespaced_custom_object(GROUP, VERSION, home.namespace, "agentpauses", "agents")
        expect(banner).to_be_hidden(timeout=10_000)
    finally:
        context.close()
        with contextlib.suppress(kubernetes.client.ApiException):  # deleted above unless the test failed first
            alice.delete_namespaced_custom_object(GROUP, VERSION, home.namespace, "agentpauses", "agents")
        rbac.delete_namespaced_role_binding("switch-reader", home.namespace)
        rbac.delete_namespaced_role("switch-reader", home.namespace)


# Helpers ---------------------------------------------------------------------------------------------------


def _screenshot_path(home: Home) -> Path:
    """docs/console-phone.png when it is missing or CORRAL_UPDATE_SCREENSHOTS is set (so that a test run does
    not rewrite a committed file every time), else a file next to the console's log."""
    if os.environ.get("CORRAL_UPDATE_SCREENSHOTS") or not SCREENSHOT.exists():
        return SCREENSHOT
    return home.console_log.with_name("console-phone.png")


def _csrf(page: Page) -> str:
    """The CSRF token the page's own script gets (what a thief with script access to the page would steal)."""
    return str(page.evaluate("async () => (await (await fetch('/api/session')).json()).csrf"))


def _cookie_header(context: BrowserContext) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{c['name']}={c['value']}" for c in context.cookies())}


def _post(home: Home, path: str, form: dict[str, str] | None, headers: dict[str, str],
          method: str = "POST") -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    request = urllib.request.Request(home.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class _Page(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # the name http.server calls
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


class _serving:  # a context manager, named like one made with @contextmanager
    """Serve one HTML page from another origin (127.0.0.1, another port) until the block ends."""

    def __init__(self, html: str) -> None:
        handler = type("AttackPage", (_Page,), {"body": html.encode()})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

