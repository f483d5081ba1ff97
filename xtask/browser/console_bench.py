"""Loads each page of the operator console again and again in Debian's
Chromium (headless, driven by Playwright) against a live ``parlance
serve``, and prints how long each load took to show its data.

``cargo xtask bench console`` runs it (from ``crates/app/benches/console.rs``)
with:

- ``PARLANCE_URL``: the service's base URL;
- ``PARLANCE_API_KEY`` and ``PARLANCE_PRODUCT``: a key and the product it
  opens, whose pages are loaded;
- ``PARLANCE_BENCH_PAGES``: a JSON list of ``[name, path]``; the page named
  ``sign-in`` is loaded without a key, ``sign-in submit`` is the time from
  submitting the key to the inbox's data, every other one with the key;
- ``PARLANCE_BENCH_WARM`` and ``PARLANCE_BENCH_LOADS``: loads per page not
  measured, then measured;
- ``PARLANCE_CHROMIUM``: the browser.

A load is a navigation (``page.goto``) in a warm tab; its time is the
console's ``rendered`` mark (set when the page's data is in the document),
in milliseconds from the navigation's start. The result is one JSON line,
``{"pages": [{"name": ..., "ms": [...]}, ...]}``, on stdout.
"""

import json
import os
import sys
import time

from playwright.sync_api import sync_playwright

URL = os.environ["PARLANCE_URL"].rstrip("/")
KEY = os.environ["PARLANCE_API_KEY"]
PRODUCT = os.environ.get("PARLANCE_PRODUCT", "default")
PAGES = json.loads(os.environ["PARLANCE_BENCH_PAGES"])
WARM = int(os.environ.get("PARLANCE_BENCH_WARM", "5"))
LOADS = int(os.environ.get("PARLANCE_BENCH_LOADS", "30"))
CHROMIUM = os.environ.get("PARLANCE_CHROMIUM", "/usr/bin/chromium")
TIMEOUT_MS = 30_000

RENDERED = "performance.getEntriesByName('rendered').map((m) => [m.detail, m.startTime])"


def wait_until(page, expression):
    """Asks the page `expression` until it is true. (The console's content
    security policy forbids the string evaluation `wait_for_function` needs;
    the times measured are the page's own marks, so how often this asks
    does not change them.)"""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {expression}")
        time.sleep(0.01)


def rendered(page, name):
    """The time of the first `rendered` mark of the document, which must
    be the page's."""
    wait_until(page, "performance.getEntriesByName('rendered').length > 0")
    marks = page.evaluate(RENDERED)
    detail, at = marks[0]
    if page.get_by_test_id("inbox-error").is_visible() or page.get_by_test_id("conv-error").is_visible():
        raise SystemExit(f"{name}: the page shows an error")
    if page.get_by_test_id("entity-error").is_visible():
        raise SystemExit(f"{name}: the page shows an error")
    return detail, at


def sign_in_submit(page):
    """Submits the key on the sign-in page: ms from the submission to the
    inbox's data."""
    page.evaluate("sessionStorage.clear()")
    page.goto(f"{URL}/console")
    page.get_by_test_id("sign-in").wait_for()
    page.get_by_test_id("key").fill(KEY)
    page.get_by_test_id("sign-in-submit").click()
    wait_until(page, "performance.getEntriesByName('rendered').some((m) => m.detail === 'inbox')")
    return page.evaluate(
        "performance.getEntriesByName('rendered').find((m) => m.detail === 'inbox').startTime"
        " - performance.getEntriesByName('sign-in')[0].startTime"
    )


def main():
    results = []
    with sync_playwright() as pw:
        pw.selectors.set_test_id_attribute("data-test")
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 900})
            context.set_default_timeout(TIMEOUT_MS)
            page = context.new_page()
            page.goto(f"{URL}/console")
            for name, path in PAGES:
                samples = []
                for n in range(WARM + LOADS):
                    if name == "sign-in submit":
                        ms = sign_in_submit(page)
                    else:
                        keyed = name != "sign-in"
                        page.evaluate(
                            "([key, product, keyed]) => { if (keyed) {"
                            " sessionStorage.setItem('parlance.key', key);"
                            " sessionStorage.setItem('parlance.product', product); }"
                            " else { sessionStorage.clear(); } }",
                            [KEY, PRODUCT, keyed],
                        )
                        page.goto(f"{URL}{path}")
                        detail, ms = rendered(page, name)
                        wanted = "sign-in" if name == "sign-in" else None
                        if wanted and detail != wanted:
                            raise SystemExit(f"{name}: rendered {detail}, not {wanted}")
                        if not wanted and detail == "sign-in":
                            raise SystemExit(f"{name}: the key was not taken")
                    if n >= WARM:
                        samples.append(round(ms, 3))
                results.append({"name": name, "ms": samples})
                print(f"console bench: {name}: {len(samples)} loads", file=sys.stderr, flush=True)
        finally:
            browser.close()
    print(json.dumps({"pages": results}), flush=True)


if __name__ == "__main__":
    main()
