"""The client distribution's wheel, built from a copy of client/ and installed into a fresh
virtualenv with its dependencies (boto3, numpy) and nothing else: what a caller installs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install_client_wheel(work: Path) -> tuple[Path, Path]:
    """``(wheel, venv)`` under ``work``. The wheel is built from a copy: a build writes build/ and
    *.egg-info beside the sources, and tests on other workers build the same folder."""
    source = work / "client"
    shutil.copytree(ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(work / "dist"),
                    str(source)], capture_output=True, text=True, timeout=600, check=True)
    [wheel] = list((work / "dist").glob("triton_mme_client-*.whl"))
    venv = work / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
                              str(wheel)], capture_output=True, text=True, timeout=900, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    return wheel, venv
