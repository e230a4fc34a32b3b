"""Issue 18: the opt-in cuda alias (torch_fl/cuda_alias/). Code written for NVIDIA -- the scripts in
tests/cuda_alias/cuda_scripts/, which never import torch_fl -- runs on every fl backend with FL_ALIAS_CUDA=1, each
backend in its own process; its numbers are judged against the same script run by plain CPU PyTorch.

The alias changes torch.cuda for a whole process, so every test runs in a subprocess: this pytest
process never turns it on."""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import run_py

import torch_fl as fl

pytestmark = pytest.mark.slow  # a process per script and backend

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "cuda_scripts")
BACKENDS = ["cpu", "rocm", "ascend", "minimal"]
ALIAS_LINE = "torch_fl: cuda alias on:"
NOT_COVERED = "is not covered by torch_fl's cuda alias"

# Runs scripts one after another in this process (one interpreter start per backend, not per script), each
# with its own argv, and prints {script: the JSON line it printed}.
DRIVER = textwrap.dedent("""
    import contextlib, io, json, os, runpy, sys
    results = {}
    for spec in sys.argv[1:]:
        path, *argv = spec.split("::")
        sys.argv = [path, *argv]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        results[os.path.basename(path)] = json.loads(out.getvalue().strip().splitlines()[-1])
    print(json.dumps(results))
""")


def run(args: list[str], env: dict | None = None, timeout: int = 600, cwd: str | None = None):
    """A fresh interpreter with no FL_* settings but the caches, plus `env` (a value None removes it)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("FL_") or k in ("FL_CACHE_DIR", "FL_JIT_CACHE")}
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    full.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=full, timeout=timeout, cwd=cwd or HERE
    )


def run_code(code: str, env: dict | None = None, timeout: int = 300):
    return run(["-c", textwrap.dedent(code)], env, timeout)


def last_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def alias_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(ALIAS_LINE)]


@pytest.fixture(scope="module")
def cuda_checkpoint(tmp_path_factory) -> str:
    """A checkpoint as a CUDA machine writes it: its storage is tagged 'cuda:0' (saved here by giving
    torch.save a tagger that says so, in a plain-PyTorch process)."""
    path = str(tmp_path_factory.mktemp("ckpt") / "cuda_ckpt.pt")
    r = run_code(
        f"""
        import torch
        torch.serialization.register_package(0, lambda s: "cuda:0" if s.device.type == "cpu" else None,
                                             lambda obj, location: None)
        torch.save({{"w": torch.arange(4.0)}}, {path!r})
    """,
        {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture(scope="module")
def reference() -> dict:
    """The training scripts as plain PyTorch runs them on a machine without a GPU (torch_fl not loaded)."""
    r = run(
        ["-c", DRIVER, os.path.join(SCRIPTS, "train_amp.py"), os.path.join(SCRIPTS, "causal_lm.py")],
        {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    out = last_json(r)
    assert out["train_amp.py"]["device"] == "cpu" and out["causal_lm.py"]["device"] == "cpu"
    return out


@pytest.fixture(scope="module", params=BACKENDS)
def aliased(request, cuda_checkpoint):
    """(backend, {script: its JSON}, stderr): the three CUDA scripts in one process per backend, with
    FL_ALIAS_CUDA=1 FL_BACKEND=<backend> and nothing else: `import torch` alone turns the alias on."""
    backend = request.param
    r = run(
        [
            "-c",
            DRIVER,
            os.path.join(SCRIPTS, "train_amp.py"),
            os.path.join(SCRIPTS, "causal_lm.py"),
            f"{os.path.join(SCRIPTS, 'cuda_api.py')}::{cuda_checkpoint}",
        ],
        {"FL_ALIAS_CUDA": "1", "FL_BACKEND": backend},
    )
    return backend, last_json(r), r.stderr


def devices(backend: str) -> list[str]:
    """cuda:N under the alias is the backend's N-th fl device."""
    out = []
    while True:
        try:
            out.append(str(fl.device(backend, len(out))))
        except ValueError:
            return out


def test_the_alias_says_once_which_backend_cuda_runs_on(aliased):
    backend, _, stderr = aliased
    lines = alias_lines(stderr)
    mapping = ", ".join(f"cuda:{i} -> {d}" for i, d in enumerate(devices(backend)))
    assert lines == [
        f"{ALIAS_LINE} 'cuda' runs on fl backend '{backend}' ({mapping}); tensors report their real device (fl:N)"
    ], stderr[-3000:]


