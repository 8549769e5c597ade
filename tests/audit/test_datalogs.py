"""The run check's log reader: blocks of lines read at once and hosts merged a window of steps at a
time give exactly the steps, replay verdicts and errors of reading every line with the contract's
reader, whatever the logs hold and wherever the block and window boundaries fall."""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import os
import random

import numpy as np
import pytest

from audit import datalogs
from audit.checks import MAX_LISTED_FAILURES
from contract import JsonLinesError, data_log_name, data_log_row, iter_data_log


def reference(groups: dict[int, dict[int, str]]) -> tuple[list[tuple], list[str], int]:
    """The logs read line by line with the contract's reader, all in memory: (steps as (step,
    host_counts, hosts, index, example)), replay failures, replays). A step logged again is
    compared with its previous logging and skipped, as is any step not above the host's last (a
    failure when the step is logged only once: the log is out of order)."""
    lines, failures, replays = [], [], 0
    for H, paths in sorted(groups.items()):
        for h, path in sorted(paths.items()):
            previous: dict[int, str] = {}
            last = -1
            times = collections.Counter(row["step"] for _, row in iter_data_log(path))
            for lineno, row in iter_data_log(path):
                s, text = row["step"], json.dumps([row["index"], row["example"]])
                if s <= last and times[s] == 1:
                    failures.append(datalogs.out_of_order(h, s, last, path, lineno))
                if s in previous:
                    replays += 1
                    if previous[s] != text:
                        failures.append(
                            f"host {h} logged step {s} twice with different examples ({path}:{lineno}): "
                            f"a resume did not reproduce the data stream"
                        )
                previous[s] = text
                if s > last:
                    last = s
                    lines.append((s, H, h, row["index"], row["example"]))
    failures.sort()  # (found in another order: by window of steps, not host after host)
    lines.sort(key=lambda x: x[:3])
    steps = []
    for s, same in itertools.groupby(lines, key=lambda x: x[0]):
        same = list(same)
        top = max(x[1] for x in same)
        mine = [x for x in same if x[1] == top]
        steps.append((s, sorted({x[1] for x in same}), [(x[2], x[3], x[4]) for x in mine]))
    return steps, failures, replays


def read(groups: dict[int, dict[int, str]], width: int) -> tuple[list[tuple], list[str], int]:
    replays = datalogs.Replays()
    steps = []
    for st in datalogs.stream_steps(groups, replays, width):
        uniq, first, count = np.unique(st.index, return_index=True, return_counts=True)
        assert np.array_equal(st.uniq, uniq) and np.array_equal(st.first, first) and np.array_equal(st.count, count)
        assert st.owner.tolist() == np.repeat(st.hosts, st.sizes).tolist() and st.host_counts[-1] == st.H
        assert [(h, i.tolist(), e.tolist()) for h, i, e in st.group] == [
            (h, i.tolist(), e.tolist())
            for h, i, e in zip(
                st.hosts.tolist(),
                np.split(st.index, np.cumsum(st.sizes)[:-1]),
                np.split(st.example, np.cumsum(st.sizes)[:-1]),
            )
        ]
        group = [
            (h, i.tolist(), e.tolist()) for h, i, e in st.group
        ]  # each line as logged, not only their concatenation
        assert st.hosts.tolist() == [h for h, _, _ in group] and st.index.tolist() == [
            p for _, i, _ in group for p in i
        ]
        assert st.example.tolist() == [x for _, _, e in group for x in e]
        assert st.owner.tolist() == [h for h, i, _ in group for _ in i]
        steps.append((st.step, st.host_counts, group))
    return steps, (replays.f.count, sorted(replays.f.items)), replays.count


def outcome(fn, *args):
    try:
        return fn(*args)
    except JsonLinesError as e:
        return f"error: {e}"


def file_errors(groups: dict[int, dict[int, str]]) -> set[str]:
    errors = set()
    for paths in groups.values():
        for path in paths.values():
            try:
                list(iter_data_log(path))
            except JsonLinesError as e:
                errors.add(f"error: {e}")
    return errors


