"""The data checker against the golden model ``protocol.generator_payload``."""

import pytest

from host.checker import Checker, Expected, Landed, Mismatch, Statistics, first_difference
from host.protocol import generator_payload


@pytest.mark.parametrize("length", [0, 1, 4, 7, 8, 9, 15, 16, 63, 64, 65, 4096, 4099])
def test_expected_matches_the_golden_model(length):
    expected = Expected(length)
    for k in (0, 1, 7, 0xFFFF_FFFF, (1 << 32) + 3):
        assert expected(k) == generator_payload(k, length)


def test_good_messages_pass():
    checker = Checker(100, immediate=True)
    for k in range(50):
        assert checker.check(k, generator_payload(k, 100), imm=k) is None


@pytest.mark.parametrize("offset", [0, 1, 7, 8, 63, 99])
def test_a_flipped_byte_is_reported_at_its_offset(offset):
    checker = Checker(100, slots=4)
    data = bytearray(generator_payload(6, 100))
    good = data[offset]
    data[offset] ^= 0x10
    mismatch = checker.check(6, bytes(data), buffer_offset=checker.slot_offset(6))
    assert mismatch == Mismatch(6, offset=offset, expected=good, got=good ^ 0x10,
                                buffer_offset=200 + offset, length=100)
    assert str(mismatch) == (f"message 6, byte offset {offset}: expected 0x{good:02x} got "
                             f"0x{good ^ 0x10:02x} (buffer offset {200 + offset:#x})")


def test_only_the_first_bad_byte_is_reported():
    data = bytearray(generator_payload(3, 64))
    data[10] ^= 1
    data[40] ^= 1
    assert Checker(64).check(3, bytes(data)).offset == 10


def test_a_message_from_another_k_is_caught():
    mismatch = Checker(64).check(5, generator_payload(4, 64))
    assert mismatch.offset == 4
    assert (mismatch.expected, mismatch.got) == (5, 4)


def test_short_and_long_messages():
    checker = Checker(20)
    short = checker.check(2, generator_payload(2, 12))
    assert (short.offset, short.expected, short.got) == (12, generator_payload(2, 20)[12], None)
    assert "got nothing (it has only 12 bytes)" in str(short)
    long = checker.check(2, generator_payload(2, 20) + b"\x00")
    assert (long.offset, long.expected, long.got) == (20, None, 0)
    assert "expected the end of the message" in str(long)


def test_immediate_mismatch():
    checker = Checker(16, immediate=True)
    mismatch = checker.check(9, generator_payload(9, 16), imm=8)
    assert (mismatch.what, mismatch.expected, mismatch.got) == ("immediate", 9, 8)
    assert str(mismatch) == "message 9: immediate expected 0x00000009 got 0x00000008"
    assert "got none" in str(checker.check(9, generator_payload(9, 16), imm=None))
    assert Checker(16).check(9, generator_payload(9, 16), imm=None) is None


def test_ring_wrap():
    checker = Checker(64, slots=5)
    assert [checker.slot_offset(k) for k in range(12)] == [
        0, 64, 128, 192, 256, 0, 64, 128, 192, 256, 0, 64]
    assert Checker(64).slot_offset(12) == 12 * 64
    assert checker.final_messages(12) == [(0, 10), (1, 11), (2, 7), (3, 8), (4, 9)]
    assert checker.final_messages(3) == [(0, 0), (1, 1), (2, 2)]
    assert Checker(8).final_messages(2) == [(0, 0), (1, 1)]


def test_ring_of_a_whole_buffer_checks_every_slot():
    checker = Checker(24, slots=3)
    buffer = bytearray(b"\xff" * 72)
    for k in range(7):
        offset = checker.slot_offset(k)
        buffer[offset:offset + 24] = generator_payload(k, 24)
    for slot, k in checker.final_messages(7):
        assert checker.check(k, bytes(buffer[slot * 24:(slot + 1) * 24])) is None
    buffer[24 + 5] ^= 0xFF
    assert checker.check(4, bytes(buffer[24:48]), buffer_offset=24).buffer_offset == 29


def test_marker_and_landing():
    checker = Checker(20, slots=4)
    assert checker.marker() == (8, 8)
    poison = b"\xff" * 8
    assert checker.landed(1, poison) is Landed.NOT_YET
    assert checker.landed(1, generator_payload(1, 20)[8:16]) is Landed.YES
    assert checker.landed(5, generator_payload(1, 20)[8:16]) is Landed.NOT_YET
    lapped = generator_payload(9, 20)[8:16]
    assert checker.landed(1, lapped) is Landed.LAPPED
    assert checker.lapping(1, lapped) == 9
    assert checker.landed(2, lapped) is Landed.NOT_YET
    assert str(Mismatch(1, "overwritten", got=9)) == (
        "message 1 was overwritten by message 9 before it was checked")


def test_short_messages_land_when_equal():
    checker = Checker(6, slots=2)
    assert checker.marker() == (0, 6)
    assert checker.landed(3, generator_payload(3, 6)) is Landed.YES
    assert checker.landed(3, b"\xff" * 6) is Landed.NOT_YET


def test_first_difference():
    assert first_difference(b"abc", b"abc") is None
    assert first_difference(b"abc", b"abd") == 2
    assert first_difference(b"abc", b"ab") == 2
    assert first_difference(b"", b"x") == 0


