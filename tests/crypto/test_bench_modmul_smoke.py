"""scripts/bench_modmul.py at a tiny size: every arm runs in its own process with the arithmetic it names (or says
why it cannot), the reference harness builds and its two libraries are found, and the table renders from the
results file.  (A smoke test: no timing is asserted; the figures come from the full run.)"""
import json
import subprocess
import sys
from pathlib import Path

from flare_helpers import load_script

REPO = Path(__file__).resolve().parents[2]
bench = load_script("scripts/bench_modmul.py", "bench_modmul")


def test_every_arm_measures_its_own_arithmetic(tmp_path):
    out = tmp_path / "modmul.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts/bench_modmul.py"), "--repeats", "1", "--ops", "600",
                           "--bits", "1024", "--no-docs", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    rows = {r["arm"]: r for r in res["rows"]}
    assert set(rows) == set(bench.ARMS) and res["settings"]["cpu"] == bench.cpu_model()
    ran = {a for a, r in rows.items() if "unavailable" not in r}
    # the Python path, the portable kernel and both reference libraries run on any 64-bit Linux with a compiler
    # (the references' own results are checked against Python's: a wrong call into a library is "unavailable")
    assert {"gmpy2", "portable", "portable-c", "gmp-mpn", "openssl"} <= ran, \
        {a: rows[a].get("unavailable") for a in rows}
    assert rows["portable"]["kernel"].startswith("on (portable")
    assert rows["portable-c"]["kernel"].startswith("on (portable 64-bit C;")      # the assembly switched off
    has_ifma = "with AVX-512 IFMA" in bench.cpu_model()
    assert ("ifma" in ran) == has_ifma
    if has_ifma:
        assert rows["ifma"]["kernel"] == "on (AVX-512 IFMA)"
    for a in ran:
        assert 0 < rows[a]["product_us"] < 1e4 and 0 < rows[a]["squaring_us"] < 1e4
    page = bench.render(res)
    assert "| gmpy2 from Python" in page and "1.00, 1.00" in page and "0.4x gmpy2's" in page
    assert page.count("\n|") == 2 + len(bench.ARMS)
