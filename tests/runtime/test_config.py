"""Bad configuration gets a clear error naming the setting, the value and what is accepted.

One parser per kind of value (sizes, booleans, counts) serves every FL_* variable and config
key; the values the C plugins read are validated and rewritten as plain integers by Python
before any plugin loads, and the plugins' own parser (used by any other host) agrees."""

import os
import shutil

import pytest
import torch
from conftest import run_py

import torch_fl as fl
from torch_fl.runtime import config, ffi

GiB = 1 << 30


# -- the parsers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("4096", 4096),
        ("512M", 512 << 20),
        ("2G", 2 * GiB),
        ("2 G", 2 * GiB),
        ("1T", 1 << 40),
        ("1.5G", 3 * GiB // 2),
        ("2GiB", 2 * GiB),
        ("64kb", 64 << 10),
        (" 7 ", 7),
        (4096, 4096),
    ],
)
def test_sizes_accepted(text, expected):
    assert config.parse_size(text, "FL_X") == expected


@pytest.mark.parametrize("text", ["abc", "-1", "nan", "inf", "1e400", "", "2X", "1.2.3", "G", True, "99999999T"])
def test_sizes_refused_name_the_setting(text):
    with pytest.raises(fl.ConfigError, match=r"^FL_X=.* (is not a size|is larger than)"):
        config.parse_size(text, "FL_X")
    with pytest.raises(ValueError):  # a ConfigError is a ValueError too
        config.parse_size(text, "FL_X")


def test_size_error_says_what_is_accepted():
    with pytest.raises(fl.ConfigError) as e:
        config.parse_size("abc", "FL_MEMORY_POOL_LIMIT")
    assert str(e.value).startswith(
        "FL_MEMORY_POOL_LIMIT='abc' is not a size: a whole number of bytes, or a number with a K, M, G or T suffix"
    )


def test_booleans_and_counts():
    assert config.parse_bool("yes", "FL_B") is True and config.parse_bool(" Off ", "FL_B") is False
    with pytest.raises(fl.ConfigError, match=r"FL_MEMORY_POOL='maybe' is not a boolean: use 1 or 0"):
        config.parse_bool("maybe", "FL_MEMORY_POOL")
    assert config.parse_count("8", "FL_N") == 8
    for bad in ("abc", "0", "-3", "2.5", True):
        with pytest.raises(fl.ConfigError, match=r"FL_N=.*(not a count|out of range): use a whole number from 1"):
            config.parse_count(bad, "FL_N")


