"""Checks of the service's own rules, beyond what the API document says.

Loaded by schemathesis through `hooks` in `schemathesis.toml`.
"""

import atexit
import collections
import json
import os
import threading

import schemathesis

PROBLEM_JSON = "application/problem+json"


@schemathesis.check
def problem_json_on_client_errors(ctx, response, case):
    """Every 4xx answer is an RFC 9457 problem: `application/problem+json`
    with `type`, `title` and `status` matching the answer's status."""
    if not 400 <= response.status_code < 500:
        return None
    media = response.headers.get("content-type", [""])
    media = (media[0] if isinstance(media, list) else media).split(";")[0].strip()
    if media != PROBLEM_JSON:
        raise AssertionError(
            f"{response.status_code} answered with content-type {media!r}, not {PROBLEM_JSON}"
        )
    body = response.json()
    if not isinstance(body, dict):
        raise AssertionError(f"problem body is not an object: {body!r}")
    missing = [k for k in ("type", "title", "status") if k not in body]
    if missing:
        raise AssertionError(f"problem body lacks {missing}: {body!r}")
    if body["status"] != response.status_code:
        raise AssertionError(
            f"problem status {body['status']} differs from the answer's {response.status_code}"
        )
    return None


# Answers by status, written at exit to the file `PARLANCE_API_TEST_TALLY`
# names, so the run can say how many requests it made.
_TALLY = collections.Counter()
_TALLY_LOCK = threading.Lock()


@schemathesis.hook
def after_call(context, case, response):
    with _TALLY_LOCK:
        _TALLY[str(response.status_code)] += 1


def _write_tally():
    path = os.environ.get("PARLANCE_API_TEST_TALLY")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(_TALLY), f)


atexit.register(_write_tally)
