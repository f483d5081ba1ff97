"""The operator console in a real browser (Debian's Chromium, headless,
driven by Playwright) against a live ``parlance serve``.

``cargo xtask browser-test`` (and ``cargo xtask ci``) runs it with:

- ``PARLANCE_URL``: the service's base URL;
- ``PARLANCE_API_KEY``: a key for product ``PARLANCE_PRODUCT``;
- ``PARLANCE_SECOND_KEY`` (optional): a key for another product, which must
  not see the first product's conversations nor, on the read-only pages,
  its sessions, users, flow sessions and agent threads;
- ``PARLANCE_SCREENSHOTS``: the directory the page screenshots go to;
- ``PARLANCE_CHECKS_FILE``: where the number of checks passed is written.

The conversation is driven through the HTTP API only, as any client does;
with the embedded default's offline model, a contact's message that asks for
a person hands the conversation to one.
"""

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

URL = os.environ["PARLANCE_URL"].rstrip("/")
KEY = os.environ["PARLANCE_API_KEY"]
PRODUCT = os.environ.get("PARLANCE_PRODUCT", "default")
SECOND_KEY = os.environ.get("PARLANCE_SECOND_KEY") or None
SHOTS = Path(os.environ["PARLANCE_SCREENSHOTS"])
CHECKS_FILE = os.environ.get("PARLANCE_CHECKS_FILE")
CHROMIUM = os.environ.get("PARLANCE_CHROMIUM", "/usr/bin/chromium")
TIMEOUT_MS = 15_000

checks = 0


def check(what, condition=True):
    """Counts one check; a false condition fails the run with its name."""
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1
    print(f"ok {checks}: {what}", flush=True)


def api(method, path, body=None, key=KEY):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{URL}{path}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, json.loads(res.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def conversation(cid):
    status, view = api("GET", f"/v1/products/{PRODUCT}/conversations/{cid}")
    assert status == 200, (status, view)
    return view["conversation"]


def wait_state(cid, states, seconds=20):
    """Waits until the agent's queued work has brought the conversation to
    one of ``states`` and returns that state."""
    deadline = time.monotonic() + seconds
    while True:
        state = conversation(cid)["state"]
        if state in states:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"conversation {cid} stayed {state}, wanted one of {states}")
        time.sleep(0.2)


def shot(page, name):
    path = SHOTS / f"{len(list(SHOTS.glob('*.png'))) + 1:02}-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}", flush=True)


def sign_in(page, key):
    page.goto(f"{URL}/console")
    expect(page.get_by_test_id("sign-in")).to_be_visible()
    page.get_by_test_id("key").fill(key)
    page.get_by_test_id("sign-in-submit").click()


def ok(status_body, what):
    status, body = status_body
    assert 200 <= status < 300, (what, status, body)
    return body


def reply(cid, text):
    ok(api("POST", f"/v1/products/{PRODUCT}/conversations/{cid}/replies", {"text": text}), "reply")


def create(contact, objective):
    body = ok(
        api("POST", f"/v1/products/{PRODUCT}/conversations", {"contact_id": contact, "objective": objective}),
        "create",
    )
    return body["conversation"]["instance_id"]


SECTIONS = ("sign-in", "inbox", "conversation", "entity", "flows")


def only_sign_in(page, what):
    """The sign-in page is shown and no page that holds data."""
    expect(page.get_by_test_id("sign-in")).to_be_visible()
    hidden = all(page.get_by_test_id(s).is_hidden() for s in SECTIONS if s != "sign-in")
    check(f"{what}: the sign-in page and nothing else", hidden and page.get_by_test_id("nav").is_hidden())


