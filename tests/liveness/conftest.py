from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Workers


@pytest.fixture
def workers() -> Iterator[Workers]:
    """The test's workers; none is left behind, whatever the outcome."""
    started = Workers()
    yield started
    started.kill_all()
