"""Build, cache and load the C kernels (``fixed_base.c``, AVX-512 IFMA, and ``portable.c``, 64-bit limbs,
shipped beside this module) safely, each the same way.

A kernel runs inside the key holder, so no other user may be able to replace it.  It is compiled on first
use with the system C compiler into a private per-user cache folder (``$TREEFLARE_NATIVE_CACHE``, else
``$XDG_CACHE_HOME/treeflare``, else ``~/.cache/treeflare``), under a name made from the source's name and a hash
of the source, the compiler and its flags.  The folder must be this user's and writable by nobody else, no folder
above it may let another user rename its entries (:func:`_check_path`), and the library is opened without following links,
checked on its descriptor and loaded through that descriptor (``/proc/self/fd/N``).  The source that is hashed
is the text written for the compiler: what is compiled is what was hashed.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import stat
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

SOURCE_NAME = "fixed_base.c"          # the AVX-512 IFMA kernel
PORTABLE_SOURCE_NAME = "portable.c"   # the same functions on 64-bit limbs, any 64-bit CPU
CFLAGS = ("-O2", "-fPIC", "-shared")


def source(name: str = SOURCE_NAME) -> str:
    """A kernel's C source, read from the package's data (also inside a zip or an exported job)."""
    if name not in (SOURCE_NAME, PORTABLE_SOURCE_NAME):
        raise ValueError(f"no kernel source {name!r}")
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _cache_dir() -> Path:
    """The cache folder's real path, refused unless no other user can replace what is in it (see
    :func:`_check_path`); folders that do not exist yet are made private to this user."""
    base = os.environ.get("TREEFLARE_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "treeflare")
    path = Path(base).resolve()             # the real folder, checked and used from here on
    _check_path(path)                       # before anything is made under a folder others can change
    missing, p = [], path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass                            # a parallel worker made it: checked below like any other
    if path.resolve() != path:
        raise OSError("native cache refused: its path changed while it was made")
    _check_path(path)
    return path


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group (a user private group: the user's primary group, named after the
    user, listing no other member), so that its write bit lets nobody else in."""
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getgid() and group.gr_name == user and set(group.gr_mem) <= {user}


def _check_path(path: Path) -> None:
    """Every existing folder above the cache folder, up to /, must keep other users from renaming what is in it:
    a folder (not a link) owned by this user or root, and not writable by other users unless it has the sticky
    bit (like /tmp: then only an entry's owner may rename it, and every entry on the path is checked to be this
    user's or root's).  Group write counts as writable by others unless the group is this user's own."""
    uid = os.getuid()
    for folder in path.parents:
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            continue                        # made by us, private, in _cache_dir
        if not stat.S_ISDIR(st.st_mode):
            raise OSError("native cache refused: a folder on its path is a link or not a folder")
        if st.st_uid not in (0, uid):
            raise OSError("native cache refused: a folder on its path belongs to another user")
        others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid))
        if others_write and not st.st_mode & stat.S_ISVTX:
            raise OSError("native cache refused: a folder on its path can be written by other users and has "
                          "no sticky bit")