def entities(tag):
    """One record of each read-only page's kind, made through the API: the
    console URL of each, the state the API gives it, and the rows its audit
    trail and its own history have at least (None: the page has none)."""
    p = f"/v1/products/{PRODUCT}"
    session_id = f"ses-{tag}"
    ok(api("POST", f"{p}/sessions/{session_id}/events", {"type": "proactive_trigger", "trigger_id": "t-1"}), "session")
    session_state = ok(api("GET", f"{p}/sessions/{session_id}"), "session")["snapshot"]["current_state"]
    user = f"user-{tag}"
    events = {
        "events": [
            {"kind": "set_mastery", "rating": 7, "level": "proficient", "description": "console"},
            {"kind": "set_journey_state", "state": "onboarded"},
        ]
    }
    ok(api("POST", f"{p}/users/{user}/adoption/events", events), "adoption")
    journey = ok(api("GET", f"{p}/users/{user}/adoption"), "adoption")["state"]["journey_state"]
    flow = ok(api("POST", "/v1/ai/qa/start_session"), "flow")["session_id"]
    model = ok(api("GET", f"/v1/ai/qa/model/{flow}"), "flow")
    flow_state = json.loads(model["response"])["state_name"]
    owner, thread = f"owner-{tag}", f"thread-{tag}"
    ok(api("POST", f"{p}/agent/turns", {"message": "hello", "user_id": owner, "session_id": thread}), "turn")
    ok(api("GET", f"{p}/agent/threads/{thread}?user_id={owner}"), "thread")
    return [
        # name, address, state, least rows of the audit trail, of the history
        ("session", f"/console/sessions/{session_id}", session_state, 1, None),
        ("adoption", f"/console/adoption/{user}", journey, 1, 0),
        ("flow-session", f"/console/flow-sessions/qa/{flow}", flow_state, 1, 1),
        ("agent-thread", f"/console/threads/{thread}?owner={owner}", None, None, 1),
    ]


