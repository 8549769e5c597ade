"""Line validation: each kind of bad line gets its reason; blank lines are not documents."""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib

import pytest
import zstandard

from pipelines.read import REASONS, Doc, Reject, open_lines, parse_line

CASES = [
    (b"\xc3\x28", "invalid_utf8"),
    (b"{", "invalid_json"),
    (b"42", "not_an_object"),
    (b'{"text": "t"}', "missing_id"),
    (b'{"id": 1.5, "text": "t"}', "id_not_string"),
    (b'{"id": "\\ud800", "text": "t"}', "id_invalid_unicode"),
    (b'{"id": "a\\udc00b"}', "id_invalid_unicode"),  # checked before the text: it is written with the reject
    (b'{"id": "x"}', "missing_text"),
    (b'{"id": "x", "text": null}', "text_not_string"),
    (b'{"id": "x", "text": ""}', "empty_text"),
    (b'{"id": "x", "text": "\\udfff"}', "invalid_unicode"),
]


@pytest.mark.parametrize("raw,reason", CASES)
def test_bad_line_is_rejected_with_reason(raw, reason):
    r = parse_line("src", "f.jsonl", 3, raw + b"\n")
    assert isinstance(r, Reject) and r.reason == reason and r.line == 3 and r.source == "src"
    assert r.to_json()["file"] == "f.jsonl"


def test_every_reason_is_covered_and_blank_lines_are_skipped():
    # unreadable_file is per file, line_too_long is decided while reading (test below)
    assert {reason for _, reason in CASES} | {"unreadable_file", "line_too_long"} == set(REASONS)
    assert parse_line("s", "f", 1, b"  \r\n") is None
    doc = parse_line("s", "f", 1, '\ufeff{"id": "i", "text": "héllo <|endoftext|>", "extra": 1}\r\n'.encode())
    assert isinstance(doc, Doc) and doc.text == "héllo <|endoftext|>" and doc.id == "i"


# Every extension Beam decompresses, with what writes it (zstd: with a frame checksum, as the zstd
# command line writes by default and python-zstandard does not; gzip/bz2/xz/zlib always check).
COMPRESSORS = {
    ".jsonl.gz": gzip.compress,
    ".jsonl.zst": zstandard.ZstdCompressor(write_checksum=True).compress,
    ".jsonl.zstd": zstandard.ZstdCompressor(write_checksum=True).compress,
    ".jsonl.bz2": bz2.compress,
    ".jsonl.xz": lzma.compress,
    ".jsonl.lzma": lambda b: lzma.compress(b, format=lzma.FORMAT_ALONE),
    ".jsonl.deflate": zlib.compress,
}


@pytest.mark.parametrize("suffix", [".jsonl", *COMPRESSORS])
def test_lines_stream_from_plain_and_compressed_files(tmp_path, suffix):
    data = b"".join(b'{"id": "%d", "text": "t"}\n' % i for i in range(1000)) + b"no newline at end"
    data = COMPRESSORS.get(suffix, bytes)(data)
    p = tmp_path / f"f{suffix}"
    p.write_bytes(data)
    lines = list(open_lines(str(p)))
    assert len(lines) == 1001 and lines[7] == b'{"id": "7", "text": "t"}\n' and lines[-1] == b"no newline at end"


def test_lines_longer_than_a_read_chunk_come_back_whole(tmp_path):
    lines = [b"x" * 10, b"y" * 25, b"", b"z" * 7]
    p = tmp_path / "f.jsonl"
    p.write_bytes(b"\n".join(lines))
    assert list(open_lines(str(p), chunk_bytes=4)) == [b"x" * 10 + b"\n", b"y" * 25 + b"\n", b"\n", b"z" * 7]


@pytest.mark.parametrize("raw,reason", CASES)
def test_the_fast_and_the_strict_parser_agree(raw, reason):
    from pipelines.read import _parse_strictly

    assert parse_line("s", "f", 2, raw) == _parse_strictly("s", "f", 2, raw)


