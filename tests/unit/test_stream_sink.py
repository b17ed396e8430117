"""The stream sink (bulkfetch.stream): a page's bodies go up as one message, sizes and
names in order, before the page's report; one message a body in the one_by_one kind."""

from __future__ import annotations

from array import array

from bulkfetch.config import SinkOptions
from bulkfetch.models import Failure, PageReport
from bulkfetch.sinks import open_sink
from bulkfetch.sinks.stream import StreamSink


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[object, ...]] = []

    def put(self, message: tuple[object, ...]) -> None:
        self.sent.append(message)


def test_a_page_is_one_message_of_names_sizes_and_bodies() -> None:
    outbox = Outbox()
    sink = StreamSink(outbox)
    first, second = sink.begin_page(0), sink.begin_page(1)  # two pages in flight at once
    first("a", b"alpha", None)
    second("x", b"", None)
    first("b/c", b"be", "md5")
    spool = sink.open_spool("big")
    spool.write(b"12")
    spool.write(memoryview(b"345"))
    sink.store_spool(0, "big", spool, 5, "md5")
    assert outbox.sent == []  # nothing goes before the page ends
    report = PageReport(0, 3, 12)
    assert sink.end_page(report) == [report]
    ((kind, seq, names, sizes, data),) = outbox.sent
    assert (kind, seq, names, data) == ("bodies", 0, "a\0b/c\0big", b"alphabe12345")
    assert list(array("Q", sizes)) == [5, 2, 5]
    sink.end_page(PageReport(1, 1, 0))
    assert outbox.sent[1][2:] == ("x", array("Q", [0]).tobytes(), b"")


def test_a_page_of_failures_only_sends_no_bodies() -> None:
    outbox = Outbox()
    sink = StreamSink(outbox)
    sink.begin_page(3)
    sink.skip(3, "gone")
    report = PageReport(3, 0, 0, (Failure("gone", "HTTP 404", 1),))
    assert sink.end_page(report) == [report]
    assert outbox.sent == []


def test_one_by_one_sends_each_body_at_once() -> None:
    outbox = Outbox()
    sink = open_sink(SinkOptions(kind="stream-each"), None, 0, outbox)  # type: ignore[arg-type]
    write = sink.begin_page(0)
    write("a", b"1", None)
    write("b", b"22", None)
    assert outbox.sent == [("body", "a", b"1"), ("body", "b", b"22")]
    sink.end_page(PageReport(0, 2, 3))
    assert len(outbox.sent) == 2
