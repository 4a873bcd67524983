"""The CI entry point is a script a machine runs unattended: check it parses and
does what the README promises (``make test``), so a bad edit fails here first."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / ".ci" / "run"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_ci_script_parses():
    result = subprocess.run(["bash", "-n", str(CI)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_ci_script_is_executable_and_ends_in_make_test():
    assert CI.stat().st_mode & 0o111, ".ci/run must be executable"
    lines = [ln.strip() for ln in CI.read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    assert commands[0] == "set -euo pipefail"
    assert commands[-1] == "make test"
    # Every backtick opened in a comment is closed on the same line.
    assert all(ln.count("`") % 2 == 0 for ln in lines)