def test_odd_but_valid_json_is_read_as_the_standard_library_reads_it():
    # accepted by json but not by orjson: they must still become documents, the same way
    for raw in [
        b'{"id": "n", "text": "t", "x": NaN}',
        b'{"id": "big", "text": "t", "n": 123456789012345678901234567890}',
        '\ufeff{"id": "bom", "text": "t"}'.encode(),
        b'{"id": "d", "text": "first", "text": "last"}',
    ]:
        doc = parse_line("s", "f", 1, raw)
        assert isinstance(doc, Doc) and doc.text in ("t", "last"), raw
    deep = b'{"id": "x", "text": "t", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert parse_line("s", "f", 1, deep).reason == "invalid_json"  # not a RecursionError crash


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_truncated_or_corrupt_compressed_files_raise_instead_of_ending_early(tmp_path, suffix):
    from pipelines.read import UnreadableFile

    data = b"".join(b'{"id": "%d", "text": "some text %d"}\n' % (i, i) for i in range(20000))
    compress = COMPRESSORS[suffix]
    whole = compress(data)
    cases = {
        "truncated": whole[: len(whole) // 2],
        "corrupt": whole[:200] + bytes(300) + whole[500:],
        "not compressed": data[:3000],
    }
    for what, blob in cases.items():
        p = tmp_path / f"{what.replace(' ', '_')}{suffix}"
        p.write_bytes(blob)
        with pytest.raises(UnreadableFile):
            for _ in open_lines(str(p), chunk_bytes=4096):
                pass
    # concatenated gzip members / zstd frames / bzip2, xz and zlib streams are one stream
    p = tmp_path / f"multi{suffix}"
    p.write_bytes(compress(data) + compress(b'{"id": "last", "text": "t"}\n'))
    assert len(list(open_lines(str(p), chunk_bytes=4096))) == 20001


@pytest.mark.parametrize("kind", ["fifo", "directory", "permission denied", "vanished"])
def test_a_local_path_that_is_no_longer_a_readable_file_is_unreadable_not_a_crash_or_a_hang(
    tmp_path, kind, monkeypatch
):
    # `resolve` refuses these before the job runs; a worker that meets one later (the file changed
    # in between) rejects the file whole instead of crashing the job or blocking on a FIFO
    import os
    import signal

    from apache_beam.io.filesystems import FileSystems

    from pipelines.read import UnreadableFile, read_file

    path = tmp_path / "f.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "permission denied":
        path.write_text('{"id": "1", "text": "t"}\n')

        def denied(*_a, **_k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(FileSystems, "open", denied)  # root reads any file: simulate what a user meets
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the reader blocked"))
    signal.alarm(10)
    try:
        with pytest.raises(UnreadableFile) as e:
            list(read_file("s", str(path)))
    finally:
        signal.alarm(0)
    assert e.value.line == 1


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@pytest.mark.parametrize("chunk_bytes", [3, 16, 1 << 20])
def test_a_line_over_the_limit_is_rejected_without_being_held(tmp_path, suffix, chunk_bytes):
    from pipelines.read import LongLine, read_file

    limit = 40
    doc = b'{"id": "%d", "text": "t"}'
    lines = [doc % 1, b'{"id": "long", "text": "' + b"x" * 200 + b'"}', doc % 3, b"y" * 41, b"z" * 40, b"w" * 100]
    data = b"\n".join(lines)  # the last (over-long) line has no newline
    p = tmp_path / f"f{suffix}"
    p.write_bytes(gzip.compress(data) if suffix.endswith("gz") else data)
    got = list(open_lines(str(p), chunk_bytes=chunk_bytes, max_line_bytes=limit))
    assert [type(x) is LongLine for x in got] == [False, True, False, True, False, True]
    assert got[0] == doc % 1 + b"\n" and got[2] == doc % 3 + b"\n" and got[4] == b"z" * 40 + b"\n"
    for i in (1, 3, 5):  # the line's start (at least `limit` bytes of it, at most 800), for the excerpt
        assert lines[i].startswith(got[i]) and limit < len(got[i]) <= 800
    # through the job's reader (its limit is the module's)
    import pipelines.read as read

    old, read.MAX_LINE_BYTES = read.MAX_LINE_BYTES, limit
    try:
        items = list(read_file("s", str(p)))
    finally:
        read.MAX_LINE_BYTES = old
    assert [(x.line, getattr(x, "reason", "doc")) for x in items] == [
        (1, "doc"),
        (2, "line_too_long"),
        (3, "doc"),
        (4, "line_too_long"),
        (5, "invalid_json"),
        (6, "line_too_long"),
    ]
    assert items[1].excerpt.startswith('{"id": "long"') and items[1].id is None


def test_a_huge_file_without_a_newline_is_read_in_bounded_memory(tmp_path):
    import tracemalloc

    p = tmp_path / "one-line.jsonl"
    with open(p, "wb") as f:
        for _ in range(64):
            f.write(b"a" * (1 << 20))  # 64 MiB, no newline
    tracemalloc.start()
    try:
        got = list(open_lines(str(p), chunk_bytes=1 << 20, max_line_bytes=4 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == 1 and len(got[0]) == 800 and peak < 16 << 20, peak


# NUL padding after a complete member/stream, as each format's reference tool judges it (checked
# by hand with xz 5.4.1, gzip 1.12, bzip2 1.0.8, zstd 1.5.4 `-t`): accepted, or rejected (None).
# gzip(1)/bzip2(1) ignore data after trailing zeros with a warning; we reject it (it may be a
# member they would drop). zstd(1) and xz on a legacy .lzma reject any padding.
_PAD = b"\0" * 4
PADDED = {
    ".jsonl.xz": {"end": _PAD, "end 8": _PAD * 2, "between": _PAD, "end 3": None, "between 5": None},
    ".jsonl.gz": {"end": b"\0" * 8, "end 1": b"\0", "end 3": b"\0" * 3, "between": None},
    ".jsonl.bz2": {"end": b"\0" * 8, "end 3": b"\0" * 3, "between": None},
    ".jsonl.zst": {"end": None, "between": None},
    ".jsonl.lzma": {"end": None, "between": None},
    ".jsonl.deflate": {"end": None},
}


@pytest.mark.parametrize("suffix, case", [(s, c) for s, cases in PADDED.items() for c in cases])
@pytest.mark.parametrize("chunk_bytes", [3, 4096])
def test_nul_padding_after_a_stream_is_read_as_its_reference_tool_reads_it(tmp_path, suffix, case, chunk_bytes):
    from pipelines.read import UnreadableFile

    compress = COMPRESSORS[suffix]
    first = b"".join(b'{"id": "%d", "text": "t"}\n' % i for i in range(50))
    second = b'{"id": "last", "text": "t"}\n'
    padding = PADDED[suffix][case]
    n = int(case.split()[1]) if " " in case else None
    pad = padding if padding is not None else b"\0" * (n or 4)
    blob = compress(first) + pad + (compress(second) if case.startswith("between") else b"")
    p = tmp_path / f"f{suffix}"
    p.write_bytes(blob)
    if padding is None:
        with pytest.raises(UnreadableFile, match="corrupt"):
            list(open_lines(str(p), chunk_bytes=chunk_bytes))
    else:
        lines = list(open_lines(str(p), chunk_bytes=chunk_bytes))
        assert len(lines) == 50 + case.startswith("between") and lines[49] == b'{"id": "49", "text": "t"}\n'


@pytest.mark.parametrize("suffix", [".jsonl.xz", ".jsonl.gz", ".jsonl.bz2"])
@pytest.mark.parametrize("tail", [b"junk", b"\0" * 4 + b"junk", b"\0" * 8 + b"\x01"])
def test_garbage_after_a_member_still_makes_the_file_unreadable(tmp_path, suffix, tail):
    from pipelines.read import UnreadableFile

    p = tmp_path / f"f{suffix}"
    p.write_bytes(COMPRESSORS[suffix](b'{"id": "1", "text": "t"}\n') + tail)
    with pytest.raises(UnreadableFile):
        list(open_lines(str(p), chunk_bytes=4096))
