"""The optional C kernels (treeflare.crypto.native: fixed-base products, packing, segment products, secret
powers; AVX-512 IFMA and portable 64-bit) give exactly the integers of the gmpy2 arithmetic, and the package
falls back to that arithmetic whenever no kernel is usable.  Every arithmetic test runs on the kernel this
machine picks and on the portable one, forced (TREEFLARE_NATIVE=portable), so an IFMA machine checks both."""
import fnmatch
import functools
import os
import platform
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from gmpy2 import mpz

from treeflare.crypto import native
from treeflare.crypto.paillier import PaillierPrivateKey, _fixed_base_pow, _fixed_base_table

REPO = Path(__file__).resolve().parents[2]
ON_THIS_MACHINE = native.status().startswith("on")


@pytest.fixture(params=["picked", "portable"])
def any_kernel(request, monkeypatch):
    """The kernel this machine picks, then the portable one as TREEFLARE_NATIVE=portable picks it (the process's
    own kernel is restored afterwards): "ifma", "portable", or None where none is usable."""
    if request.param == "portable":
        monkeypatch.setenv("TREEFLARE_NATIVE", "portable")
        monkeypatch.setattr(native, "_LIB", None)
        monkeypatch.setattr(native, "_STATUS", "not loaded yet")
        assert native.status().startswith("on (portable") or not native.status().startswith("on")
    return native.kernel()


@pytest.fixture
def kern(any_kernel):
    """As any_kernel, skipped where that kernel is not usable."""
    if any_kernel is None:
        pytest.skip(f"C kernel not usable here: {native.status()}")
    return any_kernel


# ---- the C sources: real files, warning-free, shipped with the package (none of this runs the kernel)
PACKAGE = REPO / "custom" / "treeflare"
SOURCE_FILE = PACKAGE / "crypto" / "native" / native.loader.SOURCE_NAME
SOURCE_FILES = [SOURCE_FILE, PACKAGE / "crypto" / "native" / native.loader.PORTABLE_SOURCE_NAME]