def test_statistics():
    now = [100.0]
    stats = Statistics(total=10, clock=lambda: now[0])
    assert stats.gbps == 0.0 and stats.elapsed == 0.0
    stats.start()
    stats.add(1_000_000_000)
    stats.add(1_000_000_000, ok=False)
    now[0] = 100.5
    assert stats.elapsed == 0.5
    assert stats.gbps == pytest.approx(4.0)
    assert stats.progress_line() == (
        "2/10 messages, 2000.0 MB, 4.00 GB/s now, 4.00 GB/s average, 1 error")
    stats.add_batch(3, 1_000_000_000, errors=2, checked=1)
    now[0] = 101.5
    assert stats.progress_line() == (
        "5/10 messages, 3000.0 MB, 1.00 GB/s now, 2.00 GB/s average, 3 errors")
    stats.stop()
    now[0] = 200.0
    assert stats.summary() == {"messages": 5, "bytes": 3_000_000_000, "errors": 3,
                               "checked": 3, "elapsed_s": 1.5, "gbytes_per_s": 2.0}


def test_a_right_message_is_passed_by_its_words_without_a_byte_search(monkeypatch):
    """A right message is passed by comparing 8-byte words; the byte-by-byte search for
    the first difference (locate) is only for a wrong one."""
    checker = Checker(256)

    def locate(k, data, buffer_offset=None):
        raise AssertionError(f"message {k} was searched byte by byte")

    monkeypatch.setattr(checker, "locate", locate)
    for k in range(200):
        assert checker.check(k, generator_payload(k, 256)) is None
    wrong = bytearray(generator_payload(7, 256))
    wrong[100] ^= 1
    with pytest.raises(AssertionError, match="message 7 was searched"):
        checker.check(7, bytes(wrong))


def _ring(length, count, first_k=0):
    return bytearray(b"".join(generator_payload(first_k + k, length) for k in range(count)))


@pytest.mark.parametrize("length", [8, 64, 4096, 20, 4099])
def test_check_messages_passes_a_good_ring_and_locates_every_bad_byte(length):
    count = 40
    ring = _ring(length, count, first_k=5)
    checker = Checker(length, slots=count)
    assert checker.check_messages(memoryview(ring), 0, 5, count) == []
    flips = {0: 0, 17: length - 1, 39: length // 2}
    for i, offset in flips.items():
        ring[i * length + offset] ^= 0x01
    found = checker.check_messages(memoryview(ring), 0, 5, count)
    assert [(m.message, m.offset, m.buffer_offset) for m in found] == [
        (5 + i, offset, i * length + offset) for i, offset in flips.items()]
    for mismatch in found:
        good = generator_payload(mismatch.message, length)[mismatch.offset]
        assert (mismatch.expected, mismatch.got) == (good, good ^ 0x01)


def test_check_messages_at_an_offset_finds_a_message_of_another_lap():
    ring = bytearray(b"\xff" * 64) + _ring(64, 3, first_k=10)
    ring[64 + 64:64 + 128] = generator_payload(11 + 4, 64)
    found = Checker(64, slots=4).check_messages(memoryview(ring), 64, 10, 3)
    assert [(m.message, m.offset, m.expected, m.got) for m in found] == [(11, 4, 11, 15)]


def test_check_messages_across_k_2_to_the_32():
    first = (1 << 32) - 2
    ring = _ring(32, 4, first_k=first)
    assert generator_payload(first + 2, 32) == generator_payload(0, 32)
    assert Checker(32).check_messages(memoryview(ring), 0, first, 4) == []
    assert len(Checker(32).check_messages(memoryview(ring), 0, first + 1, 4)) == 4


def test_messages_longer_than_a_chunk_are_checked_to_their_last_byte():
    from host.checker import CHUNK_BYTES

    length = CHUNK_BYTES + 24
    ring = _ring(length, 2)
    checker = Checker(length)
    assert checker.check_messages(memoryview(ring), 0, 0, 2) == []
    ring[2 * length - 1] ^= 0x80
    found = checker.check_messages(memoryview(ring), 0, 0, 2)
    assert [(m.message, m.offset) for m in found] == [(1, length - 1)]


def test_checker_threads_split_a_batch_and_locate_each_bad_byte(monkeypatch):
    import threading

    import host.checker

    monkeypatch.setattr(host.checker, "_MIN_THREAD_BYTES", 1024)
    length, count = 256, 30
    ring = _ring(length, count)
    checker = Checker(length, slots=count, threads=3)
    assert checker._parts(count) == [(0, 10), (10, 20), (20, 30)]
    seen = []
    bad_words = checker._bad_words

    def spy(words, first_k, count):
        seen.append((threading.current_thread().name, first_k, count))
        return bad_words(words, first_k, count)

    checker._bad_words = spy
    flips = {0: 3, 9: 255, 10: 0, 29: 100}
    for i, offset in flips.items():
        ring[i * length + offset] ^= 0x20
    try:
        found = checker.check_messages(memoryview(ring), 0, 0, count)
    finally:
        checker.close()
    assert [(m.message, m.offset, m.buffer_offset) for m in found] == [
        (i, offset, i * length + offset) for i, offset in flips.items()]
    assert sorted(part for _, *part in seen) == [[0, 10], [10, 10], [20, 10]]
    assert all(name.startswith("checker") for name, *_ in seen), "in the checker threads"
