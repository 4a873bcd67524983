"""JupyterLab's server as `make lab` runs it (JUPYTER_CONFIG_PATH=lab).

* It serves the repository, with the file browser opened in book/, so that
  jupytext finds the repository's jupytext.toml as its command line does.
* Chapters are saved by lab/chapter_files.py: a chapter that was only opened
  and run is never written; an edit changes only the edited cells' lines.
* lab/custom/custom.css adjusts how jupyterlab-myst shows some of the book's
  MyST (see that file).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from chapter_files import ChapterContentsManager  # noqa: E402

c = get_config()  # noqa: F821 (provided by Jupyter when it reads this file)
c.ServerApp.root_dir = str(HERE.parent)
c.ServerApp.contents_manager_class = ChapterContentsManager
c.ContentsManager.preferred_dir = "book"
c.LabApp.custom_css = True
# Not a configurable trait: set in the web application's settings instead.
c.ServerApp.tornado_settings = {"static_custom_path": [str(HERE / "custom")]}
# Kernels encrypt their messages (CurveZMQ, which pyzmq ships): no warning about
# plain TCP in the terminal.
c.KernelManager.transport_encryption = "auto"
