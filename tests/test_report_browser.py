"""`hetrun report --html` of a real local run opened in a real headless browser (Debian's chromium):
the page renders (a screenshot that is not one colour), the DOM chromium built holds the four plots
(timeline, throughput, utilization, checkpoint sizes) and the console shows no script errors; `--png DIR`
draws each plot with chromium, and says what to install without it."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from conftest import in_ci
from hetrun.slurm_plugin.backends.local import LocalBackend
from hetrun.slurm_plugin.submit import wait_for_end
from test_report_render import _recorded_run
from test_status_watch import _probe_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _need_chromium() -> None:
    if CHROMIUM is None:
        if in_ci():
            pytest.fail("chromium is missing (scripts/setup.sh installs it); not skipping in CI", pytrace=False)
        pytest.skip("needs Debian's chromium (apt-get install chromium; scripts/setup.sh installs it)")


def _png_colours(path: Path) -> set[bytes]:
    """The distinct pixels of an 8-bit RGB/RGBA PNG (chromium's screenshots), decoded with zlib alone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 0
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + size
    raw, stride, prev, colours = zlib.decompress(idat), width * bpp, bytearray(width * bpp), set()
    for y in range(height):
        filt, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # undo the PNG row filter
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pred = (0, a, b, (a + b) // 2,
                    a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else (b if abs(p - b) <= abs(p - c)
                                                                                      else c))[filt]
            line[i] = (line[i] + pred) & 0xFF
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return colours


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", *args], capture_output=True, text=True, timeout=120)  # type: ignore[list-item]


@pytest.mark.slow
def test_html_report_of_a_real_run_renders_in_chromium(tmp_path: Path) -> None:
    _need_chromium()
    res = _probe_run(tmp_path, iterations=12, sleep=0.1, env={"HETRUN_SAMPLE_S": "0.2"})
    run_dir = res.run.run_dir  # type: ignore[attr-defined]
    wait_for_end(res.run, LocalBackend(), timeout_s=180, poll_s=0.5)  # type: ignore[attr-defined]
    page = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir), "--html", str(page)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr

    shot = tmp_path / "report.png"
    # One chromium draws the screenshot and prints the DOM it built (a launch is seconds).
    dom = _chromium(f"--screenshot={shot}", "--dump-dom", "--window-size=1200,1600", page.as_uri())
    assert shot.exists(), dom.stderr
    assert len(_png_colours(shot)) > 5, "the screenshot is blank"
    assert dom.returncode == 0, dom.stderr
    for plot in ("timeline", "throughput", "utilization", "checkpoints"):
        assert f'<svg xmlns="http://www.w3.org/2000/svg" class="{plot}"' in dom.stdout, (plot, dom.stdout[:3000])
    assert dom.stdout.count("<rect") > 10  # the timeline's and checkpoints' bars are in the rendered DOM
    charts = dom.stdout.split('<svg xmlns="http://www.w3.org/2000/svg" class="')[1:]
    for svg in charts:  # issue 24: every chart of a real run, utilization and checkpoints too, has titled axes
        svg = svg[:svg.index("</svg>")]
        assert 'class="axis-x"' in svg and 'class="axis-y"' in svg, svg[:200]
    assert {svg.split('"')[0] for svg in charts} >= {"timeline", "busy", "throughput", "utilization", "checkpoints"}
    bad = [ln for ln in dom.stderr.splitlines() if "Uncaught" in ln or "ERROR:CONSOLE" in ln]
    assert not bad, bad

    pngs = tmp_path / "png"
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir), "--png", str(pngs)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in pngs.iterdir())
    assert names == sorted(f"{p}.png" for p in ("timeline", "busy", "throughput", "utilization", "checkpoints"))
    for png in pngs.iterdir():
        assert len(_png_colours(png)) > 2, f"{png.name} is blank"


def test_png_without_chromium_names_what_to_install(tmp_path: Path) -> None:
    run_dir = _recorded_run(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir), "--png", str(tmp_path / "p")],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": "/nonexistent"})
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--png needs a headless chromium" in out.stderr and "apt-get install chromium" in out.stderr, out.stderr


def test_html_report_shows_the_return_and_loss_curves_with_labelled_axes(tmp_path: Path) -> None:
    """Issue 24: the first thing an RL user looks for, the return over time, and the loss; every
    chart with both axes titled (units included), as chromium builds the page."""
    _need_chromium()
    import json

    from test_report_restarts import RunWriter

    w = RunWriter(tmp_path / "run")
    t = w.attempt(0, 1000, range(0, 6))
    for i in range(6):  # an evaluation every iteration, a loss from the learner's update
        w.ev(ev="action", type="eval", id="eval", iteration=i, rank=0, component="learner", node="n1",
             start=1002 + 10 * i, end=1003 + 10 * i, metrics={"eval_return_mean": 20.0 + 30 * i})
        w.ev(ev="action", type="optimize", id="optimize", iteration=i, rank=0, component="learner", node="n1",
             start=1003 + 10 * i, end=1004 + 10 * i, part_of="x", metrics={"loss": 1.0 / (i + 1)})
    w.exits(t)
    w.end(0, t + 1, "done", requeued=False)
    page = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(w.dir), "--html", str(page)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    dom = _chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    assert html.index("Result over time") < html.index("Timeline per rank")  # the outcome first
    for curve, title in (("eval.eval_return_mean", "eval_return_mean (action eval)"),
                         ("optimize.loss", "loss (action optimize)")):
        start = html.index(f'class="result_{curve.replace(".", "_")}"')
        svg = html[start:html.index("</svg>", start)]
        assert svg.count(",") >= 6 and "<polyline" in svg, svg  # six points on the line
        assert 'class="axis-y"' in svg and title in svg and "time since the run's first event (s)" in svg, svg
    charts = html.split('<svg xmlns="http://www.w3.org/2000/svg" class="')[1:]
    assert len(charts) == 5  # 2 curves, timeline, busy ranks, throughput (no samples, no store here)
    for svg in charts:  # every chart: x and y axes titled
        svg = svg[:svg.index("</svg>")]
        assert 'class="axis-x"' in svg and 'class="axis-y"' in svg, svg[:200]
    doc = json.loads(subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(w.dir), "--json"],
                                    capture_output=True, text=True, timeout=120).stdout)
    assert [p[2] for p in doc["curves"]["eval.eval_return_mean"]["points"]] == [20.0, 50.0, 80.0, 110.0, 140.0, 170.0]
