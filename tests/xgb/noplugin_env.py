"""An XGBoost without the federated plugin, in a folder of its own (``.xgboost-noplugin/``, put first on
PYTHONPATH): the newest ``xgboost-cpu`` the registry serves this Python. XGBoost 3.4 removed the plugin from every
wheel, but needs Python >= 3.12; on 3.11 the newest is 3.2.0, whose ``xgboost-cpu`` wheel is built without it, so
the job meets the same missing plugin. Run as a script (``.ci/run`` does) or through :func:`ensure`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[2] / ".xgboost-noplugin"
PACKAGE = "xgboost-cpu"


def ensure() -> Path | None:
    """The folder, installed if missing (None when the registry cannot be reached)."""
    if (FOLDER / "xgboost" / "__init__.py").is_file():
        return FOLDER
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(FOLDER),
                           PACKAGE], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return None
    return FOLDER


if __name__ == "__main__":
    folder = ensure()
    if folder is None:
        print(f"warning: could not install {PACKAGE}; tests/xgb/test_xgb_no_plugin.py will install it or skip",
              file=sys.stderr)
    else:
        print(f"{PACKAGE} without the federated plugin in {folder}")
