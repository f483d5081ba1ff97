"""The operator console in a real browser (Debian's Chromium, headless,
driven by Playwright) against a live ``parlance serve``.

``cargo xtask browser-test`` (and ``cargo xtask ci``) runs it with:

- ``PARLANCE_URL``: the service's base URL;
- ``PARLANCE_API_KEY``: a key for product ``PARLANCE_PRODUCT``;
- ``PARLANCE_SECOND_KEY`` (optional): a key for another product, which must
  not see the first product's conversations;
- ``PARLANCE_SCREENSHOTS``: the directory the page screenshots go to;
- ``PARLANCE_CHECKS_FILE``: where the number of checks passed is written.

The conversation is driven through the HTTP API only, as any client does.
"""

import json
import os
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
                shot(page2, "second-product-conversation")
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
