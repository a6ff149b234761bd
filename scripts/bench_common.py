"""What every benchmark script shares (not shipped in the package): the settings recorded beside each figure, and
the docs blocks the scripts own."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from treeflare.files import write_text_atomic


def bench_settings(**extra) -> dict:
    """What a benchmark figure depends on, recorded beside it: load average, cores, time, commit, plus ``extra``
    (seeds, randomness, repeats)."""
    import datetime
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "loadavg": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(), "commit": commit, **extra}


def cpu_model() -> str:
    """The CPU's model name, its architecture and whether it has AVX-512 IFMA (recorded in every row)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(("model name", "Model"))), "")
    flags = next((ln for ln in lines if ln.startswith(("flags", "Features"))), "")
    return (f"{name or platform.processor() or 'unknown CPU'} ({platform.machine()}, "
            f"{'with' if ' avx512ifma' in flags else 'without'} AVX-512 IFMA)")


def write_bench_block(path, name: str, markdown: str) -> Path:
    """Replace the text between ``<!-- bench:NAME:start -->`` and ``<!-- bench:NAME:end -->`` in the page ``path``.

    Benchmark scripts own these blocks, so a figure in the docs is always the one the script wrote. A page without
    both markers (in that order) is refused with a ValueError naming the page and the marker, and left unchanged:
    a block moved to another page must take its script's target with it (``tests/package/test_docs.py`` checks both).
    """
    path = Path(path)
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the page for bench block {name!r}: {exc.strerror}") from None
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    if i < 0 or j < 0:
        missing = start if i < 0 else end
        raise ValueError(f"{path}: no {missing!r} marker; not writing bench block {name!r}")
    write_text_atomic(path, text[: i + len(start)] + "\n" + markdown.strip("\n") + "\n" + text[j:])
    return path
