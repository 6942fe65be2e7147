from kvbench.harness.sse import SSEParser


def feed_all(parts):
    parser = SSEParser()
    events = []
    for part in parts:
        events += parser.feed(part)
    return events + parser.close()


def test_events_split_anywhere_give_the_same_payloads():
    stream = (
        b'data: {"a": 1}\r\n\r\n: keep-alive comment\n\ndata: line one\ndata: line two\n\nevent: x\ndata: [DONE]\n\n'
    )
    expected = ['{"a": 1}', "line one\nline two", "[DONE]"]
    assert feed_all([stream]) == expected
    for cut in range(1, len(stream)):
        assert feed_all([stream[:cut], stream[cut:]]) == expected, cut
    assert feed_all([bytes([byte]) for byte in stream]) == expected


def test_cr_only_line_endings_and_missing_final_blank_line():
    assert feed_all([b"data: one\r\rdata: two"]) == ["one", "two"]


def test_field_without_space_and_empty_data():
    assert feed_all([b"data:x\n\ndata\n\n"]) == ["x", ""]