def write_logs(root: str, rng: random.Random, variant: str) -> dict[int, dict[int, str]]:
    """A run's data logs: one or two topologies, G positions per step, with the variant's damage."""
    G = rng.choice([4, 8, 12])
    topologies = [(rng.choice([h for h in (1, 2, 4) if G % h == 0]), 0, rng.randint(3, 40))]
    if rng.random() < 0.5:  # an elastic restart: another host count from the next step on
        first = topologies[0][2]
        if variant == "overlap":  # the old topology's logs not cut back: some steps logged by both
            first -= rng.randint(1, topologies[0][2])
        H2 = rng.choice([h for h in (1, 2, 3, 4) if G % h == 0 and h != topologies[0][0]])
        topologies.append((H2, first, topologies[0][2] + rng.randint(1, 30)))
    os.makedirs(root, exist_ok=True)
    groups: dict[int, dict[int, str]] = {}
    for H, first, end in topologies:
        k = G // H
        for h in range(H):
            rows = []
            for s in range(first, end):
                index = [s * G + h * k + j for j in range(k)]
                example = [(p * 7919) % 1000 + (1 << 40) for p in index]
                if variant == "big numbers" and rng.random() < 0.1:  # 19 digits, below 2^63
                    example = [(1 << 63) - 1 - e for e in example]
                if variant == "empty lines" and rng.random() < 0.1:
                    index, example = [], []
                rows.append(data_log_row(s, index, example))
            if variant == "gaps" and rows:
                del rows[rng.randrange(len(rows))]
            if variant == "replays" and len(rows) > 3:  # a resume: a run of steps logged again
                a = rng.randrange(len(rows) - 2)
                again = [dict(r) for r in rows[a : a + rng.randint(1, 3)]]
                if rng.random() < 0.4:
                    again[-1] = dict(again[-1], example=[e + 1 for e in again[-1]["example"]])
                cut = rng.randrange(a + 1, len(rows))
                rows = rows[:cut] + again + rows[cut:]
            if variant == "disorder" and len(rows) > 2:  # a step logged once, out of order
                j = rng.randrange(1, len(rows))
                rows.insert(rng.randrange(j), rows.pop(j))
            if variant == "reversed" and rng.random() < 0.5:  # a host's lines in reverse order
                rows.reverse()
            if variant == "sizes" and rows:  # a line with another number of positions
                j = rng.randrange(len(rows))
                rows[j] = dict(rows[j], index=rows[j]["index"][:1], example=rows[j]["example"][:1])
            text = [json.dumps(r) for r in rows]
            if variant == "formats" and text:
                j = rng.randrange(len(text))
                text[j] = rng.choice([json.dumps(rows[j], separators=(",", ":")), "", "  " + text[j], text[j] + "\r"])
            if variant == "broken" and text:
                j = rng.randrange(len(text))
                text[j] = rng.choice([text[j][:-3], text[j].replace('"step": ', '"step": 0'), "[1, 2]", '{"step": -1}'])
            if variant == "zero steps" and text:
                text[0] = text[0].replace('"step": ', '"step": 0', 1) if rng.random() < 0.5 else text[0]
            end_nl = "\n" if variant != "no final newline" else ""
            path = os.path.join(root, data_log_name(h, H))
            with open(path, "w") as f:
                f.write("\n".join(text) + (end_nl if text else ""))
            groups.setdefault(H, {})[h] = path
    return groups


VARIANTS = [
    "clean",
    "gaps",
    "replays",
    "disorder",
    "sizes",
    "formats",
    "broken",
    "zero steps",
    "no final newline",
    "overlap",
    "big numbers",
    "empty lines",
    "reversed",
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_merged_stream_is_the_contract_readers_whatever_the_logs_hold(tmp_path, monkeypatch, variant):
    rng = random.Random(hashlib.sha256(variant.encode()).digest())
    for case in range(12):
        groups = write_logs(str(tmp_path / str(case)), rng, variant)
        want = outcome(reference, groups)
        for block, width in ((1 << 16, 256), (rng.randint(1, 400), rng.randint(1, 9))):
            monkeypatch.setattr(datalogs, "_BLOCK", block)
            got = outcome(read, groups, width)
            if isinstance(want, str):  # a broken log: the error of one broken file, whichever is read first
                assert got in file_errors(groups), (variant, case, block, width, got)
            else:  # the same steps and replays; every failure counted, the first ones listed
                assert got[0] == want[0] and got[2] == want[2], (variant, case, block, width)
                count, listed = got[1]
                assert count == len(want[1]) and set(listed) <= set(want[1]), (variant, case, block, width)
                assert len(listed) == min(count, MAX_LISTED_FAILURES)


def test_a_block_is_read_at_once_only_in_the_trainers_exact_form():
    rows = [data_log_row(s, [2 * s, 2 * s + 1], [(3 << 40) + s, s]) for s in range(5)]
    block = "".join(json.dumps(r) + "\n" for r in rows).encode()
    steps, index, example = datalogs.parse_block(block)
    assert steps.tolist() == list(range(5))
    assert index.tolist() == [r["index"] for r in rows] and example.tolist() == [r["example"] for r in rows]
    for other in (
        block[:-1],  # no final newline
        block.replace(b"[0, 1]", b"[00, 1]"),  # a leading zero: not JSON
        block.replace(b'"step": 4', b'"step": 9223372036854775807'),  # 19 digits: read line by line
        block.replace(b'"step": 4', b'"step": 99999999999999999999'),  # past int64
        block.replace(b"[8, 9]", b"[8]"),  # another number of positions
        block.replace(b"\n", b"\r\n", 1),
        block.replace(b", ", b",", 1),
        b"\n" + block,
        b'{"step": 0, "index": [], "example": []}\n',
    ):
        assert datalogs.parse_block(other) is None, other
