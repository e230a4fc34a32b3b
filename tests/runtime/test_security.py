"""Nothing runs that the user did not ask for; no bad file or bad plugin crashes or hangs torch_fl.

Each test reproduces an attack or a fault from issue 15 (docs/security.md has the trust model):
a planted or truncated JIT cache entry, shell metacharacters in the cache path, plugins picked
up from the working directory, a module planted beside a worker, truncated libraries, FIFOs,
crashing plugins, a NULL from malloc, fl memory asked for outside fl tensors. Whatever can crash
runs in a subprocess."""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import HERE, run_py

import torch_fl as fl
from torch_fl.runtime import header_path

BUNDLED = os.path.join(os.path.dirname(fl.__file__), "runtime", "plugins")
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
NOBODY = 65534

JIT_SNIPPET = """
    import torch, torch_fl as fl
    fl.initialize("minimal")                      # minimal has no cumsum kernel: the JIT tier compiles one
    print("CUMSUM", torch.arange(6.).to("fl").cumsum(0).cpu().tolist(), fl.explain("aten::cumsum").path)
"""
JIT_OK = "CUMSUM [0.0, 1.0, 3.0, 6.0, 10.0, 15.0] jit"


def _jit(cache, **kw):
    return run_py(JIT_SNIPPET, env={"FL_JIT_CACHE": str(cache)}, **kw)


def _kernels(cache) -> list[str]:
    return sorted(glob.glob(os.path.join(str(cache), "jit_*.so")))


def _digest_ok(so: str) -> bool:
    with open(so, "rb") as f:
        actual = hashlib.sha256(f.read()).hexdigest()
    with open(so + ".sha256") as f:
        return f.read().strip() == actual


def _planted_library(tmp_path, marker) -> str:
    """A shared library whose constructor creates `marker`: proof that it was loaded."""
    src = tmp_path / "planted.c"
    src.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void owned(void) { "
        f'FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
        "int fl_plugin_abi_version(void) { return 1; }\n"
        "int fl_plugin_init(void *p) { (void)p; return 4; }\n"
    )
    lib = tmp_path / "libplanted.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return str(lib)


@pytest.fixture
def jit_kernel(tmp_path):
    """A private JIT cache holding the cumsum kernel: (cache folder, the kernel's path)."""
    cache = tmp_path / "jit"
    r = _jit(cache)
    assert JIT_OK in r.stdout, r.stdout + r.stderr
    kernels = _kernels(cache)
    assert kernels and all(_digest_ok(k) for k in kernels)
    return cache, kernels[0]


# -- the JIT cache: no shell, private, verified ---------------------------------------------------


@pytest.mark.slow  # subprocesses that build and load a JIT kernel
def test_cache_path_never_reaches_a_shell(tmp_path):
    marker = tmp_path / "INJECTED"
    cache = f"{tmp_path}/x'; touch {marker}; echo '"
    r = _jit(cache)
    assert JIT_OK in r.stdout, r.stdout + r.stderr
    assert not marker.exists(), "the cache path was run as a shell command"
    assert _kernels(cache) and oct(os.stat(cache).st_mode & 0o777) == "0o700"


@pytest.mark.slow  # a subprocess
def test_home_with_an_apostrophe(tmp_path):
    home = tmp_path / "o'brien"
    home.mkdir()
    r = run_py(JIT_SNIPPET, env={"HOME": str(home)}, unset=("FL_JIT_CACHE", "FL_CACHE_DIR", "XDG_CACHE_HOME"))
    assert JIT_OK in r.stdout, r.stdout + r.stderr
    assert _kernels(home / ".cache" / "torch_fl" / "jit")


@pytest.mark.slow  # a subprocess
def test_compiler_errors_are_reported(tmp_path):
    r = run_py(JIT_SNIPPET, env={"FL_JIT_CACHE": str(tmp_path / "jit"), "CC": "cc -Werror=no-such-warning-xyz"})
    assert "the C compiler 'cc' exited with status 1: " in r.stderr and "no-such-warning-xyz" in r.stderr, r.stderr
    assert "CUMSUM [0.0, 1.0, 3.0, 6.0, 10.0, 15.0]" in r.stdout  # the next tier served it