def main():
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    contact = f"console-{uuid.uuid4().hex[:12]}"

    with sync_playwright() as pw:
        pw.selectors.set_test_id_attribute("data-test")
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 900})
            context.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page = context.new_page()

            # 1. The sign-in page; a wrong key shows the error and no data.
            page.goto(f"{URL}/console")
            expect(page.get_by_test_id("sign-in")).to_be_visible()
            check("/console shows the sign-in page")
            check("no inbox before signing in", page.get_by_test_id("inbox").is_hidden())
            shot(page, "sign-in")
            page.get_by_test_id("key").fill("pk_wrong_" + uuid.uuid4().hex)
            page.get_by_test_id("sign-in-submit").click()
            expect(page.get_by_test_id("sign-in-error")).to_have_text("Wrong key")
            check("a wrong key shows 'Wrong key'")
            check("a wrong key shows no inbox", page.get_by_test_id("inbox").is_hidden())
            check("a wrong key keeps no product", page.get_by_test_id("product").inner_text() == "")
            check(
                "a wrong key is not kept",
                page.evaluate("sessionStorage.length") == 0,
            )
            shot(page, "wrong-key")

            # 2. Signing in with the key.
            page.get_by_test_id("key").fill(KEY)
            page.get_by_test_id("sign-in-submit").click()
            expect(page.get_by_test_id("inbox")).to_be_visible()
            check("the key opens the inbox")
            expect(page.get_by_test_id("product")).to_have_text(f"product {PRODUCT}")
            check(f"the bar names product {PRODUCT}")

            # 3. A conversation made through the API; the agent's first turn
            # sends a message and waits for the contact.
            status, created = api(
                "POST",
                f"/v1/products/{PRODUCT}/conversations",
                {"contact_id": contact, "objective": "Confirm the delivery window"},
            )
            check("POST .../conversations answers 201", status == 201)
            cid = created["conversation"]["instance_id"]
            state = wait_state(cid, {"WAITING_FOR_REPLY"})
            check("the agent's first turn leaves it WAITING_FOR_REPLY", state == "WAITING_FOR_REPLY")

            # 4. It is in the inbox, in the active group; open it.
            page.get_by_test_id("filter-apply").click()
            row = page.get_by_test_id("group-created").get_by_test_id("conversation-link").filter(
                has_text=contact
            )
            expect(row).to_have_count(1)
            check("the inbox lists it among the active conversations")
            shot(page, "inbox")
            row.click()
            expect(page.get_by_test_id("conversation")).to_be_visible()
            expect(page.get_by_test_id("conv-id")).to_have_text(cid)
            expect(page.get_by_test_id("conv-state")).to_have_text("WAITING_FOR_REPLY")
            check("its page shows id and state WAITING_FOR_REPLY")
            expect(page.get_by_test_id("conv-contact")).to_have_text(contact)
            check("its page shows the contact")
            expect(page.get_by_test_id("message")).to_have_count(1)
            check("the transcript shows the agent's first message")
            check("'Resume agent' is not offered", page.get_by_test_id("resume-agent").is_hidden())
            shot(page, "conversation")

            # Sending as a person from WAITING_FOR_REPLY keeps the state
            # (the API's operator_send) and adds a human message.
            page.get_by_test_id("send-text").fill("A person here: we can come on Tuesday.")
            page.get_by_test_id("send").click()
            expect(page.get_by_test_id("message")).to_have_count(2)
            check("a message sent as a person appears in the transcript")
            expect(page.locator("[data-test=message].human")).to_contain_text("we can come on Tuesday")
            check("it is shown as the person's")
            check("the API agrees the state is WAITING_FOR_REPLY", conversation(cid)["state"] == "WAITING_FOR_REPLY")
            expect(page.get_by_test_id("conv-state")).to_have_text("WAITING_FOR_REPLY")
            check("the page shows WAITING_FOR_REPLY after the send")

            # The contact answers through the API; the open page (asking
            # again every 5 s) shows the reply, the agent's answer and the
            # transitions.
            status, _ = api(
                "POST",
                f"/v1/products/{PRODUCT}/conversations/{cid}/replies",
                {"text": "Tuesday morning is fine."},
            )
            check("the contact's reply is accepted", status == 200)
            check("the agent answers it", wait_state(cid, {"WAITING_FOR_REPLY"}) == "WAITING_FOR_REPLY")
            expect(page.get_by_test_id("message")).to_have_count(4)
            check("the open page shows the reply and the agent's answer")
            expect(page.locator("[data-test=message].contact")).to_contain_text("Tuesday morning is fine.")
            check("the reply is shown as the contact's")
            expect(page.get_by_test_id("audit-row").filter(has_text="contact_reply")).to_have_count(1)
            check("the history shows the reply's transition")

            # 4b. A contact who asks for a person: the conversation needs
            # one, first in the inbox; the operator answers with Send, the
            # agent goes on; asked again, the operator resumes the agent.
            helped = f"helped-{uuid.uuid4().hex[:12]}"
            hid = create(helped, "Answer a billing question")
            check("a second conversation waits for its contact", wait_state(hid, {"WAITING_FOR_REPLY"}) == "WAITING_FOR_REPLY")
            reply(hid, "Could I talk to a person, please?")
            state = wait_state(hid, {"NEEDS_HUMAN_INTERVENTION"})
            check("asking for a person brings it to NEEDS_HUMAN_INTERVENTION", state == "NEEDS_HUMAN_INTERVENTION")
            page.get_by_test_id("nav-inbox").click()
            first_group = page.get_by_test_id("groups").locator("section").first
            expect(first_group).to_have_attribute("data-test", "group-needs_human_intervention")
            check("the 'Needs a person' group comes first")
            row = first_group.get_by_test_id("conversation-link").filter(has_text=helped)
            expect(row).to_have_count(1)
            check("it is listed under 'Needs a person'")
            expect(first_group.locator("h2")).to_contain_text("Needs a person")
            shot(page, "inbox-needs-a-person")
            row.click()
            expect(page.get_by_test_id("conv-id")).to_have_text(hid)
            expect(page.get_by_test_id("conv-state")).to_have_text("NEEDS_HUMAN_INTERVENTION")
            check("its page shows NEEDS_HUMAN_INTERVENTION")
            expect(page.get_by_test_id("conv-human-reason")).to_have_text("the contact asked for a person")
            check("its page shows why a person is needed")
            expect(page.get_by_test_id("resume-agent")).to_be_visible()
            check("'Resume agent' is offered")
            shot(page, "needs-a-person")

            page.get_by_test_id("send-text").fill("Sam here, from billing: your invoice is corrected.")
            page.get_by_test_id("send").click()
            handed = page.get_by_test_id("audit-row").filter(has_text="operator_send").filter(has_text="ACTIVE")
            expect(handed).to_have_count(1)
            check("Send as a person: the history shows NEEDS_HUMAN_INTERVENTION -> ACTIVE")
            expect(page.get_by_test_id("conv-state")).to_have_text("WAITING_FOR_REPLY")
            check("then the agent's turn: the page shows WAITING_FOR_REPLY")
            check("the API agrees: WAITING_FOR_REPLY", conversation(hid)["state"] == "WAITING_FOR_REPLY")
            expect(page.locator("[data-test=message].human")).to_contain_text("your invoice is corrected")
            check("the person's message is in the transcript")
            expect(page.locator("[data-test=message]").last).to_have_class(re.compile(r"\bagent\b"))
            check("and the agent's message after it")
            check("'Resume agent' is no longer offered", page.get_by_test_id("resume-agent").is_hidden())
            shot(page, "answered-by-a-person")

            reply(hid, "Thanks, but I would rather talk to a human again.")
            expect(page.get_by_test_id("conv-state")).to_have_text("NEEDS_HUMAN_INTERVENTION")
            check("asked again, the open page shows NEEDS_HUMAN_INTERVENTION")
            check("the API agrees: NEEDS_HUMAN_INTERVENTION", conversation(hid)["state"] == "NEEDS_HUMAN_INTERVENTION")
            page.get_by_test_id("resume-agent").click()
            resumed = page.get_by_test_id("audit-row").filter(has_text="resume").filter(has_text="NEEDS_HUMAN_INTERVENTION")
            expect(resumed).to_have_count(1)
            expect(page.get_by_test_id("conv-state")).to_have_text(re.compile(r"^(ACTIVE|WAITING_FOR_REPLY)$"))
            check("Resume agent: the page shows the agent at work again")
            expect(page.get_by_test_id("conv-state")).to_have_text("WAITING_FOR_REPLY")
            check("the agent's turn ends WAITING_FOR_REPLY, not handed back to a person")
            check("the API agrees: WAITING_FOR_REPLY", conversation(hid)["state"] == "WAITING_FOR_REPLY")
            shot(page, "agent-resumed")
            page.get_by_test_id("back").click()
            expect(page.get_by_test_id("inbox")).to_be_visible()
            expect(
                page.get_by_test_id("group-created").get_by_test_id("conversation-link").filter(has_text=helped)
            ).to_have_count(1)
            check("back in the inbox it is among the active ones")
            row = page.get_by_test_id("conversation-link").filter(has_text=contact)
            row.click()
            expect(page.get_by_test_id("conv-id")).to_have_text(cid)

            # Pause and resume change the state the page shows, as the API says.
            page.get_by_test_id("pause").click()
            expect(page.get_by_test_id("conv-state")).to_have_text("PAUSED")
            check("Pause: the page shows PAUSED")
            check("the API agrees: PAUSED", conversation(cid)["state"] == "PAUSED")
            expect(page.get_by_test_id("resume")).to_be_visible()
            check("Resume is offered on a paused conversation")
            shot(page, "paused")
            page.get_by_test_id("resume").click()
            expect(page.get_by_test_id("conv-state")).to_have_text("WAITING_FOR_REPLY")
            check("Resume: the page shows WAITING_FOR_REPLY again")
            check("the API agrees: WAITING_FOR_REPLY", conversation(cid)["state"] == "WAITING_FOR_REPLY")

            # Cancel ends it.
            page.get_by_test_id("cancel").click()
            expect(page.get_by_test_id("conv-state")).to_have_text("FAILED")
            check("Cancel: the page shows FAILED")
            check("the API agrees: FAILED", conversation(cid)["state"] == "FAILED")
            check("Cancel is no longer offered once finished", page.get_by_test_id("cancel").is_hidden())
            shot(page, "cancelled")

            page.get_by_test_id("back").click()
            expect(page.get_by_test_id("inbox")).to_be_visible()
            expect(
                page.get_by_test_id("group-completed").get_by_test_id("conversation-link").filter(has_text=contact)
            ).to_have_count(1)
            check("back in the inbox it is among the finished ones")
            shot(page, "inbox-finished")

            # 4c. A group holds a page of conversations and offers more.
            for n in range(22):
                done = create(f"done-{n:02}-{uuid.uuid4().hex[:8]}", "Say thanks")
                ok(api("POST", f"/v1/products/{PRODUCT}/conversations/{done}/cancel"), "cancel")
            query = "state=COMPLETED,ABANDONED,FAILED&limit=1000"
            total = len(ok(api("GET", f"/v1/products/{PRODUCT}/conversations?{query}"), "list")["items"])
            page.get_by_test_id("filter-apply").click()
            finished = page.get_by_test_id("group-completed")
            expect(finished.get_by_test_id("conversation-row")).to_have_count(20)
            expect(finished.locator("h2")).to_have_text("Finished (20+)")
            check(f"the finished group shows its newest 20 of {total} and says there are more")
            finished.get_by_test_id("more").click()
            shown = min(40, total)
            expect(finished.get_by_test_id("conversation-row")).to_have_count(shown)
            expect(finished.locator("h2")).to_have_text(f"Finished ({shown}{'+' if total > 40 else ''})")
            check("'More' adds the next page")
            check("'More' is offered while more are left", (finished.get_by_test_id("more").count() == 1) == (total > 40))
            shot(page, "inbox-more")

            # 4d. The read-only pages, one record each, its state drawn on
            # its machine's diagram.
            pages = entities(uuid.uuid4().hex[:10])
            for name, path, state, trail, history in pages:
                page.goto(f"{URL}{path}")
                expect(page.get_by_test_id("entity-state")).to_be_visible()
                expect(page.get_by_test_id("entity-diagram").locator("svg")).to_have_count(1)
                if state is not None:
                    expect(page.get_by_test_id("entity-state")).to_have_text(state)
                    current = page.get_by_test_id("entity-diagram").get_by_test_id("current-state")
                    expect(current).to_have_attribute("data-state", state)
                    check(f"the {name} page shows state {state}, drawn on its diagram")
                else:
                    check(f"the {name} page shows its diagram")
                for part, least in (("audit", trail), ("history", history)):
                    rows = page.get_by_test_id(f"entity-{part}").locator("tr")
                    if least is None:
                        check(f"the {name} page has no {part} table", page.locator(f"#entity-{part}-box").is_hidden())
                    else:
                        if least:
                            expect(rows.first).to_be_visible()
                        check(f"the {name} page shows its {part} ({rows.count()} rows)", rows.count() >= least)
                shot(page, name)
            page.get_by_test_id("nav-flows").click()
            expect(page.get_by_test_id("flow").first).to_be_visible()
            check("the flows page draws each loaded flow", page.get_by_test_id("flow").locator("svg").count() >= 1)
            shot(page, "flows")
            page.get_by_test_id("nav-inbox").click()
            expect(page.get_by_test_id("inbox")).to_be_visible()

            # 4e. Without a key in the tab, every console address shows the
            # sign-in page and no data.
            fresh = browser.new_context(viewport={"width": 1200, "height": 900})
            fresh.set_default_timeout(TIMEOUT_MS)
            anonymous = fresh.new_page()
            addresses = ["/console", f"/console/conversations/{hid}", "/console/flows"] + [p[1] for p in pages]
            for address in addresses:
                anonymous.goto(f"{URL}{address}")
                only_sign_in(anonymous, f"no key, {address}")
                content = anonymous.content()
                check(f"no key, {address}: no data", helped not in content and hid not in content)
            shot(anonymous, "no-key")
            fresh.close()

            # Signing out forgets the key.
            page.get_by_test_id("sign-out").click()
            expect(page.get_by_test_id("sign-in")).to_be_visible()
            check("Sign out shows the sign-in page", page.evaluate("sessionStorage.length") == 0)

            # 5. Another product's key does not see this conversation.
            if SECOND_KEY:
                status, me = api("GET", "/v1/me", key=SECOND_KEY)
                check("the second key opens another product", status == 200 and me["product_id"] != PRODUCT)
                other = context.browser.new_context(viewport={"width": 1200, "height": 900})
                other.set_default_timeout(TIMEOUT_MS)
                page2 = other.new_page()
                sign_in(page2, SECOND_KEY)
                expect(page2.get_by_test_id("inbox")).to_be_visible()
                expect(page2.get_by_test_id("product")).to_have_text(f"product {me['product_id']}")
                check("the second key signs in to its own product")
                expect(page2.get_by_test_id("group-created")).to_be_visible()
                check(
                    "its inbox does not list the first product's conversation",
                    page2.get_by_test_id("conversation-link").filter(has_text=contact).count() == 0,
                )
                shot(page2, "second-product-inbox")
                page2.goto(f"{URL}/console/conversations/{cid}")
                expect(page2.get_by_test_id("conv-error")).to_be_visible()
                check("opening it by address shows an error", page2.get_by_test_id("conv-id").inner_text() == "")
                check("and no transcript", page2.get_by_test_id("message").count() == 0)
                shot(page2, "second-product-conversation")
                for name, path, *_ in pages:
                    page2.goto(f"{URL}{path}")
                    expect(page2.get_by_test_id("entity-error")).to_be_visible()
                    check(
                        f"the first product's {name}, opened by address, shows an error and no data",
                        page2.locator("#entity-body").is_hidden()
                        and page2.get_by_test_id("entity-state").inner_text() == ""
                        and page2.get_by_test_id("entity-history").locator("tr").count() == 0
                        and page2.get_by_test_id("entity-audit").locator("tr").count() == 0,
                    )
                    shot(page2, f"second-product-{name}")
                other.close()
            else:
                print("skipped: no second product's key (PARLANCE_SECOND_KEY unset)", flush=True)
        finally:
            browser.close()

    if CHECKS_FILE:
        Path(CHECKS_FILE).write_text(f"{checks}\n")
    print(f"{checks} checks passed", flush=True)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED after {checks} checks: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
