"""What the elastic tests share: a coordinator served from a thread of the test process."""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from hogwild.elastic.coordinator import serve
from tests.conftest import free_port


@contextlib.contextmanager
def coordinator_thread() -> Iterator[int]:
    """hogwild-coordinator on 127.0.0.1 and a free port (yielded), stopped and joined on exit."""
    ready, stop = threading.Event(), threading.Event()
    port = free_port()
    thread = threading.Thread(target=serve, args=("127.0.0.1", port, ready, stop), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield port
    finally:
        stop.set()
        thread.join(5)
