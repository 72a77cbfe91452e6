"""runtime/gc_pause.py: the collector is off inside the block and back on after it, also after an error."""

from __future__ import annotations

import gc

import pytest
from hetrun.runtime.gc_pause import collector_paused


def test_the_collector_is_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: the outer block keeps it off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("an import that fails")
    assert gc.isenabled()


def test_a_collector_already_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_then_freeze_leaves_the_start_unwalked_and_unfreezes_at_exit() -> None:
    """A rank's start (then_freeze): what its imports made is in the permanent generation
    after the block (no collection walks it), and it is unfrozen at exit, so the shutdown
    collects it: no "leaked" warnings from triton's bindings (which torch._dynamo imports)."""
    import subprocess
    import sys

    code = (
        "import gc\n"
        "from hetrun.runtime.gc_pause import collector_paused\n"
        "with collector_paused(then_freeze=True):\n"
        "    import torch, torch._dynamo\n"
        "    with collector_paused(then_freeze=True):\n"
        "        pass\n"
        "    assert gc.get_freeze_count() == 0, 'frozen by the nested block'\n"
        "assert gc.isenabled()\n"
        "print('frozen', gc.get_freeze_count())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > 100_000, proc.stdout
    assert "leaked" not in proc.stderr, proc.stderr[:2000]
