"""Run one chapter outside JupyterLab, into a notebook with its outputs:

    .venv/bin/python lab/run_chapter.py book/06_gpu.md /tmp/06.ipynb

jupytext reads the chapter, and nbclient runs it in the chapter's folder,
where the chapters find their data, as the book build does. The kernel's
messages are encrypted (CurveZMQ, which pyzmq ships), so the kernel has no
warning about plain TCP to print; nothing is signed or checked for trust.
Write the notebook outside the repository: a .ipynb beside the .md would
give the book build two sources for one chapter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient


def run(chapter: Path, notebook: Path) -> None:
    """Execute ``chapter`` (MyST markdown) and write it to ``notebook``."""
    nb = jupytext.read(chapter)
    name = nb.metadata.get("kernelspec", {}).get("name", "python3")
    km = KernelManager(kernel_name=name, transport_encryption="auto")
    path = str(chapter.resolve().parent)
    client = NotebookClient(nb, km=km, resources={"metadata": {"path": path}})
    try:
        client.execute()
    finally:
        # Ours to stop (nbclient stops only a kernel it started itself).
        if km.has_kernel:
            km.shutdown_kernel()
    nbformat.write(nb, notebook)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    run(Path(sys.argv[1]), Path(sys.argv[2]))
