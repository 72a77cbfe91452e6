"""The report's streaming parts: the event reader, interval unions, timeline buckets."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hetrun.reports.intervals import IntervalSet
from hetrun.reports.reader import EventStream
from hetrun.reports.run_report import build_report
from hetrun.reports.timeline import BUCKETS, Timeline


def test_reader_skips_corrupt_and_torn_lines_and_filters_kinds(tmp_path: Path) -> None:
    lines = ['{"ev":"start","rank":0,"time":1}', "not json", '[1, 2]',
             '{"ev": "attempt_end", "restart_count": 0, "outcome": "done", "t": 5}',
             '{"ev":"action","rank":0,"start":1,"end":2,"type":"x"}']
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + '\n{"ev":"act')
    s = EventStream(tmp_path)
    assert [e["ev"] for e in s] == ["start", "attempt_end", "action"]
    assert (s.lines, s.skipped) == (6, 3)
    only = EventStream(tmp_path, kinds=("start", "attempt_end"))
    assert [e["ev"] for e in only] == ["start", "attempt_end"]  # both spacings; "start" keys of actions not matched
    assert list(EventStream(tmp_path / "nowhere")) == []


def test_a_field_of_the_wrong_type_skips_that_line_not_the_report(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text(
        '{"ev":"start","rank":0,"component":"c","node":"n","time":1}\n'
        '{"ev":"action","rank":0,"component":"c","node":"n","type":"x","start":1,"end":2,"bytes":"many"}\n'
        '{"ev":"action","rank":0,"component":"c","node":"n","type":"x","start":2,"end":3,"bytes":5}\n')
    rep = build_report(tmp_path)
    assert rep.skipped_lines == 1 and rep.ranks[0].bytes == 5


def _brute(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_interval_set_equals_the_sorted_union(seed: int) -> None:
    rng = random.Random(seed)
    ivs = []
    for _ in range(300):
        a = rng.uniform(0, 100) if rng.random() < 0.3 else (ivs[-1][1] + rng.uniform(-1, 2) if ivs else 0.0)
        ivs.append((a, a + rng.uniform(0, 3)))
    s, t = IntervalSet(), IntervalSet()
    for a, b in ivs:
        s.add(a, b)
    other = [(x, x + 0.5) for x in range(0, 100, 3)]
    for a, b in other:
        t.add(a, b)
    want = _brute(ivs)
    assert list(zip(s.lo, s.hi, strict=True)) == pytest.approx(want)
    assert s.length() == pytest.approx(sum(b - a for a, b in want))
    brute_overlap = sum(max(0.0, min(b, d) - max(a, c)) for a, b in want for c, d in _brute(other))
    assert s.intersection(t) == pytest.approx(brute_overlap)


def test_timeline_keeps_busy_time_and_a_bounded_bucket_count() -> None:
    tl = Timeline(first_width_s=0.01)
    total = 0.0
    for i in range(5000):  # 5000 s of 0.4 s actions: the width doubles many times
        tl.add(0, "rollout" if i % 2 else "optimize", float(i), i + 0.4)
        total += 0.4
    tl.mark(0, "checkpoint", 2500.0)
    d = tl.to_dict()
    busy = d["ranks"]["0"]["busy"]
    assert d["buckets"] <= BUCKETS and all(len(v) == d["buckets"] for v in busy.values())
    assert sum(map(sum, busy.values())) == pytest.approx(total)
    assert d["bucket_s"] * BUCKETS >= 5000 > d["bucket_s"] * BUCKETS / 2
    assert d["ranks"]["0"]["marks"] == [[2500.0, "checkpoint"]]


def test_events_of_a_long_run_report_in_one_pass(tmp_path: Path) -> None:
    """Not a timing test: the counts of a 20k-event run come out right through the fast path."""
    with (tmp_path / "events.jsonl").open("w") as fh:
        for r in range(4):
            fh.write(json.dumps({"ev": "start", "rank": r, "component": "c", "node": "n", "time": 0.0,
                                 "restart_count": 0}) + "\n")
        for i in range(5000):
            for r in range(4):
                fh.write(json.dumps({"ev": "action", "rank": r, "component": "c", "node": "n", "type": "t",
                                     "iteration": i, "start": i, "end": i + 0.5, "bytes": 2}) + "\n")
    rep = build_report(tmp_path)
    (comp,) = rep.components
    assert (rep.actions, comp.iterations, comp.bytes) == (20000, 5000, 40000)
    assert comp.active_s == pytest.approx(2500) and comp.busy_s == pytest.approx(10000)