def _check_private(st: os.stat_result, kind, what: str) -> None:
    """A library loaded from a place others can write to could be replaced under us: the folder and the
    library must be this user's and writable by nobody else (checked on their open descriptors)."""
    if not kind(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(f"native cache {what} is not private to this user")


_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_checked(name: str, dir_fd: int) -> int:
    """A descriptor of the library ``name`` in the cache folder, never through a link, checked on itself."""
    try:
        fd = os.open(name, _NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError("native cache library is a symbolic link") from None
        raise
    try:
        _check_private(os.fstat(fd), stat.S_ISREG, "library")
    except OSError:
        os.close(fd)
        raise
    return fd


def _compile(cc: str, code: str, cache: Path, dir_fd: int, name: str) -> None:
    """Compile into a private temporary name in the cache folder, fsync, then rename to ``name`` (atomic: a
    party's workers may build at the same time, and a reader never sees half a library)."""
    stem = name.rsplit("_", 1)[0]
    src_fd, src = tempfile.mkstemp(dir=cache, prefix=f".{stem}_", suffix=".c")
    out_fd, part = tempfile.mkstemp(dir=cache, prefix=f".{stem}_", suffix=".part")
    os.close(out_fd)
    try:
        with os.fdopen(src_fd, "w") as fh:
            fh.write(code)
        subprocess.run([cc, *CFLAGS, "-o", part, src], check=True, capture_output=True, timeout=120)
        fd = os.open(os.path.basename(part), _NOFOLLOW, dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o500)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(os.path.basename(part), name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    finally:
        for leftover in (src, part):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _open_kernel(cc: str, source_name: str = SOURCE_NAME) -> int:
    """A checked descriptor of the compiled kernel (built first if the cache has none).  The caller loads it
    through ``/proc/self/fd/N``, so what is loaded is the file that was checked, whatever its name points to by
    then."""
    if not os.path.isdir("/proc/self/fd"):
        raise OSError("no /proc/self/fd to load the checked library through")
    code = source(source_name)
    key = "\0".join([code, cc, *CFLAGS])
    stem = source_name.removesuffix(".c")
    name = f"{stem}_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    cache = _cache_dir()
    dir_fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_private(os.fstat(dir_fd), stat.S_ISDIR, "folder")
        try:
            return _open_checked(name, dir_fd)
        except FileNotFoundError:
            _compile(cc, code, cache, dir_fd, name)
            return _open_checked(name, dir_fd)
    finally:
        os.close(dir_fd)


def reason(e: Exception) -> str:
    """Why the kernel is off, without a path (the status goes into report.json)."""
    if isinstance(e, subprocess.CalledProcessError):
        return f"the C compiler failed (exit status {e.returncode})"
    if isinstance(e, subprocess.TimeoutExpired):
        return "the C compiler timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)[:200]


def open_library(cc: str, source_name: str = SOURCE_NAME):
    """The compiled kernel of ``source_name`` as a ``ctypes.CDLL`` (built first if the cache has none), loaded
    through the descriptor that was checked, so that what is loaded is the checked file whatever its name points
    to by then.  Raises OSError or subprocess.SubprocessError when it cannot be built or trusted
    (:func:`reason` says why, without a path)."""
    fd = _open_kernel(cc, source_name)
    try:
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")      # the checked file itself, not its name
    except BaseException:
        os.close(fd)
        raise
    # kept open while the process lives (a loaded library is never unloaded): the dynamic loader takes a name it
    # has loaded before for the same library, so a closed and reused descriptor number would hand the other
    # kernel's library back for this one
    _LOADED_FDS.append(fd)
    return lib


_LOADED_FDS: list = []


def declare(lib) -> None:
    """The ctypes declarations of a kernel's exported functions: both C files export the same names with the
    same C signatures (change the three together)."""
    c_long, c_u64, c_p, c_void = ctypes.c_long, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_void_p
    lib.fb_supported.restype = ctypes.c_int
    lib.fb_to52_many.argtypes = [c_p, c_long, c_long, c_p, c_long]
    lib.fb_to52_many.restype = None
    lib.fb_pow_many.argtypes = [c_p, c_long, c_long, c_p, c_u64, c_p, c_p, c_long, c_p, c_long]
    lib.fb_horner_many.argtypes = [c_p, c_long, c_p, c_long, c_p, c_u64, c_p, c_long, c_p, c_long]
    lib.fb_to_mont.argtypes = [c_p, c_long, c_long, c_p, c_u64, c_p, c_p]
    lib.fb_from_mont.argtypes = [c_p, c_long, c_long, c_p, c_u64, c_p, c_long]
    lib.fb_segprod.argtypes = [c_p, c_long, c_void, c_long, c_void, c_long, c_long, c_p, c_u64, c_p]
    lib.fb_powm_sec_many.argtypes = [c_p, c_long, c_p, c_long, c_long, c_p, c_u64, c_p, c_p, c_long]
    for fn in (lib.fb_pow_many, lib.fb_horner_many, lib.fb_to_mont, lib.fb_from_mont, lib.fb_segprod,
               lib.fb_powm_sec_many):
        fn.restype = ctypes.c_int