def test_cache_root_without_home_is_the_users_own(monkeypatch):
    import pwd

    from torch_fl.runtime import private

    for name in ("HOME", "FL_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert private.cache_root() == os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "torch_fl")


def test_last_resort_cache_is_per_user_and_checked(monkeypatch, tmp_path):
    import tempfile

    from torch_fl.runtime import private

    for name in ("HOME", "FL_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_user(uid):
        raise KeyError(uid)

    monkeypatch.setattr(private.pwd, "getpwuid", no_user)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = private.cache_root()
    assert root == os.path.join(str(tmp_path), f"torch_fl-{os.geteuid()}")
    os.mkdir(root, 0o777)
    os.chmod(root, 0o777)  # pre-created wide open, by us: tightened
    assert private.private_dir(root) == root and os.stat(root).st_mode & 0o777 == 0o700


@AS_ROOT
def test_cache_folder_of_another_user_is_refused(tmp_path):
    from torch_fl.runtime import private

    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o777)
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(fl.CacheDirError, match=r"is owned by another user \(uid 65534\)"):
        private.private_dir(str(folder))


@pytest.mark.slow  # subprocesses that build and load a JIT kernel
@AS_ROOT
def test_library_planted_in_a_foreign_cache_is_never_loaded(tmp_path, jit_kernel):
    """The issue's takeover: another user pre-creates the cache 0777 and plants a library under the
    kernel's name, with a matching digest. Its constructor must never run."""
    _, kernel = jit_kernel
    marker = tmp_path / "PWNED"
    theirs = tmp_path / "shared"
    theirs.mkdir(mode=0o777)
    planted = os.path.join(str(theirs), os.path.basename(kernel))
    shutil.copy(_planted_library(tmp_path, marker), planted)
    with open(planted + ".sha256", "w") as f:
        f.write(hashlib.sha256(open(planted, "rb").read()).hexdigest() + "\n")
    for path in (theirs, planted, planted + ".sha256"):
        os.chown(path, NOBODY, NOBODY)
        os.chmod(path, 0o777)
    r = _jit(theirs)
    assert not marker.exists(), "a library another user planted was loaded"
    assert "is owned by another user (uid 65534)" in r.stderr, r.stderr
    assert "CUMSUM [0.0, 1.0, 3.0, 6.0, 10.0, 15.0]" in r.stdout  # served by the next tier


@pytest.mark.slow  # subprocesses that build and load a JIT kernel
def test_own_cache_folder_left_open_is_made_private(jit_kernel):
    cache, _ = jit_kernel
    os.chmod(cache, 0o777)
    assert JIT_OK in _jit(cache).stdout
    assert os.stat(cache).st_mode & 0o777 == 0o700


@pytest.mark.slow  # subprocesses that build and load a JIT kernel
def test_replaced_kernel_is_rebuilt_not_loaded(tmp_path, jit_kernel):
    cache, kernel = jit_kernel
    marker = tmp_path / "PWNED"
    shutil.copy(_planted_library(tmp_path, marker), kernel)
    r = _jit(cache)
    assert JIT_OK in r.stdout, r.stdout + r.stderr
    assert not marker.exists(), "a library that does not match its recorded digest was loaded"
    assert "do not match the digest recorded when it was built" in r.stderr and "rebuilding it" in r.stderr
    assert _digest_ok(kernel)


@pytest.mark.slow  # subprocesses that build and load a JIT kernel
def test_truncated_kernel_is_rebuilt_once(jit_kernel):
    """A cut-down cache entry used to kill the process with SIGBUS, or be warned about on every run."""
    cache, kernel = jit_kernel
    with open(kernel, "r+b") as f:
        f.truncate(3000)
    r = _jit(cache)
    assert r.returncode == 0 and JIT_OK in r.stdout, r.stdout + r.stderr
    assert "rebuilding it" in r.stderr and _digest_ok(kernel)
    again = _jit(cache)
    assert JIT_OK in again.stdout and "rebuilding" not in again.stderr


@pytest.mark.slow  # subprocesses that build and load a JIT kernel
def test_link_planted_at_the_kernel_name_is_not_written_through(tmp_path, jit_kernel):
    cache, kernel = jit_kernel
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.unlink(kernel)
    os.symlink(victim, kernel)
    r = _jit(cache)
    assert JIT_OK in r.stdout, r.stdout + r.stderr
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(kernel) and _digest_ok(kernel)


@pytest.mark.slow  # a subprocess
def test_truncated_core_library_is_rebuilt(tmp_path):
    """The C++ core is a library every process loads from the private cache: a damaged copy is rebuilt,
    never loaded. (The cache starts from this session's build, so only the rebuild compiles.)"""
    from torch_fl.runtime import core as fl_core

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    built = fl_core.library_path()
    core = str(cache / os.path.basename(built))
    shutil.copy(built, core)
    shutil.copy(built + ".sha256", core + ".sha256")
    code = "import torch, torch_fl; print('SUM', torch.ones(3, device='fl').sum().item())"
    env = {"FL_CACHE_DIR": str(cache), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    assert "SUM 3.0" in run_py(code, env=env).stdout
    with open(core, "r+b") as f:
        f.truncate(1000)
    r = run_py(code, env=env, timeout=900)
    assert r.returncode == 0 and "SUM 3.0" in r.stdout, r.stdout + r.stderr
    assert "rebuilding the cached C++ core" in r.stderr and _digest_ok(core)


# -- plugins: only from where the user said -----------------------------------------------------


def _decoy(folder, marker):
    """A plugin-looking library in `folder` whose constructor creates `marker` if anything loads it."""
    os.makedirs(folder, exist_ok=True)
    shutil.copy(_planted_library(folder, marker), os.path.join(folder, "libdecoy.so"))


@pytest.mark.slow  # a subprocess
def test_config_plugin_path_is_relative_to_the_config_file(tmp_path):
    work, cfg = tmp_path / "work", tmp_path / "cfg"
    marker = tmp_path / "DECOY_LOADED"
    _decoy(work / "plugins", marker)
    (cfg / "plugins").mkdir(parents=True)
    shutil.copy(os.path.join(BUNDLED, "libfl_minimal.so"), cfg / "plugins" / "libmini2.so")
    (cfg / "torch_fl.toml").write_text('plugin_path = ["plugins"]\n')
    r = run_py(
        """
        import torch_fl as fl
        for e in fl.list_backends():
            if e["origin"] != "bundled":
                print("ROW", e["status"], e["origin"], e["path"], "|", e["source"])
    """,
        env={"FL_CONFIG": str(cfg / "torch_fl.toml")},
        cwd=str(work),
    )
    assert f"ROW loaded config file {cfg}/plugins/libmini2.so | {cfg}/torch_fl.toml" in r.stdout, r.stdout + r.stderr
    assert not marker.exists(), "a plugin in the working directory was loaded"


@pytest.mark.slow  # a subprocess
def test_relative_plugin_path_variable_is_refused(tmp_path):
    marker = tmp_path / "DECOY_LOADED"
    _decoy(tmp_path, marker)
    r = run_py(
        """
        import torch_fl as fl
        print([(e["status"], e["reason"]) for e in fl.list_backends() if e["origin"] == "FL_PLUGIN_PATH"])
    """,
        env={"FL_PLUGIN_PATH": "."},
        cwd=str(tmp_path),
    )
    assert (
        "('rejected', 'a relative path: it would load plugins from whatever folder the program runs in; "
        "give an absolute path" in r.stdout
    ), r.stdout + r.stderr
    assert not marker.exists()


@pytest.mark.slow  # a subprocess
def test_plugin_folder_every_user_can_write_is_refused(tmp_path):
    marker = tmp_path / "DECOY_LOADED"
    folder = tmp_path / "open"
    _decoy(folder, marker)
    folder.chmod(0o777)
    r = run_py(
        """
        import torch_fl as fl
        print([e["reason"] for e in fl.list_backends() if e["origin"] == "FL_PLUGIN_PATH"])
    """,
        env={"FL_PLUGIN_PATH": str(folder)},
    )
    assert "is writable by every user (mode 777): any user could plant a plugin there" in r.stdout, r.stdout + r.stderr
    assert not marker.exists()


@pytest.mark.slow  # a subprocess
def test_backends_command_says_where_each_plugin_came_from(tmp_path):
    shutil.copy(os.path.join(BUNDLED, "libfl_minimal.so"), tmp_path / "libmini3.so")
    cfg = tmp_path / "torch_fl.toml"
    cfg.write_text(f'plugin_path = ["{tmp_path}/libmini3.so"]\n')
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "backends"],
        capture_output=True,
        text=True,
        env={**os.environ, "FL_CONFIG": str(cfg)},
        timeout=300,
        cwd=HERE,
    )
    assert r.returncode == 0, r.stderr
    assert "bundled" in r.stdout and f"config file     {tmp_path}/libmini3.so" in r.stdout, r.stdout
    assert f"from {cfg}" in r.stdout


