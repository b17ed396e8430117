from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bulkfetch.testing import ReferenceServer


@pytest.fixture
def reference_server() -> Iterator[Callable[..., ReferenceServer]]:
    """Call with serve flags to start a server on a free port; all are stopped afterwards."""
    started: list[ReferenceServer] = []

    def start(*args: str, **kwargs: object) -> ReferenceServer:
        server = ReferenceServer(*args, **kwargs).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)