def test_training_loop_with_autocast_and_grad_scaler(aliased, reference):
    backend, out, _ = aliased
    got, ref = out["train_amp.py"], reference["train_amp.py"]
    amp = fl.amp.autocast_dtype(backend)  # the capability table's choice: what autocast("cuda") runs in
    assert got["device"] == devices(backend)[0]
    assert got["logits_dtype"] == str(amp) and ref["logits_dtype"] == "torch.float32"
    assert all(got["pinned"]) and len(got["pinned"]) == 8  # DataLoader(pin_memory=True) pinned every batch
    assert got["scale"] is not None and math.isfinite(got["scale"]) and got["scale"] > 0  # the scaler ran
    tol = 4 * torch.finfo(amp).eps  # a few roundings of the autocast dtype, against CPU float32
    for step, (a, b) in enumerate(zip(got["losses"], ref["losses"], strict=True)):
        assert abs(a - b) <= tol * abs(b), (backend, step, a, b, tol)
    memory = got["memory"]
    assert memory["peak"] >= memory["allocated"] > 0 and memory["peak_after_reset"] <= memory["peak"]


def test_causal_lm_fine_tunes_and_generates(aliased, reference):
    backend, out, _ = aliased
    got, ref = out["causal_lm.py"], reference["causal_lm.py"]
    first = devices(backend)[0]
    assert got["device"] == got["logits_device"] == got["generated_device"] == first
    for a, b in zip(got["losses"], ref["losses"], strict=True):
        assert abs(a - b) <= 1e-4 * abs(b), (backend, got["losses"], ref["losses"])
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    assert got["generated"] == ref["generated"]  # greedy decoding picks the same tokens


def test_torch_cuda_answers_for_the_backend(aliased):
    backend, out, _ = aliased
    facts = out["cuda_api.py"]
    devs = devices(backend)
    first, last = devs[0], devs[-1]
    name = torch.fl.get_device_name(torch.device(first).index)
    assert facts["available"] and facts["initialized"]
    assert facts["count"] == len(devs) and facts["current"] == 0 and facts["name"] == name
    props = torch.fl.get_device_properties(torch.device(first).index)
    assert facts["props"] == [name, props.total_memory, props.compute_units]
    assert facts["mem_get_info"] == [True, True]
    assert facts["devices"] == {
        "str": first,
        "str_last": last,
        "torch_device": last,
        "int": last,
        "tensor_cuda": first,
        "tensor_cuda_last": last,
        "tensor_cuda_kw": last,
        "storage_cuda": last,
        "tensor_to": first,
        "tensor_to_kw": last,
        "like": first,
        "new": first,
        "module_cuda": first,
        "module_to_int": last,
        "is_cuda": False,
        "type": "fl",
        "default_device": first,
        "device_context": last,
    }
    assert facts["legacy"] == [
        [first, "torch.float32"],
        [first, "torch.float16"],
        [first, "torch.int64"],
        [1, 2],
        False,
        "torch.FloatTensor",
        True,
    ]
    assert facts["legacy_default"] == [first, "torch.float64", "cpu", "torch.float32"]
    assert facts["legacy_int_default"] == ["TypeError", "only floating-point types are supported as the default type"]
    assert facts["after_set_device"] == [len(devs) - 1, last]
    assert facts["in_device_block"] == 0 and facts["after_device_block"] == len(devs) - 1
    assert facts["seeded_repeat"] and facts["state_roundtrip"] and facts["initial_seed"] == 7
    assert facts["streams"] == {
        "inside_is_s": True,
        "restored": True,
        "default_is_current": True,
        "isinstance": [True, True, True],
        "elapsed_ms_nonnegative": True,
        "query": True,
    }
    amp = str(fl.amp.autocast_dtype(backend))
    assert facts["autocast"] == [amp, amp, True, True] and facts["autocast_after"] is False
    assert facts["bf16_supported"] == ("bfloat16" in props.dtype_names)
    # allow_tf32 / "high" precision are accepted, and an fl device still multiplies float32 in float32:
    # TF32 (10-bit mantissa) would be off by about 1e-3
    assert facts["matmul_rel_error_with_tf32_allowed"] < 1e-5
    assert facts["scaler_device"] == "fl" and facts["custom_fwd_dtype"] == "torch.float32"
    assert facts["load"] == {
        "plain": first,
        "map_location_cuda": first,
        "map_location_device": last,
        "map_location_fn": first,
        "map_location_cpu": "cpu",
        "values": [0.0, 1.0, 2.0, 3.0],
    }
    assert facts["pinned"] is True
    assert facts["memory_summary_first_line"] == f"fl memory summary: cuda:0 = {first} ({name})"
    assert facts["cpu_generator_still_works"] is True
    for key in ("missing_device", "missing_set_device"):
        assert facts[key] == [
            "FlError",
            f"cuda:{len(devs)} does not exist: torch_fl's cuda alias runs 'cuda' on "
            f"fl backend '{backend}', which has {len(devs)} device(s) (cuda:0 to "
            f"cuda:{len(devs) - 1})",
        ]


