"""`hetrun report --html FILE`: one self-contained file, well-formed inline SVG, nothing executable.
(Opened in a real headless browser by tests/test_report_browser.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

from test_report_render import _recorded_run


def test_html_report_is_self_contained_svg_and_escapes_names(tmp_path: Path) -> None:
    run_dir = _recorded_run(tmp_path)
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run, "name": "<script>alert(1)</script>"}))
    out_file = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir), "--html", str(out_file)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    html = out_file.read_text()
    assert "<script" not in html and "&lt;script&gt;" in html
    assert not re.search(r"(src|href)=", html)  # loads nothing from anywhere
    svgs = re.findall(r"<svg.*?</svg>", html, re.S)
    assert len(svgs) == 3 and "no checkpoints in the store" in html  # timeline, busy ranks, throughput
    assert "no resource samples" in html  # the utilization section says why it is empty
    for svg in svgs:
        xml.dom.minidom.parseString(svg)  # well-formed
    timeline = svgs[0]
    assert timeline.count("<rect") >= 3 and "2 rollout" in timeline and "restore at" in timeline
    assert "failed" in html and "learner: restored at step 2" in html
