"""Bad input gets a clear error and the process stays usable."""

import re

import pytest
import torch
from conftest import run_py

import torch_fl as fl


def test_unknown_backend_lists_choices():
    with pytest.raises(fl.BackendNotFoundError, match=r"unknown fl backend 'nosuch'; available backends: .*cpu"):
        fl.initialize("nosuch")
    assert fl.initialize("cpu") == "cpu"  # still usable


@pytest.mark.slow  # a subprocess
def test_unknown_fl_backend_env():
    r = run_py(
        """
        import torch_fl as fl
        try:
            fl.initialize()
        except fl.BackendNotFoundError as e:
            print("ERR", e)
    """,
        env={"FL_BACKEND": "warp9"},
    )
    assert "ERR unknown fl backend 'warp9'; available backends: cpu" in r.stdout, r.stderr


@pytest.mark.slow  # a subprocess
def test_config_file_selects_backend(tmp_path):
    cfg = tmp_path / "torch_fl.toml"
    cfg.write_text('backend = "nope"\n')
    r = run_py(
        """
        import torch_fl as fl
        try:
            fl.initialize()
        except fl.BackendNotFoundError as e:
            print("ERR", str(e).splitlines()[0])
    """,
        env={"FL_CONFIG": str(cfg)},
    )
    assert "ERR unknown fl backend 'nope'" in r.stdout, r.stderr
    cfg.write_text('backend = "cpu"\ncpu_fallback = false\n')
    r = run_py("import torch_fl as fl; print(fl.initialize(), fl.cpu_fallback_enabled())", env={"FL_CONFIG": str(cfg)})
    assert r.stdout.split() == ["cpu", "False"], r.stderr


@pytest.mark.slow  # a subprocess
def test_rejected_plugins_are_listed_with_reasons(test_plugins):
    r = run_py(
        """
        import torch_fl as fl
        for e in fl.list_backends():
            print(e["status"], e["path"].rsplit("/", 1)[-1], "|", e["reason"])
    """,
        env={"FL_PLUGIN_PATH": str(test_plugins)},
    )
    out = r.stdout
    assert r.returncode == 0, r.stderr
    lines = {line.split()[1]: line for line in out.splitlines()}
    assert lines["libfl_cpu.so"].startswith("loaded")
    assert lines["liberrplugin.so"].startswith("loaded")
    assert "ABI version 99" in lines["libbad_abi.so"] and lines["libbad_abi.so"].startswith("rejected")
    assert "missing exported symbol(s) fl_plugin_init" in lines["libmissing_symbol.so"]
    assert "required entry point(s) left NULL: device_count" in lines["libmissing_entry.so"]
    assert "not a loadable shared library" in lines["libnot_a_plugin.so"]


@pytest.mark.slow  # a subprocess
def test_kernel_error_names_op_and_message(test_plugins):
    r = run_py(
        """
        import torch, torch_fl as fl
        fl.initialize("errdev")
        a = torch.ones(3, device="fl")
        try:
            a * a
        except fl.KernelError as e:
            print("ERR", e)
        print("ADD", (a + a).cpu().tolist())     # the add kernel declines: another path serves it
        print("EXPLAIN", fl.explain("add.Tensor").path)
    """,
        env={"FL_PLUGIN_PATH": str(test_plugins)},
    )
    assert (
        "ERR fl backend 'errdev': kernel aten::mul.Tensor failed with FL_ERR_INTERNAL: "
        "errdev: the multiplier unit is on fire" in r.stdout
    ), r.stderr
    assert "ADD [2.0, 2.0, 2.0]" in r.stdout
    assert "EXPLAIN native" in r.stdout


@pytest.mark.slow  # a subprocess
def test_out_of_memory_leaves_process_usable(test_plugins):
    r = run_py(
        """
        import torch, torch_fl as fl
        fl.initialize("errdev")
        try:
            torch.empty(1 << 20, device="fl")
        except torch.OutOfMemoryError as e:
            print("OOM", e)
        x = torch.ones(10, device="fl")
        print("OK", x.cpu().sum().item(), torch.fl.memory_allocated(x.device))
    """,
        env={"FL_PLUGIN_PATH": str(test_plugins)},
    )
    assert re.search(r"OOM fl:\d \(errdev\) out of memory: tried to allocate 4\.0 MiB", r.stdout), r.stdout + r.stderr
    assert "errdev holds 1 MiB" in r.stdout
    assert "OK 10.0 48" in r.stdout


@pytest.mark.slow  # a subprocess
def test_host_plugin_memory_limit():
    r = run_py(
        """
        import torch, torch_fl as fl
        fl.initialize("cpu")
        try:
            torch.empty(64 << 20, device="fl")
        except torch.OutOfMemoryError as e:
            print("OOM", e)
        print("OK", torch.ones(4, device="fl").sum().item())
    """,
        env={"FL_CPU_MEMORY_LIMIT": "64M"},
    )
    assert "OOM fl:0 (cpu) out of memory: tried to allocate 256.0 MiB" in r.stdout, r.stdout + r.stderr
    assert "OK 4.0" in r.stdout


