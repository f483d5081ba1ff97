"""docs/api.md's "Quick start with curl", run as it stands against the live
service: every block of the section, in order, in one bash script."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

API_MD = pathlib.Path(__file__).resolve().parents[3] / "docs" / "api.md"


def quick_start_blocks():
    text = API_MD.read_text(encoding="utf-8")
    section = re.search(r"^## Quick start with curl\n(.*?)^## ", text, re.S | re.M)
    assert section, "docs/api.md has no 'Quick start with curl' section"
    return re.findall(r"```sh\n(.*?)```", section.group(1), re.S)


def test_quick_start_covers_every_machine():
    script = "".join(quick_start_blocks())
    for route in ("/sessions/", "/adoption", "/conversations", "/agent/turns", "/v1/ai/qa/"):
        assert route in script, f"the quick start has no example for {route}"


def test_quick_start_runs(service):
    if shutil.which("bash") is None or shutil.which("curl") is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set and bash or curl is missing")
        pytest.skip("bash and curl are needed")
    script = "set -euo pipefail\n" + "".join(quick_start_blocks())
    env = {**os.environ, "PARLANCE_URL": service["url"], "PARLANCE_API_KEY": service["key"]}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    # One answer per curl that prints one: every machine answered.
    assert done.stdout.count("{") >= 17, done.stdout