# -- the environment -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,value",
    [
        ("FL_MEMORY_POOL_LIMIT", "abc"),
        ("FL_MEMORY_POOL_LIMIT", "-1"),
        ("FL_MEMORY_POOL_LIMIT", "nan"),
        ("FL_MEMORY_POOL_LIMIT", "1e400"),
        ("FL_MEMORY_POOL", "maybe"),
        ("FL_CPU_FALLBACK", "perhaps"),
        ("FL_CPU_MEMORY_LIMIT", "abc"),
        ("FL_CPU_MEMORY_LIMIT", "0"),
        ("FL_ROCM_DEVICES", "abc"),
        ("FL_ROCM_DEVICES", "0"),
        ("FL_ROCM_COMM_CHUNK_BYTES", "lots"),
        ("FL_COMPILE", "sometimes"),
        ("FL_FAST_PATH", "maybe"),
        ("FL_JIT_VECTOR_MATH", "avx"),
    ],
)
def test_bad_variables_are_refused_by_name(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(fl.ConfigError, match=f"^{name}={value!r}"):
        config.validate_environment()


def test_plugin_variables_are_normalised_to_plain_integers(monkeypatch):
    monkeypatch.setenv("FL_CPU_MEMORY_LIMIT", "1T")
    monkeypatch.setenv("FL_ASCEND_MEMORY_LIMIT", "2 G")
    monkeypatch.setenv("FL_ROCM_DEVICES", " 3 ")
    monkeypatch.setenv("FL_ROCM_COMM_CHUNK_BYTES", "1.5M")
    config.validate_environment()
    assert os.environ["FL_CPU_MEMORY_LIMIT"] == str(1 << 40)
    assert os.environ["FL_ASCEND_MEMORY_LIMIT"] == str(2 * GiB)
    assert os.environ["FL_ROCM_DEVICES"] == "3"
    assert os.environ["FL_ROCM_COMM_CHUNK_BYTES"] == str(3 << 19)


@pytest.mark.slow  # a subprocess
def test_import_fails_naming_the_variable():
    r = run_py("import torch_fl", env={"FL_MEMORY_POOL_LIMIT": "nan"})
    assert r.returncode != 0
    assert "torch_fl.errors.ConfigError: FL_MEMORY_POOL_LIMIT='nan' is not a size" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow  # a subprocess
def test_host_memory_limit_units_reach_the_plugin():
    """1T used to give 1 byte (C did not know T) and "2 G" 2 bytes (C stopped at the space)."""
    r = run_py(
        """
        import torch_fl as fl
        print("CAP", fl.capabilities("cpu").devices[0].total_memory)
    """,
        env={"FL_CPU_MEMORY_LIMIT": "2 G"},
    )
    assert f"CAP {2 * GiB}" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow  # a subprocess
def test_emulator_device_count_out_of_range_is_named():
    """FL_ROCM_DEVICES=100000 used to become 8 silently: the emulator refuses it, naming the range."""
    r = run_py(
        """
        import torch_fl as fl
        row = [e for e in fl.list_backends() if e["path"].endswith("libfl_rocm.so")][0]
        print("ROW", row["status"], row["reason"])
        try:
            fl.initialize("rocm")
        except fl.BackendNotFoundError as e:
            print("ERR", e)
        print("CPU", fl.initialize("cpu"))
    """,
        env={"FL_ROCM_DEVICES": "100000"},
    )
    assert "ROW rejected" in r.stdout, r.stdout + r.stderr
    assert (
        "FL_ROCM_DEVICES='100000' is not valid: the rocm emulator's device count must be a whole number "
        "from 1 to 8" in r.stdout
    )
    assert "ERR unknown fl backend 'rocm'" in r.stdout and "CPU cpu" in r.stdout


def _fresh_copy(tmp_path, lib: str):
    """A private copy of a bundled plugin: its settings are read afresh (they are cached per library)."""
    src = os.path.join(os.path.dirname(fl.__file__), "runtime", "plugins", lib)
    dst = tmp_path / lib
    shutil.copy(src, dst)
    return ffi.dlopen(str(dst))


def test_plugin_parser_agrees_with_python(tmp_path, monkeypatch):
    """The C side's grammar, for hosts that do not normalise first: same sizes, errors that name the variable."""
    monkeypatch.setenv("FL_CPU_MEMORY_LIMIT", "1.5T")
    lib = _fresh_copy(tmp_path, "libfl_cpu.so")
    table = ffi.new("fl_plugin_t*")
    assert lib.fl_plugin_init(table) == 0
    props = ffi.new("fl_device_props_t*")
    assert table.device_props(0, props) == 0
    assert props.total_memory == config.parse_size("1.5T", "x") == 3 << 39

    monkeypatch.setenv("FL_MINIMAL_MEMORY_LIMIT", "lots")
    lib = _fresh_copy(tmp_path, "libfl_minimal.so")
    table = ffi.new("fl_plugin_t*")
    status = lib.fl_plugin_init(table)
    assert status == 2  # FL_ERR_INVALID
    assert ffi.string(table.last_error()).decode().startswith("FL_MINIMAL_MEMORY_LIMIT='lots' is not a size")


def test_empty_beyond_any_size_is_an_error_not_a_crash():
    # PyTorch's own size check (as for CUDA), before any allocator runs
    with pytest.raises(RuntimeError, match=r"Storage size calculation overflowed"):
        torch.empty(2**62, dtype=torch.float64, device="fl")
    with pytest.raises(torch.OutOfMemoryError, match=r"out of memory: tried to allocate"):
        torch.empty(2**58, dtype=torch.uint8, device="fl")  # fits in a size_t; no device has it
    assert torch.ones(2, device="fl").sum().item() == 2.0


# -- the config file -----------------------------------------------------------------------------


def _config_with(tmp_path, monkeypatch, text: bytes | str):
    path = tmp_path / "torch_fl.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.setenv("FL_CONFIG", str(path))
    return path


@pytest.mark.parametrize(
    "text,message",
    [
        ('plugin_path = "/tmp"\n', r'plugin_path = "/tmp" must be a list of folder or file paths'),
        ("plugin_path = [1, 2]\n", r"plugin_path = \[1, 2\] must be a list of folder or file paths"),
        ('backend = ["cpu"]\n', r"backend = \['cpu'\] must be a backend name in quotes"),
        ('cpu_fallback = "maybe"\n', r"cpu_fallback in config file .*='maybe' is not a boolean"),
        ("fallback = true\n", r"unknown key\(s\) fallback; known keys: backend, cpu_fallback, plugin_path"),
        (b'backend = "\xff"\n', r"is not UTF-8 text \(byte \d+\): save it as UTF-8"),
        ("backend = \n", r"is not valid TOML"),
    ],
)
def test_bad_config_files_name_the_file_and_key(tmp_path, monkeypatch, text, message):
    path = _config_with(tmp_path, monkeypatch, text)
    with pytest.raises(fl.ConfigError, match=message) as e:
        config.load_config()
    assert str(path) in str(e.value)


def test_config_file_that_is_a_directory(tmp_path, monkeypatch):
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    monkeypatch.setenv("FL_CONFIG", str(folder))
    with pytest.raises(fl.ConfigError, match=f"config file {folder} is a directory, not a TOML file"):
        config.load_config()


def test_relative_plugin_path_is_relative_to_the_config_file(tmp_path, monkeypatch):
    path = _config_with(tmp_path, monkeypatch, 'plugin_path = [".", "vendor/lib", "/opt/x"]\n')
    monkeypatch.chdir("/")
    assert config.load_config()["plugin_path"] == [str(tmp_path), str(tmp_path / "vendor" / "lib"), "/opt/x"]
    assert config.load_config()["_path"] == str(path)


def test_config_file_others_can_write_is_refused(tmp_path, monkeypatch):
    path = _config_with(tmp_path, monkeypatch, 'backend = "cpu"\n')
    path.chmod(0o666)
    with pytest.raises(
        fl.ConfigError,
        match=r"is writable by every user \(mode 666\): torch_fl does not take "
        r"settings",
    ):
        config.load_config()
    path.chmod(0o644)
    assert config.load_config()["backend"] == "cpu"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_config_file_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    path = _config_with(tmp_path, monkeypatch, 'backend = "cpu"\n')
    os.chown(path, 65534, 65534)
    with pytest.raises(fl.ConfigError, match=r"is owned by another user \(uid 65534\)"):
        config.load_config()


@pytest.mark.parametrize("name", ["FL_JIT_CACHE", "FL_CACHE_DIR"])
def test_relative_cache_folders_are_refused(monkeypatch, name):
    """A relative cache folder would let the folder a program starts in decide where compiled code is kept
    (and loaded from); it was silently made absolute."""
    monkeypatch.setenv(name, "jitcache")
    with pytest.raises(fl.ConfigError, match=f"^{name}='jitcache' is a relative path"):
        config.validate_environment()
    monkeypatch.setenv(name, "~/somewhere")  # ~ is the user's own home: taken, and expanded
    config.validate_environment()
    assert os.environ[name] == os.path.expanduser("~/somewhere")


def test_set_cpu_fallback_reads_words_as_the_variable_does():
    """fl.set_cpu_fallback("false") left the fallback on (a non-empty string is truthy)."""
    try:
        fl.set_cpu_fallback("false")
        assert fl.cpu_fallback_enabled() is False
        fl.set_cpu_fallback("on")
        assert fl.cpu_fallback_enabled() is True
        fl.set_cpu_fallback(0)
        assert fl.cpu_fallback_enabled() is False
        with pytest.raises(fl.ConfigError, match="is not a boolean"):
            fl.set_cpu_fallback("maybe")
        with pytest.raises(TypeError, match="takes True or False"):
            fl.set_cpu_fallback(None)
    finally:
        fl.set_cpu_fallback(True)


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("where", ["FL_CONFIG", "./torch_fl.toml"])
def test_a_config_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path, where):
    fifo = tmp_path / "torch_fl.toml"
    os.mkfifo(fifo)
    env = {"FL_CONFIG": str(fifo)} if where == "FL_CONFIG" else {}
    r = run_py("import torch_fl as fl; fl.initialize()", env=env, cwd=str(tmp_path), timeout=120)
    assert r.returncode != 0
    assert f"ConfigError: config file {fifo} is not a regular file" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow  # a subprocess
def test_a_compiler_launcher_in_cxx_builds_the_core(tmp_path):
    """CXX="ccache g++" (a launcher word first, as make takes it) ran `ccache -O2 ...` and failed."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    r = run_py(
        "import torch, torch_fl as fl; fl.initialize('cpu'); print((torch.ones(2, device='fl') + 1).sum().item())",
        env={"CXX": "env g++", "FL_CACHE_DIR": str(tmp_path / "cache")},
        timeout=600,
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("4.0"), r.stderr[-2000:]
