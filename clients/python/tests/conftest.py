"""The live service the tests run against: ``PARLANCE_URL`` and
``PARLANCE_API_KEY`` (``cargo xtask client-test`` starts one and sets them)."""

import os

import pytest

from parlance_client import AsyncClient, Client


@pytest.fixture(scope="session")
def service():
    url = os.environ.get("PARLANCE_URL")
    key = os.environ.get("PARLANCE_API_KEY")
    if not url or not key:
        if os.environ.get("CI"):
            pytest.fail("CI is set and PARLANCE_URL / PARLANCE_API_KEY name no service")
        pytest.skip("no service: set PARLANCE_URL and PARLANCE_API_KEY, or run `cargo xtask client-test`")
    return {"url": url, "key": key, "product": os.environ.get("PARLANCE_PRODUCT", "default")}


@pytest.fixture
def client(service):
    with Client(service["url"], api_key=service["key"], product=service["product"]) as c:
        yield c


@pytest.fixture
def make_async_client(service):
    def make():
        return AsyncClient(service["url"], api_key=service["key"], product=service["product"])

    return make