# the feature each uncovered call is named by in its error, and a word of what to do instead
UNCOVERED = {
    "torch.cuda.CUDAGraph": ("torch.cuda.CUDAGraph", "eagerly"),
    "torch.cuda.graph": ("torch.cuda.graph", "eagerly"),
    "torch.cuda.make_graphed_callables": ("torch.cuda.make_graphed_callables", "eagerly"),
    "torch.cuda.graphs.graph_pool_handle": ("graph_pool_handle", "eagerly"),
    "torch.cuda.nccl.all_reduce": ("torch.cuda.nccl.all_reduce", "init_process_group('nccl')"),
    "torch.cuda.nccl.version": ("torch.cuda.nccl.version", "init_process_group('nccl')"),
    "torch.cuda.jiterator._create_jit_fn": ("torch.cuda.jiterator._create_jit_fn", "PyTorch ops"),
    "torch.utils.cpp_extension.CUDAExtension": ("torch.utils.cpp_extension.CUDAExtension", "plugin"),
    "torch.utils.cpp_extension.load_inline": ("load_inline with cuda_sources", "plugin"),
    "torch.utils.cpp_extension.load": ("load with .cu sources", "plugin"),
    "torch.cuda.nvtx.range_push": ("torch.cuda.nvtx.range_push", "record_function"),
    "torch.cuda.get_device_capability": ("torch.cuda.get_device_capability", "is_bf16_supported"),
    "torch.cuda.get_device_properties().major": ("get_device_properties().major", "is_bf16_supported"),
    "torch.nn.DataParallel": ("torch.nn.DataParallel", "DistributedDataParallel"),
    "torch.Generator(device='cuda')": ("torch.Generator(device='cuda')", "CPU generator"),
    "torch.cuda.sparse.FloatTensor": ("torch.cuda.sparse.FloatTensor", "dense on 'cuda'"),
    "torch.cuda.ExternalStream": ("torch.cuda.ExternalStream", "torch.cuda.Stream()"),
    "torch.cuda.set_per_process_memory_fraction": ("set_per_process_memory_fraction", "FL_MEMORY_POOL_LIMIT"),
    "torch.cuda.utilization": ("torch.cuda.utilization", "mem_get_info"),
    "torch.cuda.memory_stats_as_nested_dict": ("torch.cuda.memory_stats_as_nested_dict", "CUDA runtime"),
    "init_process_group(device_id=)": (
        "torch.distributed.init_process_group(..., device_id=...)",
        "torch.cuda.set_device(local_rank)",
    ),
}


def test_what_the_alias_does_not_cover_raises_naming_the_feature(aliased):
    backend, out, _ = aliased
    outcomes = out["cuda_api.py"]["unsupported"]
    assert set(outcomes) == set(UNCOVERED)
    for call, (kind, message) in outcomes.items():
        feature, instead = UNCOVERED[call]
        # get_device_properties().major is an AttributeError, so getattr(props, "major", default) still works
        assert kind == ("AttributeError" if call.endswith(".major") else "UnsupportedCudaFeatureError"), call
        assert feature in message and NOT_COVERED in message and f"fl backend '{backend}'" in message, message
        assert instead in message, (call, message)


# -- DDP with torchrun over 'nccl' ----------------------------------------------------------------------------


