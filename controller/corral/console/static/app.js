// The approval page's script. Everything that came from the cluster (device aliases, agents' reasons, ...)
// is put on the page with textContent only, never as HTML.
"use strict";

(() => {
  const POLL_MS = 2000;
  const SOON_MS = 500;
  const FINAL = new Set(["Succeeded", "Denied", "Failed", "DryRun"]);
  const $ = (id) => document.getElementById(id);
  let csrf = "";
  let timer = null;
  let generation = 0; // bumped on every view change: a late answer of an old view is dropped
  const cards = new Map(); // key -> card element, kept across polls (a half-typed reason survives)
  const sent = new Set(); // Intents (namespace/name/uid) this page has decided on

  function route() {
    const m = location.pathname.match(/^\/intents\/([^/]+)\/([^/]+)\/?$/);
    return m ? { namespace: decodeURIComponent(m[1]), name: decodeURIComponent(m[2]) } : null;
  }

  async function call(method, path, body) {
    const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.headers["X-CSRF-Token"] = csrf;
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      return { ok: false, status: 0, data: { error: "The console cannot be reached (offline?). Retrying…" } };
    }
    let data;
    try {
      data = await response.json();
    } catch (err) {
      data = { error: `${response.status} ${response.statusText}` };
    }
    return { ok: response.ok, status: response.status, data };
  }

  function show(id) {
    for (const section of ["loading", "signin", "list", "detail"]) $(section).hidden = section !== id;
  }

  function notice(text) {
    $("notice").textContent = text || "";
    $("notice").hidden = !text;
  }

  // Where agents are paused (the kill switch): a banner above everything, as text.
  function paused(notices) {
    const list = $("paused");
    list.replaceChildren(...(notices || []).map((n) => {
      const li = document.createElement("li");
      li.textContent = n.message;
      return li;
    }));
    list.hidden = list.children.length === 0;
  }

  function stop() {
    generation += 1;
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  function later(fn, ms = POLL_MS) {
    const mine = generation;
    timer = setTimeout(() => { if (mine === generation) fn(); }, ms);
  }

  // Sign-in ---------------------------------------------------------------------------------------------

  async function start() {
    const session = await call("GET", "/api/session");
    if (!session.ok) {
      notice(session.data.error || "The console did not answer.");
      setTimeout(start, POLL_MS);
      return;
    }
    if (session.data.signedIn) signedIn(session.data);
    else signIn(session.data.csrf);
  }

  function signIn(token) {
    stop();
    csrf = token || "";
    $("who").hidden = true;
    $("signin-form").elements.namedItem("csrf").value = csrf;
    show("signin");
    $("token").focus();
  }

  async function expired(message) {
    stop();
    cards.clear();
    $("items").replaceChildren();
    paused([]);
    const session = await call("GET", "/api/session");
    signIn(session.ok ? session.data.csrf : "");
    notice(message || "Your session ended: sign in again.");
  }

  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.currentTarget;
    const button = form.querySelector("button");
    button.disabled = true;
    $("signin-error").textContent = "";
    const answer = await call("POST", "/api/session", { token: $("token").value });
    button.disabled = false;
    if (!answer.ok) {
      $("signin-error").textContent = answer.data.error || "Sign-in failed.";
      return;
    }
    $("token").value = "";
    notice("");
    signedIn(answer.data);
  });

  $("signout").addEventListener("click", async () => {
    await call("POST", "/api/signout", {});
    await expired("You signed out. The console forgot your token.");
  });

  function signedIn(session) {
    csrf = session.csrf;
    // The person's name ("alice"), the exact username a tap or hover away.
    $("username").textContent = session.name || session.username;
    $("username").title = session.username;
    $("who").hidden = false;
    render();
  }

  function render() {
    stop();
    notice("");
    const target = route();
    if (target) {
      $("detail-card").replaceChildren();
      show("detail");
      pollIntent(target);
    } else {
      show("list");
      pollList();
    }
  }

  // Moving between the list and an Intent's page keeps this page (and what it has sent) alive.
  function go(path) {
    history.pushState(null, "", path);
    render();
  }

  window.addEventListener("popstate", () => {
    if (!$("who").hidden) render();
  });

  document.addEventListener("click", (event) => {
    const link = event.target.closest("a[href^='/']");
    if (!link || $("who").hidden || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    event.preventDefault();
    go(link.getAttribute("href"));
  });

  // Rendering -------------------------------------------------------------------------------------------

  function field(card, name) {
    return card.querySelector(`[data-f="${name}"]`);
  }

  function set(card, name, text) {
    field(card, name).textContent = text == null ? "" : String(text);
  }

  function left(seconds) {
    if (seconds == null) return "—";
    if (seconds <= 0) return "expired";
    const s = Math.floor(seconds);
    const m = Math.floor(s / 60);
    return m > 0 ? `${m} min ${String(s % 60).padStart(2, "0")} s` : `${s} s`;
  }

  function keyOf(item) {
    return `${item.namespace}/${item.name}/${item.uid}`;
  }

  // A high- or critical-risk approval asks first (item.confirm is the question): the first Approve sends nothing.
  function confirming(card, on) {
    field(card, "confirm_box").hidden = !on;
    field(card, "buttons").hidden = on;
    if (on) field(card, "no").focus();
  }

  function newCard(item) {
    const card = $("card-template").content.firstElementChild.cloneNode(true);
    const form = card.querySelector("form.decide");
    const reason = () => form.elements.namedItem("reason").value;
    card.item = item;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const decision = event.submitter ? event.submitter.value : "Approve";
      if (decision === "Approve" && card.item.confirm) {
        confirming(card, true);
        return;
      }
      decide(card, card.item, decision, reason());
    });
    field(card, "yes").addEventListener("click", () => {
      confirming(card, false);
      decide(card, card.item, "Approve", reason());
    });
    field(card, "no").addEventListener("click", () => confirming(card, false));
    return card;
  }

  // An identity's name, each word in a span of its own that never breaks (style.css: .identity .word).
  function named(element, text, title) {
    const parts = [];
    String(text || "").split(" ").filter(Boolean).forEach((word, index) => {
      if (index > 0) parts.push(" ");
      const span = document.createElement("span");
      span.className = "word";
      span.textContent = word;
      parts.push(span);
    });
    element.replaceChildren(...parts);
    element.title = title || "";
  }

  const KINDS = { agent: "an agent, not a person", system: "a Kubernetes system identity" };

  function fill(card, item) {
    card.item = item;
    card.dataset.risk = item.risk;
    set(card, "risk", item.risk);
    // The card leads with what the device is (its name and type, as enrolled); what a person or an agent called
    // it (alias, location) comes second and says who said so: an agent can name a lock "kitchen-light".
    const link = field(card, "link");
    link.textContent = item.title || item.device;
    link.href = `/intents/${encodeURIComponent(item.namespace)}/${encodeURIComponent(item.name)}`;
    set(card, "named", item.named);
    field(card, "named").hidden = !item.named;
    set(card, "namespace", `namespace ${item.namespace}`);
    // The change in the contract's words (the device's, marked so), its exact form beside it.
    set(card, "change_words", item.change_words);
    field(card, "change_words").hidden = !item.change_words;
    field(card, "change_words").title = "in the words of the device's contract";
    set(card, "change", item.change);
    // A timed hold is part of what is approved: what is put back after it, in the same words.
    set(card, "then_words", item.then_words);
    field(card, "then_words").hidden = !item.then_words;
    field(card, "then_words").title = "in the words of the device's contract";
    set(card, "hold", item.hold);
    field(card, "hold_row").hidden = !item.hold;
    set(card, "contract_says", item.contract_says);
    set(card, "contract_whose", item.device_kind
      ? `the device's words (its “${item.device_kind}” contract), not Corral's`
      : "the device's words (its contract), not Corral's");
    field(card, "contract_row").hidden = !item.contract_says;
    set(card, "current_words", item.current_words);
    field(card, "current_words").hidden = !item.current_words;
    set(card, "current", item.current == null ? "unknown" : item.current);
    set(card, "current_note", item.current_note ? `(${item.current_note})` : "");
    named(field(card, "requester"), item.requester_name || item.requester, item.requester);
    set(card, "requester_kind", KINDS[item.requester_kind] || "");
    set(card, "confirm", item.confirm);
    set(card, "reason", item.reason);
    const readings = field(card, "readings");
    readings.replaceChildren(...item.based_on.map((r) => {
      const li = document.createElement("li");
      li.textContent = `${r.metric} at ${r.at || "?"} (ts ${r.ts}${r.device !== item.device ? `, ${r.device}` : ""})`;
      return li;
    }));
    if (item.based_on.length === 0) {
      const li = document.createElement("li");
      li.textContent = "none cited";
      readings.append(li);
    }
    set(card, "left", item.waiting ? left(item.seconds_left) : "—");
    const decided = sent.has(keyOf(item));
    card.querySelector("form.decide").hidden = !item.may_approve || decided;
    card.querySelector(".sent").hidden = !(item.waiting && decided);
    card.querySelector(".cannot").hidden = !(item.waiting && !item.may_approve);
    const outcome = card.querySelector(".outcome");
    outcome.hidden = item.waiting;
    set(card, "outcome_words", item.outcome_words);
    field(card, "outcome_words").title = item.outcome;
    set(card, "outcome", item.outcome);
    set(card, "message", item.message);
    outcome.dataset.outcome = item.outcome;
  }

  async function decide(card, item, decision, reason) {
    const form = card.querySelector("form.decide");
    const error = form.querySelector(".error");
    for (const button of form.querySelectorAll("button")) button.disabled = true;
    error.textContent = "";
    const path = `/api/intents/${encodeURIComponent(item.namespace)}/${encodeURIComponent(item.name)}/decision`;
    const answer = await call("POST", path, { decision, reason, uid: item.uid });
    for (const button of form.querySelectorAll("button")) button.disabled = false;
    if (answer.status === 401) return expired(answer.data.error);
    if (!answer.ok) {
      error.textContent = answer.data.error || `The console answered ${answer.status}.`;
      return;
    }
    sent.add(keyOf(item));
    const target = route();
    if (target && target.namespace === item.namespace && target.name === item.name) {
      fill(card, item);
      stop();
      pollIntent(target);
    } else {
      go(field(card, "link").getAttribute("href")); // follow it to its outcome
    }
  }

  // Polling ---------------------------------------------------------------------------------------------

  async function pollList() {
    const mine = generation;
    const answer = await call("GET", "/api/intents");
    if (mine !== generation) return;
    if (answer.status === 401) return expired(answer.data.error);
    if (!answer.ok) {
      notice(answer.data.error);
      return later(pollList);
    }
    notice("");
    paused(answer.data.paused);
    const problems = $("problems");
    problems.replaceChildren(...answer.data.problems.map((p) => {
      const li = document.createElement("li");
      li.textContent = p;
      return li;
    }));
    const seen = new Set();
    const items = $("items");
    answer.data.items.forEach((item, index) => {
      const key = keyOf(item);
      seen.add(key);
      let card = cards.get(key);
      if (!card) {
        card = newCard(item);
        cards.set(key, card);
      }
      fill(card, item);
      if (items.children[index] !== card) items.insertBefore(card, items.children[index] || null);
    });
    for (const [key, card] of cards) {
      if (!seen.has(key)) {
        card.remove();
        cards.delete(key);
      }
    }
    $("empty").hidden = answer.data.items.length > 0;
    $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}; updates every ${POLL_MS / 1000} s.`;
    later(pollList);
  }

  async function pollIntent(target) {
    const mine = generation;
    const path = `/api/intents/${encodeURIComponent(target.namespace)}/${encodeURIComponent(target.name)}`;
    const answer = await call("GET", path);
    if (mine !== generation) return;
    if (answer.status === 401) return expired(answer.data.error);
    const holder = $("detail-card");
    if (!answer.ok) {
      notice(answer.data.error);
      if (answer.status !== 404 && answer.status !== 403) later(() => pollIntent(target));
      return;
    }
    notice("");
    paused(answer.data.paused);
    const item = answer.data.intent;
    let card = holder.firstElementChild;
    if (!card || card.dataset.key !== keyOf(item)) {
      card = newCard(item);
      card.dataset.key = keyOf(item);
      card.classList.add("single");
      holder.replaceChildren(card);
    }
    fill(card, item);
    // Just decided here: look again soon, the outcome follows within a second or so.
    if (!FINAL.has(item.phase)) later(() => pollIntent(target), sent.has(keyOf(item)) ? SOON_MS : POLL_MS);
  }

  start();
})();
