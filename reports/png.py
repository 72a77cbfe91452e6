"""``hetrun report RUN --png DIR``: each plot of the HTML report as a PNG, drawn by headless chromium.

The plots are the same inline SVGs as ``--html`` (reports/html.py); each is
put alone on a white page and screenshotted at its own size, so the PNGs match
the HTML exactly and hetrun needs no plotting library. Without chromium the
option stops with an error naming what to install.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from hetrun.errors import HetrunError

_PLOT = re.compile(r'<svg xmlns="http://www.w3.org/2000/svg" class="(\w+)" width="(\d+)" height="(\d+)".*?</svg>',
                   re.S)


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise HetrunError("--png needs a headless chromium to draw the plots, and none is on PATH",
                          hint="apt-get install chromium (Debian), or use --html FILE (no browser needed)")
    return exe


def write_pngs(html: str, out_dir: Path) -> list[Path]:
    """``out_dir/<plot>.png`` for every plot in ``html`` (timeline, busy, throughput, utilization,
    checkpoints: those the run has data for); returns the files written."""
    exe = chromium()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for m in _PLOT.finditer(html):
        name, width, height = m.group(1), int(m.group(2)), int(m.group(3))
        page = out_dir / f"{name}.plot.html"
        page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
                        f'<body style="margin:0;overflow:hidden;background:#fff">{m.group(0)}</body></html>')
        png = out_dir / f"{name}.png"
        try:
            done = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                   f"--screenshot={png}", f"--window-size={width},{height}",
                                   page.resolve().as_uri()],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HetrunError(f"chromium could not draw {png}: {exc}", hint="run with --html FILE instead") from exc
        finally:
            page.unlink(missing_ok=True)
        if done.returncode != 0 or not png.is_file():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise HetrunError(f"chromium could not draw {png} (exit {done.returncode}): {tail}",
                              hint="run with --html FILE instead")
        written.append(png)
    return written