@pytest.mark.slow  # a subprocess
def test_mixing_backends_is_an_error(test_plugins):
    r = run_py(
        """
        import torch, torch_fl as fl
        a = torch.ones(3, device=fl.device("cpu"))
        b = torch.ones(3, device=fl.device("errdev"))
        try:
            a - b
        except RuntimeError as e:
            print("ERR", e)
        print("MOVED", (a - b.to(a.device)).cpu().tolist())
    """,
        env={"FL_PLUGIN_PATH": str(test_plugins)},
    )
    # PyTorch's own check (structured ops compare devices before any backend runs), each fl device named
    assert re.search(
        r"ERR Expected all tensors to be on the same device, but found at least two devices, fl:0 "
        r"\(cpu\) and fl:\d \(errdev\)! \(when checking arguments for aten::sub.Tensor\)",
        r.stdout,
    ), r.stdout + r.stderr
    assert "MOVED [0.0, 0.0, 0.0]" in r.stdout


def test_mixing_cpu_and_fl_is_an_error():
    a = torch.ones(3, device="fl")
    with pytest.raises(
        RuntimeError,
        match=r"Expected all tensors to be on the same device.*fl:0 \(\w+\) and cpu! "
        r"\(when checking arguments for aten::add.Tensor\)\. Move the cpu tensor "
        r"with \.to\('fl:0'\) first\.",
    ):
        a + torch.ones(3)
    assert (a + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]  # 0-dim CPU scalars are allowed


@pytest.mark.parametrize("op", ["add", "add_", "mul", "eq", "pow", "maximum", "lerp", "addcmul", "mse_loss"])
def test_mixing_two_fl_backends_names_both_in_every_form(op):
    """The functional and in-place forms of PyTorch's structured ops (add, mul, eq, ...) check devices in
    PyTorch's shared composite kernel, before torch_fl: their error said only "fl:3 and fl:2"."""
    a, b = torch.ones(3, device=fl.device("rocm")), torch.ones(3, device=fl.device("minimal"))
    calls = {
        "add": lambda: a + b,
        "add_": lambda: a.add_(b),
        "mul": lambda: a * b,
        "eq": lambda: a == b,
        "pow": lambda: a**b,
        "maximum": lambda: torch.maximum(a, b),
        "lerp": lambda: torch.lerp(a, b, 0.5),
        "addcmul": lambda: torch.addcmul(a, a, b),
        "mse_loss": lambda: torch.nn.functional.mse_loss(a, b),
    }
    with pytest.raises(RuntimeError) as info:
        calls[op]()
    message = str(info.value)
    assert f"found at least two devices, {a.device} (rocm) and {b.device} (minimal)!" in message, message
    assert message.endswith("Move one with .to() first.") and message.count("(rocm)") == 1, message
    assert torch.equal((a + b.to(a.device)).cpu(), torch.full((3,), 2.0))  # and nothing else changed


@pytest.mark.slow  # a subprocess
def test_privateuse1_taken_by_another_package():
    r = run_py(
        """
        import torch
        torch.utils.rename_privateuse1_backend("npu")
        try:
            import torch_fl
        except Exception as e:
            print(type(e).__name__, e)
    """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )  # the other package got there first
    assert "PrivateUse1TakenError PyTorch's PrivateUse1 device slot is already owned by 'npu'" in r.stdout, r.stderr
    # with autoload, torch_fl registers fl at `import torch`: the other package is told, PyTorch's words
    r = run_py("""
        import torch
        try:
            torch.utils.rename_privateuse1_backend("npu")
        except RuntimeError as e:
            print("ERR", e)
    """)
    assert "ERR torch.register_privateuse1_backend() has already been set! Current backend: fl" in r.stdout, r.stderr


def test_cpu_fallback_off_raises_clearly():
    from torch_fl.runtime import disabled_paths

    x = torch.randn(5, device="fl")
    fl.set_cpu_fallback(False)
    try:  # with every device path switched off, only the CPU fallback could serve cumprod
        with (
            disabled_paths("native", "decomposition", "jit"),
            pytest.raises(
                NotImplementedError, match=r"aten::cumprod \(float32\) cannot run on fl backend .cpu.*no JIT kernel"
            ),
        ):
            torch.cumprod(x, 0)
    finally:
        fl.set_cpu_fallback(True)
    assert torch.cumprod(x, 0).device.type == "fl"


@pytest.mark.slow  # a subprocess
def test_cpu_fallback_env_switch():
    r = run_py(
        """
        import torch, torch_fl as fl
        from torch_fl.runtime import disabled_paths
        print(fl.cpu_fallback_enabled())
        x = torch.ones(3, device="fl")
        try:
            with disabled_paths("native", "decomposition", "jit"):
                torch.cumprod(x, 0)
        except NotImplementedError as e:
            print("NIE", e)
    """,
        env={"FL_CPU_FALLBACK": "0"},
    )
    assert r.stdout.startswith("False"), r.stderr
    assert "NIE aten::cumprod" in r.stdout and "FL_CPU_FALLBACK=0" in r.stdout


