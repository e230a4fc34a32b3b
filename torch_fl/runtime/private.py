"""Private cache folders: where torch_fl keeps code it compiled and facts it measured.

Why this module exists: torch_fl loads shared libraries from its caches (the
C++ device guard; the plugins' JIT kernels, which plugins_cffi/host/jit.c keeps
under the same rules) and trusts what it recorded there (plugin probe
verdicts). Anyone who can write into such a folder can run code in every
torch_fl process that uses it. So a cache folder is per user and private:
created 0700, owned by this user, not reachable through another user's
symbolic link, and checked on every use; a folder that fails the check is
refused with an error that names it and the fix, never used. Files are
written into a private temporary file and renamed into place, and each
library is stored beside a `.sha256` file recording the digest of the bytes
this process's compiler produced, checked before every load.

The cache root is $FL_CACHE_DIR, else $XDG_CACHE_HOME/torch_fl, else
~/.cache/torch_fl (HOME, else the password database). Only when no home folder
can be found does it fall back to a per-user folder in the temporary
directory, which must then pass the same checks (a folder another user
created there in advance is refused)."""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
import tempfile

from ..errors import CacheDirError

DIGEST_SUFFIX = ".sha256"


def home_dir() -> str | None:
    """This user's home folder: $HOME, else the password database; None when neither is absolute."""
    home = os.environ.get("HOME", "")
    if not os.path.isabs(home):
        try:
            home = pwd.getpwuid(os.geteuid()).pw_dir
        except KeyError:
            home = ""
    return home if os.path.isabs(home) else None


def cache_root() -> str:
    """The folder torch_fl's caches live under (see the module docstring for the order)."""
    explicit = os.environ.get("FL_CACHE_DIR", "")
    if explicit:
        return os.path.abspath(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "torch_fl")
    home = home_dir()
    if home is not None:
        return os.path.join(home, ".cache", "torch_fl")
    return os.path.join(tempfile.gettempdir(), f"torch_fl-{os.geteuid()}")


def private_dir(path: str) -> str:
    """`path`, created 0700 if missing and checked to be this user's own private folder.

    Raises CacheDirError when it is owned by someone else, reached through
    another user's symbolic link, or is not a folder. A folder of ours whose
    mode lets others in (an older torch_fl made caches 0755) is tightened to 0700."""
    path = os.path.abspath(path)
    _make_dirs(path)
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError as e:
        raise CacheDirError(f"cache folder {path} cannot be used: {e.strerror}") from None
    me = os.geteuid()
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise _refuse(path, f"is a symbolic link owned by another user (uid {link.st_uid})")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a folder")
    if st.st_uid != me:
        raise _refuse(path, f"is owned by another user (uid {st.st_uid}), so that user could plant code in it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _make_dirs(path: str) -> None:
    missing = []
    head = path
    while head and not os.path.lexists(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise CacheDirError(
                f"cache folder {path} cannot be created ({d}: {e.strerror}): set FL_CACHE_DIR to a folder you can write"
            ) from None


def _refuse(path: str, why: str) -> CacheDirError:
    return CacheDirError(
        f"cache folder {path} {why}: torch_fl compiles and loads code there, so it must be private to you "
        f"(owned by uid {os.geteuid()}, mode 0700). Remove it, or set FL_CACHE_DIR to a folder of your own"
    )


def file_problem(path: str) -> str | None:
    """Why the cached file at `path` must not be trusted, or None: not a regular file (a link,
    a FIFO), owned by another user, or writable by others."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if stat.S_IMODE(st.st_mode) & 0o022:
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def write_file(path: str, data: bytes) -> None:
    """Writes `path` atomically: a new private file (O_EXCL, 0600) in the same folder, renamed
    over `path`, so no reader sees half a file and no planted link is followed."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_digest(path: str) -> None:
    """Records the digest of the library this process just built, beside it."""
    write_file(path + DIGEST_SUFFIX, (sha256_of(path) + "\n").encode())


def digest_problem(path: str) -> str | None:
    """Why the cached library at `path` is not the one torch_fl built, or None when its bytes
    match the recorded digest and both files are ours."""
    for p in (path, path + DIGEST_SUFFIX):
        problem = file_problem(p)
        if problem:
            return f"{p}: {problem}"
    with open(path + DIGEST_SUFFIX, encoding="ascii", errors="replace") as f:
        recorded = f.read().strip()
    if recorded != sha256_of(path):
        return f"{path} does not match the digest recorded when it was built (truncated or changed since)"
    return None