# -- workers do not import from the working directory ---------------------------------------------


def _planted_module(folder, marker) -> None:
    (folder / "tempfile.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")


def _console_script() -> str:
    script = os.path.join(os.path.dirname(sys.executable), "torch-fl")
    if not os.path.exists(script):
        pytest.skip("the torch-fl console script is not installed beside this Python")
    return script


@pytest.mark.slow  # a subprocess
def test_plugin_check_worker_ignores_the_working_directory(tmp_path):
    marker = tmp_path / "PLANTED_RAN"
    _planted_module(tmp_path, marker)
    r = subprocess.run(
        [_console_script(), "plugin", "check", "minimal", "--ops", "aten::exp"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=600,
    )
    assert not marker.exists(), "the worker imported tempfile.py from the working directory"
    assert r.returncode == 0 and "kernel aten::exp" in r.stdout and "PASSED" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow  # a subprocess
def test_coverage_worker_ignores_the_working_directory(tmp_path):
    marker = tmp_path / "PLANTED_RAN"
    _planted_module(tmp_path, marker)
    r = subprocess.run(
        [_console_script(), "coverage", "--backend", "minimal", "--ops", "abs", "--samples", "1", "--json"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=600,
    )
    assert not marker.exists(), "the worker imported tempfile.py from the working directory"
    assert r.returncode == 0 and json.loads(r.stdout)["results"], r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("safe_path", ["", "1"])
def test_worker_bootstrap_drops_only_the_working_directory(tmp_path, safe_path):
    """With PYTHONSAFEPATH=1 (or -P) `-c` puts no working directory first; the bootstrap then dropped
    the first PYTHONPATH entry instead (a checker run lost the user's path; CI runs with it set)."""
    from torch_fl.runtime.spawn import python_command

    script = tmp_path / "show.py"
    script.write_text("import json, sys; print(json.dumps(sys.path))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env.update(PYTHONPATH=str(tmp_path / "first"), **({"PYTHONSAFEPATH": safe_path} if safe_path else {}))
    r = subprocess.run(
        python_command(str(script)), capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60
    )
    assert r.returncode == 0, r.stderr
    path = json.loads(r.stdout)
    assert str(tmp_path / "first") in path and "" not in path and str(tmp_path) not in path[1:], path


# -- bad files and bad plugins: a rejection, never a crash or a hang --------------------------------


@pytest.mark.slow  # a subprocess
def test_truncated_library_and_fifo_on_the_plugin_path(tmp_path):
    cut, fifo = tmp_path / "cut", tmp_path / "fifo"
    cut.mkdir()
    fifo.mkdir()
    with open(os.path.join(BUNDLED, "libfl_minimal.so"), "rb") as f:
        (cut / "libcut.so").write_bytes(f.read(20000))
    os.mkfifo(fifo / "libpipe.so")
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "backends"],
        capture_output=True,
        text=True,
        cwd=HERE,
        env={**os.environ, "FL_PLUGIN_PATH": f"{cut}:{fifo}"},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr  # was SIGBUS (135) for the first, a hang for the second
    assert "libcut.so is not a loadable shared library: truncated: its section header table ends at byte" in r.stdout, (
        r.stdout
    )
    assert "libpipe.so is not a loadable shared library: a FIFO, not a regular file" in r.stdout


@pytest.mark.slow  # a subprocess
def test_plugin_that_crashes_when_loaded_is_isolated(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    src = tmp_path / "crash.c"
    src.write_text(
        '#include "fl_plugin.h"\n'
        "__attribute__((constructor)) static void boom(void) { volatile int *p = 0; *p = 1; }\n"
        "int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }\n"
        "int fl_plugin_init(fl_plugin_t *out) { (void)out; return FL_OK; }\n"
    )
    lib = plugins / "libcrash.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-I", os.path.dirname(header_path()), str(src), "-o", str(lib)], check=True
    )
    code = """
        import torch_fl as fl
        print("ROW", [e["reason"] for e in fl.list_backends() if e["path"].endswith("libcrash.so")][0])
        print("CPU", fl.initialize("cpu"))
    """
    env = {"FL_PLUGIN_PATH": str(plugins), "FL_CACHE_DIR": str(tmp_path / "cache")}
    r = run_py(code, env=env)
    assert "loading it crashed a test process (it was killed by SIGSEGV)" in r.stdout, r.stdout + r.stderr
    assert "CPU cpu" in r.stdout
    (verdict,) = glob.glob(str(tmp_path / "cache" / "probe" / "*.json"))  # remembered by the file's identity
    with open(verdict) as f:
        recorded = json.load(f)
    assert recorded["plugin"] == str(lib) and "SIGSEGV" in recorded["problem"]
    recorded["problem"] = "the remembered verdict"
    with open(verdict, "w") as f:
        json.dump(recorded, f)
    assert "libcrash.so: the remembered verdict" in run_py(code, env=env).stdout  # not probed again
    os.utime(lib)  # a rebuilt plugin is probed afresh
    assert "killed by SIGSEGV" in run_py(code, env=env).stdout


@pytest.mark.slow  # a subprocess
def test_malloc_returning_null_is_a_plugin_error(test_plugins):
    """The allocator (in the C++ core) checks the contract: an error naming the backend and the fix,
    raised as PyTorch's RuntimeError (C++ cannot raise torch_fl's own classes), the process usable."""
    r = run_py(
        """
        import torch, torch_fl as fl
        fl.initialize("nulldev")
        try:
            torch.empty(16, device="fl")
        except RuntimeError as e:
            print("ERR", e)
        fl.set_backend("cpu")
        print("OK", torch.ones(3, device="fl").sum().item())
    """,
        env={"FL_PLUGIN_PATH": str(test_plugins)},
    )
    assert r.returncode == 0, r.stderr
    assert "(nulldev) broke the malloc contract: it returned FL_OK with a NULL pointer" in r.stdout, r.stdout
    assert "fix the plugin" in r.stdout and "OK 3.0" in r.stdout


# -- fl memory asked for outside fl tensors: an error, never a segfault ------------------------------


FL_ONLY = "torch_fl: fl memory is allocated by fl tensors only"


# (torch.UntypedStorage(n, device="fl"), DataLoader workers and multiprocessing with fl tensors used to
# crash with SIGSEGV; with real tensors they work: tests/runtime/test_real_tensors.py)
