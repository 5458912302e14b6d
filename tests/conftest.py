"""Fixtures several test modules share: moto's S3 server on loopback and a fault proxy in front of it;
and the order files run in.

A module that defines a fixture of the same name (e.g. ``endpoint`` for the local SageMaker
endpoint) overrides these, as pytest does for any conftest fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from s3_faults import FaultProxy  # tests/ is on sys.path; a site-packages "tests" shadows tests.

from model_build.tools.local_s3 import local_s3


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """moto's S3 server for the module (state shared by its tests: use distinct buckets)."""
    with local_s3() as url:
        yield url


@pytest.fixture
def proxy(endpoint: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the module's S3 server, fresh for each test."""
    with FaultProxy(endpoint) as fault_proxy:
        yield fault_proxy


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files without a slow test run first, then the others, each file's tests kept together and
    in their order: a broken manifest rule or template fails in the first minutes,
    not after the real exports and tritonserver runs. That holds for a run without workers: under
    ``make test`` xdist hands out whole files (``--dist loadfile``), reordered by their number of
    tests, most first. Keeping this order there with the benchmarks' tiny run handed out first
    (``--no-loadscope-reorder``) was tried: 10.3 minutes against 9.7, as it slowed every test it
    ran beside."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    first_seen: dict[object, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.path, index)
    items.sort(key=lambda item: (item.path in slow_files, first_seen[item.path]))
