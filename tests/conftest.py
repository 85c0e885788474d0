from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gputop_dl.probe import Probe


@pytest.fixture(autouse=True)
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test gets its own discovery directory (short: ipc paths max ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gt-"))
    path.chmod(0o700)
    monkeypatch.setenv("GPUTOP_RUNTIME_DIR", str(path))
    # No test reads the user's own CURVE keys (gputop keys): an empty config dir.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(path / "config"))
    monkeypatch.delenv("GPUTOP_SERVER_KEY", raising=False)
    for name in (
        "GPUTOP_LISTEN",
        "GPUTOP_NAME",
        "GPUTOP_DISABLE",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def no_probe_left_behind() -> Iterator[None]:
    """A probe a test forgot would be every later test's probe (one per process)."""
    from gputop_dl.probe.core import current
    from tests.wire_reader import WireReader

    yield
    live = current()
    if live is not None:
        live.close()
    WireReader.close_all()


SMALL_CHUNK = 7
"""Steps of a C-timed segment in the tests that take ``small_segments``: a pass of 60
steps crosses several segments (probe/stamps.py's CHUNK_STEPS is 1,024)."""


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputop_dl.probe import stamps

    monkeypatch.setattr(stamps, "CHUNK_STEPS", SMALL_CHUNK)


@pytest.fixture
def p(request: pytest.FixtureRequest) -> Iterator[Probe]:
    """A live probe on TCP loopback, no node sampler, named after the test module."""
    from tests.test_probe import tcp_probe

    live = tcp_probe(request.module.__name__.rsplit(".", 1)[-1], system_interval_s=0)
    assert live.enabled, live.error
    yield live
    live.close()
