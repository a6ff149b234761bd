"""Run scripts/predict.py's ``main`` on many model files in ONE process, for tests that feed it hostile models.

    python tests/predict_worker.py CSV OUT MODEL...

Prints one JSON line ``{"start": model}`` before each model and ``{"model", "code", "stderr"}`` after it. A model
that crashes the process (SIGSEGV inside libxgboost) ends it: the caller sees the signal and the last model
started, so a crash is a test failure naming the file, not a crash of pytest.
"""

from __future__ import annotations

import importlib

import contextlib
import io
import json
import sys
import traceback




def main(csv: str, out: str, models: list[str]) -> None:
    predict = importlib.import_module("treeflare.tools.predict")
    report = sys.stdout
    for model in models:
        print(json.dumps({"start": model}), file=report, flush=True)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = predict.main(["--model", model, "--csv", csv, "--out", out])
            except SystemExit as exc:
                code = exc.code
            except BaseException:  # noqa: BLE001 (reported to the test, which fails on it)
                code = "raised"
                err.write(traceback.format_exc())
        print(json.dumps({"model": model, "code": code, "stderr": err.getvalue()}), file=report, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