def ddp_reference(steps: int = 3) -> dict[str, torch.Tensor]:
    """What DDP over 2 ranks computes: SGD on the mean of the ranks' losses, i.e. on their batches together,
    in float64 from the same initial weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        xs, ys = [], []
        for rank in range(2):
            g = torch.Generator().manual_seed(100 * step + rank)
            xs.append(torch.randn(8, 16, generator=g))
            ys.append(torch.randn(8, 4, generator=g))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.cat(xs).double()), torch.cat(ys).double()).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("backend", ["rocm", "ascend", "minimal"])
def test_ddp_script_over_nccl_launched_with_torchrun(backend, tmp_path):
    """Two ranks, each on its own device of the backend (`torch.cuda.set_device(local_rank)`), so the backend
    needs two devices: rocm has two, ascend and minimal get a second from FL_ASCEND_DEVICES /
    FL_MINIMAL_DEVICES (rocm: the plugin's collectives; ascend and minimal: the CPU relay). The cpu backend
    has one device, where cuda:1 raises as on a one-GPU machine (test_torch_cuda_answers_...)."""
    env = {
        "FL_ALIAS_CUDA": "1",
        "FL_BACKEND": backend,
        "FL_MINIMAL_DEVICES": "2" if backend == "minimal" else None,
        "FL_ASCEND_DEVICES": "2" if backend == "ascend" else None,
    }
    r = run(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            os.path.join(SCRIPTS, "ddp_nccl.py"),
            str(tmp_path),
        ],
        env,
        cwd=str(tmp_path),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    ranks = [torch.load(tmp_path / f"rank{i}.pt") for i in range(2)]
    devs = devices(backend) if backend == "rocm" else None
    for i, out in enumerate(ranks):
        assert out["pg_backend"] == "fl" and out["world"] == 2 and out["current_device"] == i
        assert out["nccl"] is True and out["group_backend"] == "fl" and out["group_sum"] == [3.0, 3.0]
        assert out["sum_device"] == out["device"]
        if devs is not None:
            assert out["device"] == devs[i]
    assert ranks[0]["device"] != ranks[1]["device"]
    said = [
        line for line in r.stderr.splitlines() if "process group backend 'nccl' runs as the fl process group" in line
    ]
    assert len(said) == 2 and all(f"on backend '{backend}'" in line for line in said), r.stderr[-3000:]
    expected = ddp_reference()
    for k, v in expected.items():
        assert torch.equal(ranks[0]["params"][k], ranks[1]["params"][k]), k  # DDP kept the ranks in step
        err = (ranks[0]["params"][k].double() - v).abs().max() / v.abs().max()
        assert err < 1e-5, (k, err.item())


# -- turning it on and off ------------------------------------------------------------------------------------


def test_off_by_default_cuda_stays_cuda():
    for value in (None, "0", "off", ""):
        r = run_code(
            """
            import torch
            print(torch.cuda.is_available(), torch.ones(1, device="fl").device)
            try:
                torch.zeros(1, device="cuda")
            except (AssertionError, RuntimeError) as e:
                print(type(e).__name__, e)
        """,
            {"FL_ALIAS_CUDA": value},
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["False fl:0", "AssertionError Torch not compiled with CUDA enabled"]
        assert not alias_lines(r.stderr), r.stderr


def test_alias_cuda_from_python_follows_the_current_backend_and_threads_opt_in():
    r = run_code("""
        import threading, torch, torch_fl as fl
        import torch.utils.cpp_extension  # imported before the alias: patched at once, not on import
        from torch_fl.cuda_alias import UnsupportedCudaFeatureError, is_active
        print(is_active(), torch.cuda.is_available())
        fl.set_backend("rocm")
        print(fl.alias_cuda(), fl.alias_cuda(), is_active(), torch.zeros(1, device="cuda:1").device,
              torch.backends.cuda.matmul.allow_tf32)  # TF32 stays off by default, as on CUDA
        try:
            torch.utils.cpp_extension.CUDAExtension("k", ["k.cu"])
        except UnsupportedCudaFeatureError as e:
            print(str(e).split(" is not covered")[0])
        try:  # what PyTorch's C++ calls when a CUDA device got past the mapping in a thread that has it
            torch.cuda._lazy_init()
        except AssertionError as e:
            print(e)
        fl.set_backend("minimal")  # 'cuda' follows the current backend
        print(torch.cuda.device_count(), torch.ones(1).cuda().device, torch.cuda.get_device_name())
        seen = []
        def worker():  # TorchFunctionMode stacks are per thread: a new thread opts in with alias_cuda()
            try:
                torch.zeros(1, device="cuda")
            except fl.cuda_alias.CudaAliasError as e:
                seen.append(str(e))
            fl.alias_cuda()
            seen.append(str(torch.zeros(1, device="cuda").device))
        t = threading.Thread(target=worker)
        t.start(); t.join()
        print(seen)
    """)
    assert r.returncode == 0, r.stderr
    minimal = devices("minimal")[0]
    assert r.stdout.splitlines() == [
        "False False",
        f"rocm rocm True {devices('rocm')[1]} False",
        "torch.utils.cpp_extension.CUDAExtension",
        "Torch not compiled with CUDA enabled",
        f"1 {minimal} {torch.fl.get_device_name(torch.device(minimal).index)}",
        f"[\"'cuda' reached PyTorch in a thread where torch_fl's cuda alias is not entered (its device mode is per "
        f'thread, like every TorchFunctionMode): call torch_fl.alias_cuda() at the start of this thread", '
        f"'{minimal}']",
    ]
    assert len(alias_lines(r.stderr)) == 1 and "fl backend 'rocm'" in r.stderr


def test_a_real_cuda_device_keeps_the_alias_off_unless_forced():
    """A machine with an NVIDIA GPU is played by making torch.cuda.is_available() answer True before torch_fl
    is imported (autoload off, so the import is the one that reads FL_ALIAS_CUDA)."""
    code = """
        import torch
        torch.cuda.is_available = lambda: True  # what PyTorch answers on a machine with an NVIDIA GPU
        import torch_fl as fl
        from torch_fl.cuda_alias import CudaAliasError, is_active
        print("active", is_active())
        if not is_active():
            try:
                fl.alias_cuda()
            except CudaAliasError as e:
                print("refused", e)
            print("forced", fl.alias_cuda(force=True), torch.zeros(1, device="cuda").device)
    """
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "FL_BACKEND": "rocm"}
    r = run_code(code, {**env, "FL_ALIAS_CUDA": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "active False"
    assert lines[1].startswith("refused torch_fl's cuda alias stays off: this PyTorch sees a real CUDA device")
    assert "alias_cuda(force=True)" in lines[1] and "FL_ALIAS_CUDA=force" in lines[1]
    assert lines[2] == f"forced rocm {devices('rocm')[0]}"
    assert (
        "torch_fl: FL_ALIAS_CUDA=1 ignored: this PyTorch sees a real CUDA device, so 'cuda' stays CUDA "
        "(FL_ALIAS_CUDA=force aliases it anyway)"
    ) in r.stderr.splitlines()
    r = run_code(code, {**env, "FL_ALIAS_CUDA": "force"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["active True"] and len(alias_lines(r.stderr)) == 1


def test_a_bad_value_is_a_config_error_and_costs_import_torch_only_a_warning():
    message = (
        "FL_ALIAS_CUDA='maybe' is not valid: use 1 to alias 'cuda' to the active fl backend, force to do "
        "so even over a real CUDA device, or 0 to leave it off"
    )
    r = run_code("import torch_fl", {"FL_ALIAS_CUDA": "maybe", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode != 0 and f"torch_fl.errors.ConfigError: {message}" in r.stderr, r.stderr[-2000:]
    r = run_code("import torch; print(torch.cuda.is_available(), hasattr(torch, 'fl'))", {"FL_ALIAS_CUDA": "maybe"})
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr
    assert f"torch_fl could not register the fl device at `import torch`: ConfigError: {message}" in r.stderr


def test_torch_fl_imported_before_torch_turns_the_alias_on_once():
    """`import torch_fl` first (or `python -m torch_fl.cli`) imports torch from inside torch_fl's import, so the
    autoload entry point meets a half-initialised torch_fl: it leaves the alias to torch_fl's own import."""
    r = run_code(
        "import torch_fl, torch; print(torch.cuda.is_available(), torch.ones(1).cuda().device)",
        {"FL_ALIAS_CUDA": "1", "FL_BACKEND": "minimal"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", devices("minimal")[0]]
    assert len(alias_lines(r.stderr)) == 1 and "Warning" not in r.stderr, r.stderr[-3000:]
    r = run(["-m", "torch_fl.cli", "explain", "aten::add.Tensor"], {"FL_ALIAS_CUDA": "1", "FL_BACKEND": "minimal"})
    assert r.returncode == 0 and "aten::add.Tensor (float32) on backend 'minimal'" in r.stdout, r.stderr[-3000:]
    assert len(alias_lines(r.stderr)) == 1 and "Warning" not in r.stderr, r.stderr[-3000:]


def test_an_alias_that_cannot_turn_on_at_import_torch_leaves_the_fl_device():
    r = run_code(
        "import torch; print(torch.cuda.is_available(), hasattr(torch, 'fl'))",
        {"FL_ALIAS_CUDA": "1", "FL_BACKEND": "nvidia"},
    )
    assert r.returncode == 0 and r.stdout.split() == ["False", "True"], r.stderr
    assert (
        "torch_fl's cuda alias (FL_ALIAS_CUDA) could not turn on at `import torch`: BackendNotFoundError: "
        "unknown fl backend 'nvidia'"
    ) in r.stderr, r.stderr[-2000:]


def test_magic_fl_backend_as_cuda():
    r = run_code("""
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.error import UsageError
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "fl_magics")
        import torch
        print(torch.cuda.is_available())
        shell.run_line_magic("fl_backend", "rocm --as-cuda")
        print(torch.cuda.is_available(), torch.zeros(2, device="cuda").device)
        shell.run_line_magic("fl_backend", "minimal")
        print(torch.ones(1).cuda().device)
        try:
            shell.run_line_magic("fl_backend", "--as-cuda --move x")
        except UsageError as e:
            print("UsageError", e)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [
        "False",
        f"fl backend: rocm ({devices('rocm')[0]}); 'cuda' runs here too (cuda alias)",
        f"True {devices('rocm')[0]}",
        f"fl backend: minimal ({devices('minimal')[0]}); 'cuda' runs here too (cuda alias)",
        devices("minimal")[0],
        "UsageError --move needs a backend to move to: %fl_backend NAME --move ...",
    ]
    assert len(alias_lines(r.stderr)) == 1
    r = run_code("""
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.error import UsageError
        import torch
        torch.cuda.is_available = lambda: True  # a machine with an NVIDIA GPU
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "fl_magics")
        try:
            shell.run_line_magic("fl_backend", "--as-cuda")
        except UsageError as e:
            print("UsageError", e)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("UsageError torch_fl's cuda alias stays off: this PyTorch sees a real CUDA"), r.stdout


def test_a_failure_while_turning_on_leaves_torch_cuda_as_it_was():
    """No half-done alias: if installing the replacements fails part-way (here the distributed step), every
    replacement made so far is undone and the error goes on."""
    r = run_code("""
        import torch, torch_fl as fl
        from torch_fl import cuda_alias
        from torch_fl.cuda_alias import parallel, state
        before = (torch.cuda.is_available, torch.cuda.device_count, torch.amp.GradScaler.__init__,
                  torch.Generator, torch.UntypedStorage.__dict__.get("__new__"))
        def broken():
            raise RuntimeError("simulated failure")
        parallel.patch_distributed = broken
        try:
            fl.alias_cuda()
        except RuntimeError as e:
            print("raised", e)
        after = (torch.cuda.is_available, torch.cuda.device_count, torch.amp.GradScaler.__init__,
                 torch.Generator, torch.UntypedStorage.__dict__.get("__new__"))
        print(cuda_alias.is_active(), torch.cuda.is_available(), before == after, len(state.ORIGINALS))
        try:
            torch.zeros(1, device="cuda")
        except AssertionError as e:
            print(e)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [
        "raised simulated failure",
        "False False True 0",
        "Torch not compiled with CUDA enabled",
    ]
    assert not alias_lines(r.stderr)


def test_information_is_not_an_error_box_in_a_notebook():
    """The alias's one-line notice went to stderr, which JupyterLab renders as a red error box. Inside a
    Jupyter kernel it goes to stdout; where the application configured logging, through the `torch_fl`
    logger; in a terminal, to stderr as before."""
    r = run_py("""
        import sys, types
        sys.modules["ipykernel"] = types.ModuleType("ipykernel")  # what a Jupyter kernel has imported
        from torch_fl.notice import notice
        notice("torch_fl: a notice")
    """)
    assert "torch_fl: a notice" in r.stdout and "a notice" not in r.stderr, (r.stdout, r.stderr)
    r = run_py("""
        import logging
        logging.basicConfig(level=logging.INFO, format="LOGGED %(name)s %(message)s")
        from torch_fl.notice import notice
        notice("torch_fl: a notice")
    """)
    assert "LOGGED torch_fl torch_fl: a notice" in r.stderr and "a notice" not in r.stdout, (r.stdout, r.stderr)
    r = run_py("from torch_fl.notice import notice\nnotice('torch_fl: a notice')")
    assert "torch_fl: a notice" in r.stderr
