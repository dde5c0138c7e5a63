"""A native crash of ``inorder run``'s process leaves every thread's Python stack in the run log."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from inorder.checkpoint.names import RUN_LOG_FILE


def test_a_segfault_writes_the_stacks_into_the_run_log(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    code = (
        "import os, signal, sys\n"
        "from inorder.commands.run import _record_crashes\n"
        "_record_crashes(sys.argv[1], 'job')\n"
        "def crash_here():\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "crash_here()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(checkpoint)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGSEGV
    log = (checkpoint / RUN_LOG_FILE).read_text()
    assert "Segmentation fault" in log and "crash_here" in log, log
    assert done.stderr == "", done.stderr  # the terminal gets nothing from it
