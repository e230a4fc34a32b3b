"""Settings from the environment and the config file: one parser for each kind of value.

Where settings come from, strongest first: arguments to torch_fl calls, the
environment (FL_BACKEND, FL_CPU_FALLBACK, FL_PLUGIN_PATH, ...), then the config
file: $FL_CONFIG if set, else ./torch_fl.toml, else ~/.config/torch_fl/config.toml.

    # torch_fl.toml
    backend = "rocm"          # like FL_BACKEND
    cpu_fallback = true       # like FL_CPU_FALLBACK
    plugin_path = ["/opt/vendor/lib", "plugins"]   # relative entries: from this file's folder

Why one parser: sizes, booleans and counts are read by Python and by the C
plugins. Each kind has exactly one grammar (`parse_size`, `parse_bool`,
`parse_count`), every error names the variable or file, the value and what is
accepted, and `validate_environment` rewrites the variables the plugins read
(FL_*_MEMORY_LIMIT, FL_*_DEVICES, FL_*_COMM_CHUNK_BYTES) as plain integers and FL_EMU_ASYNC as 1 or 0
before any plugin is loaded, so C only ever sees what Python validated."""

from __future__ import annotations

import os
import re
import stat
import sys
from fractions import Fraction
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (torch_fl's oldest): the same parser, as a package
    import tomli as tomllib

from ..errors import ConfigError, FlError

KNOWN_KEYS = ("backend", "cpu_fallback", "plugin_path")
SIZE_MAX = (1 << 64) - 1  # a size_t on every platform torch_fl builds for
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_COUNT_RE = re.compile(r"^\s*\+?(\d+)\s*$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
SIZE_HELP = "a whole number of bytes, or a number with a K, M, G or T suffix (binary units: 512M, 2G, 1.5T)"
BOOL_HELP = "use 1 or 0 (also true/false, yes/no, on/off)"

# Variables the plugins read with getenv(): (pattern, kind, smallest accepted value).
PLUGIN_VARIABLES = (
    (re.compile(r"^FL_[A-Z0-9_]+_MEMORY_LIMIT$"), "size", 1),
    (re.compile(r"^FL_[A-Z0-9_]+_COMM_CHUNK_BYTES$"), "size", 1),
    (re.compile(r"^FL_[A-Z0-9_]+_DEVICES$"), "count", 1),
    (re.compile(r"^FL_EMU_ASYNC$"), "bool", 0),  # the emulators' asynchronous mode (plugins_cffi/emulated/async.c)
    (re.compile(r"^FL_OPENCL_CACHE$"), "bool", 0),  # the opencl plugin's program binary cache (bincache.c)
    (re.compile(r"^FL_OPENCL_CLBLAST$"), "bool", 0),  # the opencl plugin's GEMM through CLBlast (clblast.c)
)
# Variables Python reads itself: name -> kind.
PYTHON_VARIABLES = {
    "FL_MEMORY_POOL": "bool",
    "FL_MEMORY_POOL_LIMIT": "size",
    "FL_CPU_FALLBACK": "bool",
    "FL_COMPILE": "bool",
    "FL_DIST_RELAY": "bool",
    "FL_FAST_PATH": "bool",
    "FL_JIT_VECTOR_MATH": "bool",
}
PATH_VARIABLES = ("FL_CACHE_DIR", "FL_JIT_CACHE")


# -- the three parsers ------------------------------------------------------------------------


def parse_size(value: Any, name: str, minimum: int = 0) -> int:
    """Bytes from an int or from text such as "4096", "512M", "2 G", "1.5GiB"; `name` is the
    variable or key the value came from, for the error message."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a size: {SIZE_HELP}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.match(str(value))
        if m is None:
            raise ConfigError(f"{name}={value!r} is not a size: {SIZE_HELP}")
        n = int(Fraction(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])
    if n < minimum:
        raise ConfigError(f"{name}={value!r} is too small: at least {minimum} byte(s); {SIZE_HELP}")
    if n > SIZE_MAX:
        raise ConfigError(f"{name}={value!r} is larger than the largest size a plugin can take (16 EiB)")
    return n


def parse_bool(value: Any, name: str) -> bool:
    """True or False from a bool or from text (1/0, true/false, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean: {BOOL_HELP}")


def parse_count(value: Any, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number within [minimum, maximum] from an int or decimal text."""
    what = f"a whole number from {minimum}" + (f" to {maximum}" if maximum is not None else " up")
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a count: use {what}")
    if isinstance(value, int):
        n = value
    else:
        m = _COUNT_RE.match(str(value))
        if m is None:
            raise ConfigError(f"{name}={value!r} is not a count: use {what}")
        n = int(m.group(1))
    if n < minimum or (maximum is not None and n > maximum):
        raise ConfigError(f"{name}={value!r} is out of range: use {what}")
    return n


# -- the environment --------------------------------------------------------------------------


def env_bool(name: str, default: bool) -> bool:
    """The boolean variable `name`, or `default` when it is unset or empty."""
    text = os.environ.get(name, "")
    return default if text.strip() == "" else parse_bool(text, name)


def env_size(name: str, default: int | None = None, minimum: int = 0) -> int | None:
    """The size variable `name` in bytes, or `default` when it is unset or empty."""
    text = os.environ.get(name, "")
    return default if text.strip() == "" else parse_size(text, name, minimum)


def validate_environment() -> None:
    """Checks every FL_* variable torch_fl or a plugin reads, before any plugin loads.

    A bad value raises ConfigError naming it. The variables the plugins read
    are rewritten as plain integers, so C reads only values Python accepted. The
    cache folders must be absolute paths: a relative one would make the folder
    a program starts in decide where compiled code is written and loaded from."""
    for name, kind in PYTHON_VARIABLES.items():
        if kind == "bool":
            env_bool(name, True)
        else:
            env_size(name)
    for name, text in list(os.environ.items()):
        for pattern, kind, minimum in PLUGIN_VARIABLES:
            if pattern.match(name) and text.strip() != "":
                if kind == "bool":
                    os.environ[name] = "1" if parse_bool(text, name) else "0"
                    break
                value = parse_size(text, name, minimum) if kind == "size" else parse_count(text, name, minimum)
                os.environ[name] = str(value)
                break
    for name in PATH_VARIABLES:
        text = os.environ.get(name, "")
        if text and not os.path.isabs(os.path.expanduser(text)):
            raise ConfigError(
                f"{name}={text!r} is a relative path: it would keep compiled code wherever the program "
                f"happens to start; give an absolute path (e.g. {name}={os.path.abspath(text)})"
            )
        if text.startswith("~"):
            os.environ[name] = os.path.expanduser(text)


# -- the config file --------------------------------------------------------------------------


def config_path() -> str | None:
    explicit = os.environ.get("FL_CONFIG")
    if explicit:
        if not os.path.exists(explicit):
            raise ConfigError(f"FL_CONFIG points to {explicit}, which does not exist: fix the path or unset FL_CONFIG")
        return os.path.abspath(explicit)
    for path in (
        os.path.join(os.getcwd(), "torch_fl.toml"),
        os.path.join(os.path.expanduser("~"), ".config", "torch_fl", "config.toml"),
    ):
        if os.path.exists(path):
            return path
    return None


def load_config() -> dict[str, Any]:
    """The config file's settings, validated: `backend` a name, `cpu_fallback` a bool,
    `plugin_path` a list of absolute paths (relative entries resolved against the
    file's own folder); `_path` is the file. Empty when there is no file."""
    path = config_path()
    if path is None:
        return {}
    check_trusted_file(path, "config file")
    data = _read_toml(path)
    unknown = sorted(set(data) - set(KNOWN_KEYS))
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(KNOWN_KEYS)}"
        )
    out: dict[str, Any] = {"_path": path}
    if "backend" in data:
        backend = data["backend"]
        if not isinstance(backend, str) or not backend.strip():
            raise ConfigError(
                f'config file {path}: backend = {_toml(backend)} must be a backend name in quotes, e.g. backend = "cpu"'
            )
        out["backend"] = backend.strip()
    if "cpu_fallback" in data:
        out["cpu_fallback"] = parse_bool(data["cpu_fallback"], f"cpu_fallback in config file {path}")
    if "plugin_path" in data:
        out["plugin_path"] = _plugin_path(data["plugin_path"], path)
    return out


def _read_toml(path: str) -> dict[str, Any]:
    try:
        # O_NONBLOCK: opening a FIFO (FL_CONFIG=<fifo>) must not wait for a writer; only a regular file is read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError
            if not stat.S_ISREG(mode):
                raise ConfigError(
                    f"config file {path} is not a regular file (a FIFO, socket or device): point "
                    f"FL_CONFIG at a TOML file (or remove {os.path.basename(path)})"
                )
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except IsADirectoryError:
        raise ConfigError(
            f"config file {path} is a directory, not a TOML file: point FL_CONFIG at the file (or remove the directory)"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None


def _plugin_path(value: Any, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise ConfigError(
            f"config file {path}: plugin_path = {_toml(value)} must be a list of folder or file "
            f'paths in quotes, e.g. plugin_path = ["/opt/vendor/lib"]'
        )
    base = os.path.dirname(path)
    return [os.path.normpath(os.path.join(base, os.path.expanduser(p))) for p in value]


def _toml(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


# -- trust: files that decide what code runs ---------------------------------------------------


def check_trusted_file(path: str, what: str) -> None:
    """Refuses a file that decides what code torch_fl runs (a config file naming plugins) when
    another user could have written it: owned by someone other than you or root, or writable
    by every user. The same rule git applies to a repository owned by someone else."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read: {e.strerror}") from None
    problem = untrusted_reason(st)
    if problem:
        raise ConfigError(
            f"{what} {path} {problem}: torch_fl does not take settings (which name the plugins it "
            f"loads) from a file another user can change. Fix its owner or mode, or set FL_CONFIG "
            f"to a file of your own"
        )


def untrusted_reason(st: os.stat_result) -> str | None:
    """Why a file or folder with this stat could be changed by another user, or None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by another user (uid {st.st_uid})"
    if st.st_mode & stat.S_IWOTH:
        return f"is writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
    return None


__all__ = [
    "ConfigError",
    "FlError",
    "check_trusted_file",
    "config_path",
    "env_bool",
    "env_size",
    "load_config",
    "parse_bool",
    "parse_count",
    "parse_size",
    "untrusted_reason",
    "validate_environment",
]
