"""Fixtures several test modules share: moto's S3 server on loopback and a fault proxy in front of it;
and the order files run in.

A module that defines a fixture of the same name (e.g. ``endpoint`` for the local SageMaker
endpoint) overrides these, as pytest does for any conftest fixture.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

# One thread per operator for PyTorch (OpenMP) in the test processes and the subprocesses they start
# (set before any test module imports torch). `make test` runs a worker per core and one more, so
# intra-op threads only compete with the other workers: OpenMP's threads spin while they wait, and
# with 3 workers on 2 cores that spinning was 14% of the CPU time of the export-heavy files (their
# wall time 161 s -> 135 s). The tests check results, never speed; the benchmarks set their own
# thread counts (`--threads`). Give OMP_NUM_THREADS yourself to run with more.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The CDK's built-in template validation off in the test processes and in the apps and CLIs they
# start (the CDK reads CDK_VALIDATION at each synth; tests/cdk_helpers.py's subprocess_env passes it
# on). aws-cdk-lib runs cfn-lint's rules, compiled to WASM, on every template it synthesizes and
# reports what they find as warnings: on 2026-11-27 a `python app.py` of the default app used 9.2 to
# 10.6 s of CPU with it and 4.9 to 5.8 s without; the whole suite ran in 584 s against 605 s. The
# suite runs cfn-lint itself on the default template and every settings variant, and fails on a
# warning too (test_stack_resources, test_stack_variants, test_ops_variants). test_stack_app.py runs
# the app as users run it, with the validation on, and checks that it ran and found nothing. Give
# CDK_VALIDATION yourself to run the suite with it.
os.environ.setdefault("CDK_VALIDATION", "false")

import pytest
from hostile_helpers import stop_zygote
from s3_faults import FaultProxy  # tests/ is on sys.path; a site-packages "tests" shadows tests.

from triton_mme_cdk.model_build.tools.local_s3 import local_s3


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


_FROZEN_FOR: list[object] = [None]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before each file's first test: collect, then freeze what is left (``gc.freeze``).

    A build calls ``gc.collect()`` several times (``model_build.export.memory.release_memory``, so
    that a big model's protos and sessions leave memory between steps). In a test process, with
    torch, transformers, the CDK and the earlier files' objects on the heap, each full collection
    walked all of them: about 0.2 s a call, more than a tiny model's whole build. Frozen objects
    are skipped by every later collection.

    The collection here walks only what the previous file left (everything older is frozen), so
    that file's cyclic garbage is freed before it is frozen. Unfreezing first, to also free what
    was frozen while in use and became garbage later, walked the whole heap before every file:
    19 s of CPU in ``make test-fast``. What stays frozen is what lives across files (modules,
    caches, session fixtures), so little is kept that a full collection would free."""
    if item.path == _FROZEN_FOR[0]:
        return
    _FROZEN_FOR[0] = item.path
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stops the hostile tests' fork server, if this process started one (``atexit`` would too)."""
    stop_zygote()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without workers (``pytest`` alone), files without a slow test run first, then the others, each
    file's tests kept together and in their order: a broken manifest rule or template fails in the
    first minutes, not after the real exports and tritonserver runs.

    In an xdist worker (``make test``: whole files handed out, ``--dist loadfile``, in this order
    with ``--no-loadscope-reorder``) it is the other way round: the files with slow tests first, so
    that the long ones (the benchmarks' tiny run, the CLI's builds, the deploy path) start at once
    and the many short files fill the end. By default xdist orders files by their number of tests,
    which handed out ``test_cli.py`` (4 tests, about 2 minutes under load) last: one worker then ran
    alone for the last 31 s (9.2 minutes in all). With this order the three workers ended within
    4 s of each other (8.4 minutes). (An earlier session, with 2 workers, handed out the fast files
    first with only the tiny run ahead of them: 10.3 minutes against 9.7.)"""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    first_seen: dict[object, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.path, index)
    if hasattr(config, "workerinput"):  # an xdist worker
        items.sort(key=lambda item: (item.path not in slow_files, first_seen[item.path]))
    else:
        items.sort(key=lambda item: (item.path in slow_files, first_seen[item.path]))
