"""The delay router's line (scripts/harness/delay_router.py) without TUN or root: each packet
leaves ``delay`` after it came, in the order it came, and the loop's select waits exactly until
the next one is due."""

from __future__ import annotations

import pytest

from scripts.harness.delay_router import DelayLine


def test_a_packet_is_due_a_delay_after_it_came_and_not_before() -> None:
    line = DelayLine(0.005)
    line.push(b"a", now=10.0)
    assert line.due(10.004) == []
    assert line.due(10.005) == [b"a"]
    assert len(line) == 0


def test_packets_leave_in_the_order_they_came() -> None:
    line = DelayLine(0.010)
    for k, t in enumerate([1.000, 1.001, 1.001, 1.003]):
        line.push(bytes([k]), now=t)
    assert line.due(1.0115) == [b"\x00", b"\x01", b"\x02"]
    assert line.due(1.020) == [b"\x03"]


def test_the_timeout_is_until_the_oldest_packet_is_due() -> None:
    line = DelayLine(0.005)
    assert line.next_timeout(0.0) is None  # empty: select waits for a packet, however long
    line.push(b"a", now=1.0)
    line.push(b"b", now=1.002)
    assert line.next_timeout(1.001) == pytest.approx(0.004)
    assert line.next_timeout(1.009) == 0.0  # overdue: at once, never a negative timeout
    line.due(1.005)
    assert line.next_timeout(1.005) == pytest.approx(0.002)


def test_no_delay_passes_packets_at_once() -> None:
    line = DelayLine(0.0)
    line.push(b"a", now=3.0)
    assert line.next_timeout(3.0) == 0.0
    assert line.due(3.0) == [b"a"]


def test_a_full_line_drops_what_comes_and_keeps_what_it_holds() -> None:
    line = DelayLine(1.0, limit=2)
    assert line.push(b"a", 0.0) and line.push(b"b", 0.0)
    assert not line.push(b"c", 0.0)
    assert line.dropped == 1
    assert line.due(1.0) == [b"a", b"b"]


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError):
        DelayLine(-0.001)