def _c_compiler():
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(_c_compiler() is None, reason="no C compiler here")
@pytest.mark.parametrize("source", SOURCE_FILES, ids=lambda f: f.name)
def test_kernel_source_compiles_without_warnings(tmp_path, source):
    """Built with the flags the package uses, plus every -Wall -Wextra warning made an error (a full compile,
    not -fsyntax-only: some warnings only come from the optimiser); the portable one also as strict C99."""
    if source.name == native.loader.SOURCE_NAME and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the AVX-512 IFMA kernel is x86-64 only")
    extra = ["-std=c99", "-pedantic", "-Wno-pedantic"] if source != SOURCE_FILE else []
    cmd = [_c_compiler(), *native.loader.CFLAGS, *extra, "-Wall", "-Wextra", "-Werror", "-o",
           str(tmp_path / "k.so"), str(source)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert native.loader.source(source.name) == source.read_text(encoding="utf-8")


def test_every_data_file_of_the_package_is_declared_package_data():
    """A wheel built with setuptools carries only the package data pyproject.toml declares."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-data", {})
    data_files = [f for f in PACKAGE.rglob("*") if f.is_file() and f.suffix not in (".py", ".pyc")
                  and "__pycache__" not in f.parts]
    assert set(SOURCE_FILES) <= set(data_files)
    def covered(f) -> bool:  # a pattern of the file's package, or of a package above it with a path ("datasets/*/*")
        for key, patterns in declared.items():
            base = PACKAGE if key in ("*", "treeflare") else PACKAGE.joinpath(*key.split(".")[1:])
            if key == "*" or base in f.parents:
                rel = f.name if key == "*" else f.relative_to(base).as_posix()
                if any(fnmatch.fnmatch(rel, pattern) for pattern in patterns):
                    return True
        return False

    for f in data_files:
        assert covered(f), f"{f.relative_to(REPO)} is not declared in [tool.setuptools.package-data]"


def test_kernel_source_is_read_from_a_copied_package(tmp_path):
    """As in an exported job (the package copied into the app's custom/ folder, nothing installed), the loader
    finds its C source beside it."""
    custom = tmp_path / "custom"
    shutil.copytree(PACKAGE, custom / "treeflare", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    code = (f"import sys; sys.path.append({sysconfig.get_paths()['purelib']!r}); sys.path.insert(0, {str(custom)!r}); "
            "from treeflare.crypto.native import loader; "
            f"assert loader.__file__.startswith({str(custom)!r}), loader.__file__; print(len(loader.source()))")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout) == len(SOURCE_FILE.read_text(encoding="utf-8"))


def _table(bits: int, exp_bits: int):
    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)          # any odd modulus (Montgomery needs odd)
    base = mpz(secrets.randbelow(int(m) - 2) + 2)
    return _fixed_base_table(base, m, exp_bits), m


@pytest.mark.parametrize("bits,exp_bits", [(2048, 1024), (2047, 1024), (3072, 256), (4096, 2048), (4096, 256),
                                           (520, 256)])
def test_kernel_equals_python_product(kern, bits, exp_bits):
    tabs, m = _table(bits, exp_bits)
    nat = native.fixed_base(tabs, m, lambda e: _fixed_base_pow(tabs, e, m))
    assert nat is not None
    top = (1 << (8 * len(tabs))) - 1
    # edge digits (all 0, all 255, one digit set) and random exponents, a count that is not a multiple of 8 lanes
    exps = [0, top, 1, 255, 1 << (8 * len(tabs) - 1)] + [secrets.randbits(8 * len(tabs)) for _ in range(38)]
    assert nat.pow_many(exps) == [_fixed_base_pow(tabs, e, m) for e in exps]
    assert nat.pow_many([]) == []


def test_kernel_that_disagrees_is_not_used(kern, monkeypatch):
    tabs, m = _table(1024, 512)
    monkeypatch.setattr(native, "_STATUS", native._STATUS)
    assert native.fixed_base(tabs, m, lambda e: _fixed_base_pow(tabs, e, m) + 1) is None
    assert "disagreed" in native.status()


@pytest.mark.parametrize("obfuscation", ["full", "djn"])
def test_batch_encryption_decrypts_and_is_fresh(any_kernel, obfuscation):
    key = PaillierPrivateKey.generate(512, obfuscation)
    vals = [0, 1, -1, 2**100, -(2**200)] + list(range(60))
    cts = key.encrypt_many(vals)
    assert [key.decrypt(c) for c in cts] == vals
    assert len(set(cts)) == len(cts)
    assert len(set(key.encrypt_many([7] * 50))) == 50                 # fresh randomness for every ciphertext
    assert bool(key._native_tables()) == (any_kernel is not None)


def _status_in_subprocess(env_extra: dict) -> str:
    env = {**os.environ, **env_extra}
    code = ("from treeflare.crypto import native; from treeflare.crypto.paillier import PaillierPrivateKey as K; "
            "k = K.generate(256, 'full'); cs = k.encrypt_many(range(20)); "
            "assert [k.decrypt(c) for c in cs] == list(range(20)); print(native.status())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=REPO / "custom")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_switched_off_falls_back_to_python():
    assert _status_in_subprocess({"TREEFLARE_NATIVE": "0"}) == "off (TREEFLARE_NATIVE=0)"


def _has_adx() -> bool:
    """Whether this CPU has BMI2 and ADX (x86-64 only): the portable kernel's mulx/adcx/adox path."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    return platform.machine() in ("x86_64", "AMD64") and " bmi2" in flags and " adx" in flags


@pytest.mark.skipif(_c_compiler() is None, reason="no C compiler here")
def test_portable_kernel_forced_and_ifma_only(tmp_path):
    """TREEFLARE_NATIVE=portable runs the portable kernel on any CPU (IFMA or not), and says so; =ifma runs the
    IFMA kernel or none (never the portable one)."""
    cache = {"TREEFLARE_NATIVE_CACHE": str(tmp_path / "c")}
    assert _status_in_subprocess({"TREEFLARE_NATIVE": "portable", **cache}) == \
        f"on (portable 64-bit C{' with mulx/adcx/adox' if _has_adx() else ''}; TREEFLARE_NATIVE=portable)"
    assert _status_in_subprocess({"TREEFLARE_NATIVE": "portable", "TREEFLARE_PORTABLE_ADX": "0", **cache}) == \
        "on (portable 64-bit C; TREEFLARE_NATIVE=portable)"
    assert [f.name.split("_")[0] for f in (tmp_path / "c").iterdir()] == ["portable"]     # IFMA's not even built
    st = _status_in_subprocess({"TREEFLARE_NATIVE": "ifma", **cache})
    assert st == "on (AVX-512 IFMA)" or st.startswith("off:") and st.endswith("(TREEFLARE_NATIVE=ifma)")
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        assert (st == "on (AVX-512 IFMA)") == (" avx512ifma" in cpuinfo.read_text())


@pytest.mark.parametrize("value,mode", [(None, "auto"), ("1", "auto"), ("", "auto"), ("0", "off"), (" Off ", "off"),
                                        ("no", "off"), ("portable", "portable"), ("PORTABLE", "portable"),
                                        ("ifma", "ifma")])
def test_native_switch_values(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv("TREEFLARE_NATIVE", raising=False)
    else:
        monkeypatch.setenv("TREEFLARE_NATIVE", value)
    assert native._mode() == mode


def test_shared_cache_folder_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)                               # others could replace the library in it
    st = _status_in_subprocess({"TREEFLARE_NATIVE_CACHE": str(shared)})
    assert st.startswith("off") and "not private" in st
    assert not list(shared.iterdir())


def test_no_compiler_falls_back(tmp_path):
    st = _status_in_subprocess({"CC": str(tmp_path / "no-such-cc"), "TREEFLARE_NATIVE_CACHE": str(tmp_path / "c")})
    assert st.startswith("off")


# ---- the cache: no other user can replace the library between its check and its load (tests run as root here,
# which bypasses permission checks, so these set owners and modes and check the logic, not EACCES)
OTHER_ID = 65534                                      # "nobody": another user and another group
KERNELS = ("fixed_base_*.so", "portable_*.so")       # the libraries the package builds


def kernel_ran(st: str) -> bool:
    """Whether a status says a library was built or loaded and ran (IFMA, or portable on a CPU without it)."""
    return st.startswith(("on (AVX-512 IFMA)", "on (portable"))
as_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")


@pytest.fixture
def fresh_kernel(monkeypatch):
    """The kernel as if not loaded yet in this process (the loaded one is restored afterwards)."""
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(native, "_STATUS", "not loaded yet")


@pytest.fixture(scope="module")
def built_library(tmp_path_factory) -> Path:
    """One library built by the package (in a subprocess), copied into the tests' caches."""
    cache = tmp_path_factory.mktemp("built") / "cache"
    st = _status_in_subprocess({"TREEFLARE_NATIVE_CACHE": str(cache)})
    assert kernel_ran(st)
    (lib,) = cache.glob(KERNELS[0] if st == "on (AVX-512 IFMA)" else KERNELS[1])     # the one in use
    return lib


def _cache_with(tmp_path, monkeypatch, built_library) -> Path:
    """A private cache folder holding a copy of the built library under its own name."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / built_library.name).write_bytes(built_library.read_bytes())
    (cache / built_library.name).chmod(0o500)
    monkeypatch.setenv("TREEFLARE_NATIVE_CACHE", str(cache))
    return cache


def _make_unsafe(folder: Path, how: str) -> None:
    if how == "other-writable":
        folder.chmod(0o777)
    elif how == "group-writable by another group":
        os.chown(folder, -1, OTHER_ID)
        folder.chmod(0o775)
    elif how == "another user's":
        os.chown(folder, OTHER_ID, -1)
        folder.chmod(0o755)
    elif how == "another user's, in a sticky folder":      # made first in a /tmp-like folder by someone else
        folder.parent.chmod(0o1777)
        os.chown(folder, OTHER_ID, OTHER_ID)
        folder.chmod(0o755)


@pytest.mark.parametrize("how", ["other-writable", pytest.param("group-writable by another group", marks=as_root),
                                 pytest.param("another user's", marks=as_root),
                                 pytest.param("another user's, in a sticky folder", marks=as_root)])
@pytest.mark.parametrize("below", ["cache", "a/b/cache"])
def test_cache_below_a_folder_others_can_change_is_refused(tmp_path, monkeypatch, fresh_kernel, how, below):
    unsafe = tmp_path / "parent" / "unsafe"
    unsafe.mkdir(parents=True)
    cache = unsafe / below
    if below != "cache":
        cache.mkdir(parents=True, mode=0o700)         # private folders under the unsafe one: every level is walked
        for folder in (cache, cache.parent, cache.parent.parent):
            folder.chmod(0o700)
    _make_unsafe(unsafe, how)
    monkeypatch.setenv("TREEFLARE_NATIVE_CACHE", str(cache))
    with pytest.raises(OSError, match="native cache refused: a folder on its path"):
        native.loader._cache_dir()
    st = native.status()
    assert st.startswith("off: OSError: native cache refused") and str(tmp_path) not in st
    if below == "cache":
        assert not list(unsafe.iterdir())             # nothing made in a folder others can change


def test_cache_below_a_sticky_folder_is_accepted_and_built_atomically(tmp_path, monkeypatch, fresh_kernel):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)                              # like /tmp: others write here but cannot rename our entries
    cache = sticky / "me" / "cache"
    monkeypatch.setenv("TREEFLARE_NATIVE_CACHE", str(cache))
    assert native.loader._cache_dir() == cache.resolve()
    assert stat.S_IMODE(cache.stat().st_mode) == stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    real_run, outputs = subprocess.run, []

    def compile_run(cmd, *args, **kwargs):            # while compiling, the library's own name is not there yet
        outputs.append(Path(cmd[cmd.index("-o") + 1]))
        assert not [f for k in KERNELS for f in cache.glob(k)]
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", compile_run)
    assert kernel_ran(native.status())
    libs = list(cache.iterdir())                      # no source or half-written library left behind
    assert libs and all(lib.name.startswith(("fixed_base_", "portable_")) and lib.suffix == ".so"
                        and stat.S_IMODE(lib.lstat().st_mode) == 0o500 for lib in libs)
    assert {out.parent for out in outputs} == {cache.resolve()} and len(outputs) == len(libs)
    assert not {out.name for out in outputs} & {lib.name for lib in libs}


def test_cache_below_a_folder_writable_by_the_users_own_group_is_accepted(tmp_path, monkeypatch):
    import grp
    import pwd

    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid())
    if group.gr_name != user or set(group.gr_mem) - {user}:
        pytest.skip("this user's primary group is not its own private group")
    shared_with_self = tmp_path / "ours"
    shared_with_self.mkdir()
    os.chown(shared_with_self, -1, os.getgid())
    shared_with_self.chmod(0o775)                     # umask 002 with user private groups: nobody else is in it
    monkeypatch.setenv("TREEFLARE_NATIVE_CACHE", str(shared_with_self / "cache"))
    assert native.loader._cache_dir() == (shared_with_self / "cache").resolve()


def test_symlinked_library_is_refused(tmp_path, monkeypatch, fresh_kernel, built_library):
    cache = _cache_with(tmp_path, monkeypatch, built_library)
    lib = cache / built_library.name
    lib.rename(cache / "elsewhere.so")                # ours, private, a good library: only the link is wrong
    lib.symlink_to("elsewhere.so")
    assert native.status() == "off: OSError: native cache library is a symbolic link"


@pytest.mark.parametrize("how", [pytest.param("another user's", marks=as_root), "group-writable"])
def test_library_others_can_write_is_refused(tmp_path, monkeypatch, fresh_kernel, built_library, how):
    lib = _cache_with(tmp_path, monkeypatch, built_library) / built_library.name
    if how == "another user's":
        os.chown(lib, OTHER_ID, -1)
    else:
        lib.chmod(0o570)
    assert native.status() == "off: OSError: native cache library is not private to this user"


@pytest.mark.parametrize("swap", ["another file", "a link to another file"])
def test_library_swapped_after_its_check_is_not_the_one_loaded(tmp_path, monkeypatch, fresh_kernel, built_library,
                                                               swap):
    import ctypes

    cache = _cache_with(tmp_path, monkeypatch, built_library)
    lib = cache / built_library.name
    checked_ino = lib.stat().st_ino
    real_cdll, loaded = ctypes.CDLL, {}

    def swap_then_load(name, *args, **kwargs):        # another user's rename lands between check and load
        bogus = cache / "bogus.so"
        bogus.write_bytes(b"\x7fELF not a library")
        lib.unlink()
        if swap == "another file":
            bogus.rename(lib)
        else:
            lib.symlink_to(bogus)
        loaded["ino"] = os.stat(name).st_ino          # what the loader is handed to open, after the swap
        return real_cdll(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", swap_then_load)
    assert kernel_ran(native.status())
    assert loaded["ino"] == checked_ino != lib.stat().st_ino


def _python_horner(group, widths, m):
    acc = mpz(group[-1])
    for c, w in zip(reversed(group[:-1]), reversed(widths[:-1])):
        acc = pow(acc, 1 << w, m) * c % m                  # shift the packed fields up, add the next one
    return acc


@pytest.mark.parametrize("bits", [1024, 4095, 4096, 6144, 8192])
def test_kernel_packing_equals_python(kern, bits):
    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)
    nat = native.products(m)
    assert nat is not None
    for widths in ([135] * 15, [17] * 24, [1, 2, 300], [64]):
        groups = [[secrets.randbelow(int(m)) for _ in widths] for _ in range(13)]      # 13: one full set of lanes + 5
        assert nat.horner_many(groups, widths) == [_python_horner(g, widths, m) for g in groups]
    with pytest.raises(ValueError, match="one value per width"):
        nat.horner_many([[1, 2]], [3, 4, 5])


def test_kernel_refuses_moduli_beyond_its_size(kern):
    m = mpz((1 << 8400) + 1)
    assert native.products(m) is None


@pytest.mark.parametrize("bits", [1024, 4096, 8192])
def test_kernel_segment_products_equal_gmpy2(kern, bits):
    import numpy as np

    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)
    nat = native.products(m)
    assert nat is not None
    rng = np.random.default_rng(bits)
    vals = [mpz(secrets.randbelow(int(m))) for _ in range(300)]
    table = nat.load(vals)
    lens = rng.integers(1, 40, size=37)                  # many lengths, so lanes finish at different times
    idx = rng.integers(0, len(vals), size=int(lens.sum())).astype(np.int32)
    starts = np.r_[0, np.cumsum(lens)].astype(np.int64)
    want = []
    for a, b in zip(starts[:-1], starts[1:]):
        acc = mpz(1)
        for i in idx[a:b]:
            acc = acc * vals[int(i)] % m
        want.append(acc)
    cells = nat.segment_products(table, idx, starts)
    assert nat.values(cells) == want
    # products of products stay in the kernel's form (cells -> bins)
    assert nat.values(nat.segment_products(cells, np.arange(len(want)), [0, len(want)])) == [
        functools.reduce(lambda x, y: x * y % m, want)]
    for bad_idx, bad_starts in (([len(vals)], [0, 1]), ([0, 1], [0, 0, 2]), ([-1], [0, 1])):
        with pytest.raises(ValueError, match="refused"):
            nat.segment_products(table, bad_idx, bad_starts)
    # segment bounds outside the index list are refused before the C code reads anything
    for bad_starts in ([-50_000_000, 2], [0, 50_000_000], [1, 2], [[0, 2]]):
        with pytest.raises(ValueError, match="segment starts"):
            nat.segment_products(table, [0, 1], bad_starts)


def test_kernel_refuses_values_and_widths_it_cannot_take(kern):
    m = mpz(secrets.randbits(1024) | (1 << 1023) | 1)
    nat = native.products(m)
    for bad in ([2 * m, 1], [-1, 1], [1 << 2000, 1]):
        with pytest.raises(ValueError, match="outside"):
            nat.horner_many([bad], [64, 64])
    for widths in ([-1, 64], [2**64, 64]):
        with pytest.raises(ValueError, match="widths"):
            nat.horner_many([[1, 2]], widths)


@pytest.mark.parametrize("bits", [2048, 3008, 3072, 4096])
@pytest.mark.parametrize("near", ["the top", "half"])
def test_kernel_moduli_that_fill_their_limbs(kern, bits, near):
    """The portable kernel gives a modulus no spare limb (m < 2^(64 L): 32 limbs for 2048 bits, 64 for 4096), so its
    products' results reach 2^(64 L) and take the masked subtraction of m, most often where m is near 2^(64 L):
    packing (squarings on both sides of its long-operand threshold, 48 limbs), segment products and secret powers
    still equal gmpy2's, inputs in [m, 2^(64 L)) included, and an input at 2^(64 L) or above is refused, never
    truncated."""
    import gmpy2
    import numpy as np

    m = mpz((1 << bits) - 2 * secrets.randbelow(1 << 40) - 1) if near == "the top" else \
        mpz((1 << (bits - 1)) + 2 * secrets.randbelow(1 << 40) + 1)
    nat = native.products(m)
    assert nat is not None
    if kern == "portable":
        assert nat.L == bits // 64 and nat.shift == bits
    R = mpz(1) << nat.shift
    high = [v for v in (m, m + 1, min(2 * m, R) - 1) if v < min(2 * m, R)]      # allowed: below 2m and below R
    vals = [mpz(secrets.randbelow(int(m))) for _ in range(21)] + high + [mpz(0), mpz(1), m - 1]
    widths = [139, 7, 64, 1, 139]
    groups = [vals[i:i + 5] for i in range(0, len(vals) - 4, 3)]
    want = []
    for gr in groups:
        acc = gr[-1] % m
        for c, w in zip(reversed(gr[:-1]), reversed(widths[:-1])):
            acc = gmpy2.powmod(acc, mpz(1) << w, m) * c % m
        want.append(acc)
    assert nat.horner_many(groups, widths) == want
    table = nat.load(vals)
    idx = np.random.default_rng(bits).integers(0, len(vals), size=400).astype(np.int32)
    starts = np.arange(0, 401, 40)
    prods = [functools.reduce(lambda x, y: x * y % m, (vals[i] for i in idx[a:b]), mpz(1))
             for a, b in zip(starts[:-1], starts[1:])]
    assert nat.values(nat.segment_products(table, idx, starts)) == prods
    e = mpz(secrets.randbits(bits // 2) | 1)
    ps = native.pow_sec(m, e)
    assert ps.pow_many(vals) == [gmpy2.powmod_sec(v % m, e, m) for v in vals]
    for bad in (R, R + 5, 2 * m):
        with pytest.raises(ValueError, match="outside"):
            nat.horner_many([[bad, 1]], [64, 64])


@pytest.mark.skipif(not _has_adx() or _c_compiler() is None, reason="no mulx/adcx/adox path on this CPU")
def test_portable_kernel_c_path_where_the_assembly_is_switched_off():
    """The portable kernel has two paths on x86-64 (mulx/adcx/adox assembly where the CPU has BMI2 and ADX, plain C
    elsewhere, as on aarch64); the tests in this file run the one this CPU picks, so the C path runs the arithmetic
    tests too, in a process with TREEFLARE_PORTABLE_ADX=0 (checked to take effect)."""
    env = {**os.environ, "TREEFLARE_NATIVE": "portable", "TREEFLARE_PORTABLE_ADX": "0"}
    assert _status_in_subprocess(env) == "on (portable 64-bit C; TREEFLARE_NATIVE=portable)"
    # products, packing (squarings) and secret powers at the carry edges and 2048-4096 bits, then longer chains
    # (the portable parameter would repeat the same kernel)
    picked = "(moduli_that_fill_their_limbs or segment_products_equal_gmpy2) and picked"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        __file__, "-k", picked], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout and " skipped" not in r.stdout, r.stdout[-500:]


@pytest.mark.parametrize("obfuscation", ["full", "djn"])
def test_batch_decryption_equals_one_by_one(any_kernel, obfuscation):
    key = PaillierPrivateKey.generate(512, obfuscation)
    vals = [0, 1, -1, 2**200, -(2**250)] + [secrets.randbits(300) - 2**299 for _ in range(30)]
    cts = key.encrypt_many(vals)
    assert key.decrypt_many(cts) == [key.decrypt(c) for c in cts] == vals
    assert bool(key._native_pow()) == (any_kernel is not None)
    with pytest.raises(ValueError):
        key.decrypt_many(cts[:3] + [key.public.nsq + 5])


@pytest.mark.parametrize("bits", [1024, 2048, 4096])
def test_kernel_secret_powers_equal_powmod_sec(kern, bits):
    import gmpy2

    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)
    for e in (mpz(1), mpz(16), mpz(secrets.randbits(bits // 2) | 1), m - 1):
        nat = native.pow_sec(m, e)
        assert nat is not None
        xs = [mpz(secrets.randbelow(int(m))) for _ in range(11)] + [mpz(0), mpz(1)]
        assert nat.pow_many(xs) == [gmpy2.powmod_sec(x, e, m) for x in xs]


def test_okamoto_uchiyama_moduli_in_the_kernel(any_kernel):
    """OU's three moduli (p^2 and q at the key holder, n for a passive party's products) are odd and of sizes
    that are not a multiple of 52 bits: the kernel's encryption, decryption and products equal Python's."""
    from treeflare.crypto.ou import OuPrivateKey

    key = OuPrivateKey.generate(2048)
    vals = [0, 1, -1, (1 << key.public.usable_bits) - 1] + [secrets.randbits(300) - 2**299 for _ in range(21)]
    py = OuPrivateKey.from_worker_state(key.worker_state())
    py.use_native = False
    cts = key.encrypt_many(vals)
    assert key.decrypt_many(cts) == py.decrypt_many(cts) == vals
    assert py.decrypt_many(py.encrypt_many(vals)) == vals
    on = any_kernel is not None
    assert bool(key._native_q_table()) == bool(key._native_pow()) == on
    assert all(bool(t) == on for t in key._native.values()) and key._native
    nat = native.products(key.public.n)
    assert (nat is not None) == on
    if nat is not None:
        import numpy as np

        table = nat.load(cts)
        want = functools.reduce(lambda x, y: x * y % key.public.n, cts)
        assert nat.values(nat.segment_products(table, np.arange(len(cts), dtype=np.int32), [0, len(cts)])) == [want]
        assert key.decrypt(want) == sum(vals)


def test_wire_form_loads_as_the_values_do_and_out_of_range_values_are_refused(kern, monkeypatch):
    """load_wire (a passive party's ciphertexts straight from the message) gives the table load gives, refuses 0,
    m and anything above it without converting a value to Python, and product multiplies the whole table."""
    m = (mpz(1) << 2047) + secrets.randbits(2046) * 2 + 1
    nat = native.products(m)
    width = 256
    vals = [secrets.randbelow(int(m) - 1) + 1 for _ in range(21)] + [1, int(m) - 1]
    raw = b"".join(int(v).to_bytes(width, "big") for v in vals)
    assert nat.load_wire(raw, width) == nat.load(vals)
    monkeypatch.setattr(native, "_WIRE_BLOCK", 4)          # block by block: the same table
    assert nat.load_wire(raw, width) == nat.load(vals)
    want = mpz(1)
    for v in vals:
        want = want * v % m
    assert nat.product(nat.load_wire(raw, width)) == want
    assert nat.load_wire(b"", width) == b"" and nat.product(b"") == 1
    for bad in (0, int(m), int(m) + 1, (1 << 2048) - 1):
        with pytest.raises(ValueError, match="outside"):
            nat.load_wire(raw[:width * 5] + bad.to_bytes(width, "big") + raw[width * 5:], width)
    with pytest.raises(ValueError, match="width"):
        nat.load_wire(raw[:-1], width)