@pytest.mark.slow  # a subprocess
def test_bad_env_value():
    """Every FL_* variable is checked at import, before any plugin loads (tests/runtime/test_config.py)."""
    r = run_py("import torch_fl", env={"FL_CPU_FALLBACK": "maybe"})
    assert r.returncode != 0
    assert "ConfigError: FL_CPU_FALLBACK='maybe' is not a boolean: use 1 or 0" in r.stderr, r.stdout + r.stderr


def test_explain_rejects_unknown_ops():
    with pytest.raises(ValueError, match="unknown operator"):
        fl.explain("not_an_op")
    with pytest.raises(ValueError, match="unknown operator"):
        fl.explain("fl::not_a_fused_op")
    with pytest.raises(ValueError, match="has no overload"):
        fl.explain("add.Nope")


def test_explain_given_tensors_says_what_it_takes():
    """fl.explain(op, w, i), as if it ran the op, once failed inside with 'Boolean value of Tensor ... ambiguous'."""
    w, i = torch.randn(10, 4).to("fl"), torch.tensor([[1, 2]]).to("fl")
    with pytest.raises(TypeError, match="backend must be a backend name such as 'minimal', not Tensor"):
        fl.explain(torch.ops.aten.embedding.default, w, i)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype or its name .* not Tensor"):
        fl.explain("embedding", (torch.float32, i))
    assert "embedding" in str(fl.explain("embedding", ("float32", torch.int64), "minimal"))


def test_sparse_tensors_on_fl_get_a_clear_error():
    csr = torch.eye(3).to_sparse_csr().to("fl")  # PyTorch moves the layout; torch_fl does not hold it
    assert csr.layout == torch.sparse_csr and csr.device.type == "fl"
    with pytest.raises(RuntimeError, match="torch.sparse_csr tensor on fl:0 is not supported by torch_fl"):
        torch.sparse.sampled_addmm(csr, torch.randn(3, 3, device="fl"), torch.randn(3, 3, device="fl"))


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize(
    "argv, message",
    [
        (["explain", "aten::add.Tensor", "--dtype", "float99"], "'float99' is not a torch dtype"),
        (["explain", "add"], "aten::add needs an overload name: aten::add.Tensor, aten::add.Scalar"),
        (["coverage", "--dtype", "float99"], "'float99' is not a torch dtype"),
    ],
)
def test_cli_bad_arguments_are_one_line_errors(argv, message):
    """Issue 15: a bad dtype (AttributeError) and an op without its overload (RuntimeError) were tracebacks."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "torch_fl.cli", *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"torch-fl: error: {r.stderr.strip()[17:]}"], r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_no_path_error_says_each_thing_once():
    """Issue 13: float64 randn on ascend with the fallback off repeated the op's tiers and the advice."""
    fl.set_backend("ascend")
    fl.set_cpu_fallback(False)
    try:
        with pytest.raises(NotImplementedError) as info:
            torch.randn(3, dtype=torch.float64, device="fl")
    finally:
        fl.set_cpu_fallback(True)
    msg = str(info.value)
    assert msg.startswith(
        "aten::normal_ (float64) cannot run on fl backend 'ascend': native kernel aten::normal_ does not serve float64"
    ), msg
    assert msg.count("cannot run") == 1 and msg.count("Enable the CPU fallback") == 1, msg
    assert msg.count("no JIT kernel") == 1 and msg.endswith("or use a backend that implements it."), msg


@pytest.mark.slow  # a subprocess
def test_jit_compile_failure_is_said_not_listed_as_a_kernel(tmp_path):
    """Issue 15: with no C compiler and the fallback off, the error and fl.explain listed a 'JIT-compiled
    kernel' that had failed to compile."""
    r = run_py(
        """
        import warnings, torch, torch_fl as fl
        warnings.simplefilter("ignore")
        fl.initialize("minimal")
        fl.set_cpu_fallback(False)
        x = torch.randn(4, device="fl")
        try:
            torch.cumprod(x, 0)
        except NotImplementedError as e:
            print("ERR", e)
        print(fl.explain("aten::cumprod"))
    """,
        env={"FL_JIT_CACHE": str(tmp_path), "CC": "/nonexistent/cc"},
    )
    err = next(line for line in r.stdout.splitlines() if line.startswith("ERR"))
    assert "JIT-compiled kernel" not in r.stdout, r.stdout + r.stderr
    assert "the JIT kernel for aten::cumprod failed to compile: " in err and "/nonexistent/cc" in err, err
    assert "aten::cumprod (float32) on backend 'minimal': NO PATH" in r.stdout
    assert "  - the JIT kernel for aten::cumprod failed to compile: " in r.stdout
