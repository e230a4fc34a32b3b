"""The fl device and fl tensors: creation, moves, views, memory, autograd plumbing."""

import copy
import gc
import io

import pytest
import torch
from conftest import assert_close, run_py
from torch import nn

import torch_fl as fl


def test_article_verification_script():
    fl.initialize(backend_name="auto")
    x = torch.randn(64, 128, 128).to(fl.current_device())
    y = torch.randn(64, 128, 128, device="fl")
    z = x @ y
    assert z.device == torch.device("fl", 0)
    assert type(z) is torch.Tensor  # a real PyTorch tensor on the PrivateUse1 device
    assert fl.get_current_backend_name() == "cpu"
    assert_close(z, x.cpu() @ y.cpu(), what="bmm")


def test_device_module_and_accelerator():
    assert torch.accelerator.current_accelerator().type == "fl"
    assert torch.fl.is_available()
    assert torch.fl.device_count() >= 1
    assert torch.fl.current_device() == 0
    torch.fl.synchronize()
    assert "cpu" in torch.fl.get_device_name(0)
    assert torch.float16 in torch.fl.get_amp_supported_dtype()


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool],
)
def test_roundtrip_dtypes(dtype):
    src = (torch.randn(3, 5) * 10).to(dtype)
    t = src.to("fl")
    assert t.dtype == dtype and t.device.type == "fl"
    assert torch.equal(t.cpu(), src)


def test_factories_on_every_path():
    assert torch.equal(torch.zeros(2, 3, device="fl").cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.ones(4, device="fl", dtype=torch.int64).cpu(), torch.ones(4, dtype=torch.int64))
    assert torch.equal(torch.arange(10, device="fl").cpu(), torch.arange(10))
    assert torch.equal(torch.arange(1.0, 2.0, 0.25, device="fl").cpu(), torch.arange(1.0, 2.0, 0.25))
    assert torch.equal(torch.eye(4, device="fl").cpu(), torch.eye(4))
    assert torch.equal(torch.full((2, 2), 7.5, device="fl").cpu(), torch.full((2, 2), 7.5))
    assert torch.equal(torch.linspace(0, 1, 5, device="fl").cpu(), torch.linspace(0, 1, 5))
    r = torch.randint(0, 10, (1000,), device="fl").cpu()
    assert r.min() >= 0 and r.max() < 10 and r.dtype == torch.int64
    n = torch.randn(20000, device="fl").cpu()
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05


def test_rng_seed_reproducible():
    torch.manual_seed(123)
    a = torch.randn(100, device="fl").cpu()
    torch.manual_seed(123)
    b = torch.randn(100, device="fl").cpu()
    assert torch.equal(a, b)
    state = torch.fl.get_rng_state()
    c = torch.rand(10, device="fl").cpu()
    torch.fl.set_rng_state(state)
    assert torch.equal(torch.rand(10, device="fl").cpu(), c)


def test_views_share_plugin_memory():
    base = torch.zeros(4, 6, device="fl")
    v = base[1:3, ::2]
    v.fill_(5.0)
    t = base.t()
    t[0, 0] = 9.0
    expect = torch.zeros(4, 6)
    expect[1:3, ::2] = 5.0
    expect[0, 0] = 9.0
    assert torch.equal(base.cpu(), expect)
    d = base.detach()
    d.add_(1)
    assert torch.equal(base.cpu(), expect + 1)
    assert base.view(-1).shape == (24,) and base.unsqueeze(0).shape == (1, 4, 6)
    parts = base.split(2)
    parts[1].zero_()
    assert torch.equal(base[2:].cpu(), torch.zeros(2, 6))


def test_inplace_metadata_ops():
    t = torch.arange(6.0, device="fl")
    t.resize_(2, 3)
    assert t.shape == (2, 3) and torch.equal(t.cpu(), torch.arange(6.0).view(2, 3))
    t.t_()
    assert t.shape == (3, 2)
    g = torch.empty(0, device="fl")
    g.resize_(100)
    g.fill_(1)
    assert g.cpu().sum().item() == 100


def test_memory_freed_when_last_view_dies():
    gc.collect()
    before = torch.fl.memory_allocated()
    x = torch.randn(256, 256, device="fl")
    assert torch.fl.memory_allocated() >= before + 256 * 256 * 4
    view = x[10:20]
    del x
    gc.collect()
    assert torch.fl.memory_allocated() >= before + 256 * 256 * 4  # the view keeps the buffer alive
    del view
    gc.collect()
    assert torch.fl.memory_allocated() == before
    assert torch.fl.max_memory_allocated() >= before + 256 * 256 * 4


def test_training_memory_returns_to_baseline():
    gc.collect()
    before = torch.fl.memory_allocated()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("fl")
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(8, 16, device="fl")).sum().backward()
        opt.step()
        opt.zero_grad()
    del model, opt
    gc.collect()
    assert torch.fl.memory_allocated() == before


def test_parameter_grad_detach():
    w = nn.Parameter(torch.randn(3, 3).to("fl"))
    assert isinstance(w, nn.Parameter) and w.device.type == "fl" and w.is_leaf
    (w * 2).sum().backward()
    assert w.grad.device.type == "fl"
    assert torch.equal(w.grad.cpu(), torch.full((3, 3), 2.0))
    d = w.detach()
    assert not d.requires_grad
    d.zero_()
    assert torch.equal(w.detach().cpu(), torch.zeros(3, 3))


def test_gradients_cross_devices():
    a = torch.randn(5, requires_grad=True)
    (a.to("fl") * 3).cpu().sum().backward()
    assert torch.equal(a.grad, torch.full((5,), 3.0))


def test_item_repr_tolist_deepcopy():
    t = torch.tensor([1.5, 2.5]).to("fl")
    assert t[1].item() == 2.5
    assert t.tolist() == [1.5, 2.5]
    assert "device='fl:0'" in repr(t)
    c = copy.deepcopy(t)
    c.add_(1)
    assert t.tolist() == [1.5, 2.5] and c.tolist() == [2.5, 3.5]
    with pytest.raises(TypeError, match="cpu"):
        t.numpy()


def test_state_dict_save_load():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).to("fl")
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    assert all(v.device.type == "fl" for v in sd.values())
    model2 = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).to("fl")
    model2.load_state_dict(sd)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b.cpu())
    cpu_model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    cpu_model.load_state_dict({k: v.cpu() for k, v in sd.items()})
    x = torch.randn(5, 4)
    model.eval()
    cpu_model.eval()
    assert_close(model(x.to("fl")), cpu_model(x))


def test_module_to_and_back():
    m = nn.Linear(3, 2)
    m.to("fl")
    assert m.weight.device.type == "fl" and isinstance(m.weight, nn.Parameter)
    m.cpu()
    assert m.weight.device.type == "cpu" and type(m.weight.data) is torch.Tensor


def test_memory_pool_reuses_blocks_and_empty_cache_returns_them():
    gc.collect()
    dev = fl.current_device()
    torch.fl.empty_cache()
    plugin = fl.runtime.REGISTRY.device(dev.index).plugin
    used_before = plugin.memory_used(0)
    x = torch.empty(1000, device="fl")
    del x
    gc.collect()
    stats = torch.fl.memory_stats()
    assert stats["pool.cached_bytes"] >= 4000
    assert torch.fl.memory_reserved() == torch.fl.memory_allocated() + stats["pool.cached_bytes"]
    hits = stats["pool.hits"]
    y = torch.empty(1000, device="fl")  # the same size comes back from the pool
    assert torch.fl.memory_stats()["pool.hits"] == hits + 1
    del y
    gc.collect()
    torch.fl.empty_cache()
    assert torch.fl.memory_stats()["pool.cached_bytes"] == 0
    assert plugin.memory_used(0) == used_before


@pytest.mark.slow  # a subprocess
def test_memory_pool_off_frees_at_once():
    r = run_py(
        """
        import gc, torch, torch_fl as fl
        fl.initialize("cpu")
        plugin = fl.runtime.REGISTRY.device(0).plugin
        before = plugin.memory_used(0)
        x = torch.empty(1000, device="fl")
        del x; gc.collect()
        print("SAME", plugin.memory_used(0) == before, torch.fl.memory_stats()["pool.cached_bytes"])
    """,
        env={"FL_MEMORY_POOL": "0"},
    )
    assert "SAME True 0" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow  # a subprocess
def test_oom_returns_cached_blocks_before_giving_up():
    # a 1 MiB device: a cached 200 KiB block must be handed back for a 900 KiB request
    r = run_py(
        """
        import gc, torch, torch_fl as fl
        fl.initialize("cpu")
        x = torch.empty(50 * 1024, device="fl"); del x; gc.collect()
        print("CACHED", torch.fl.memory_stats()["pool.cached_bytes"])
        y = torch.empty(225 * 1024, device="fl")
        print("OK", y.numel(), torch.fl.memory_stats()["pool.cached_bytes"])
    """,
        env={"FL_CPU_MEMORY_LIMIT": "1M"},
    )
    assert "CACHED 204800" in r.stdout, r.stdout + r.stderr
    assert "OK 230400 0" in r.stdout, r.stdout + r.stderr


def test_data_assignment_and_module_dtype_conversion():
    torch.manual_seed(0)
    ref = nn.Linear(3, 2)
    m = nn.Linear(3, 2)
    m.load_state_dict(ref.state_dict())
    m.to("fl").double()  # nn.Module._apply assigns param.data
    ref.double()
    assert m.weight.dtype == torch.float64 and m.weight.device.type == "fl"
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(m(x.to("fl")).cpu(), ref(x), rtol=1e-12, atol=1e-12)
    t = torch.zeros(4, device="fl")
    t.data = torch.ones(6, device="fl")
    assert t.cpu().tolist() == [1.0] * 6
    assert (t + 1).cpu().tolist() == [2.0] * 6


def test_pool_size_classes_limit_and_oom_message():
    from torch_fl.runtime import memory

    assert memory.size_class(40) == 48 and memory.size_class(600) == 1024
    big = memory.size_class(3 * (1 << 20) + 1)
    assert 3 * (1 << 20) < big <= 3.5 * (1 << 20)
    gc.collect()
    torch.fl.empty_cache()
    x = torch.empty(300, device="fl")  # 1200 bytes -> a 1536-byte block
    del x
    gc.collect()
    hits = torch.fl.memory_stats()["pool.hits"]
    y = torch.empty(320, device="fl")  # 1280 bytes: same class, same block
    assert torch.fl.memory_stats()["pool.hits"] == hits + 1
    del y
    gc.collect()
    torch.fl.set_memory_pool_limit(0)
    assert torch.fl.memory_stats()["pool.cached_bytes"] == 0
    z = torch.empty(300, device="fl")
    del z
    gc.collect()
    assert torch.fl.memory_stats()["pool.cached_bytes"] == 0  # nothing kept above the limit
    torch.fl.set_memory_pool_limit(1 << 30)
    with pytest.raises(ValueError, match="512M, 2G"):  # the one size parser (config.parse_size) says so
        memory.parse_bytes("lots")
    assert memory.parse_bytes("2G") == 2 << 30 and memory.parse_bytes("512MiB") == 512 << 20


@pytest.mark.slow  # a subprocess
def test_pool_limit_variable_and_oom_names_the_pool():
    r = run_py(
        """
        import gc, torch, torch_fl as fl
        fl.initialize("cpu")
        print("LIMIT", torch.fl.memory_stats()["pool.limit_bytes"])
        x = torch.empty(100 * 1024, device="fl"); del x; gc.collect()
        try:
            torch.empty(300 * 1024, device="fl")
        except torch.OutOfMemoryError as e:
            print("OOM", e)
    """,
        env={"FL_MEMORY_POOL_LIMIT": "512K", "FL_CPU_MEMORY_LIMIT": "1M"},
    )
    assert "LIMIT 524288" in r.stdout, r.stdout + r.stderr
    assert "the pool held 400.0 KiB of cached blocks and gave them back before retrying" in r.stdout, r.stdout


def test_deepcopy_of_an_fl_module_keeps_parameters():
    m = nn.Linear(3, 2).to("fl")
    m(torch.ones(1, 3, device="fl")).sum().backward()
    c = copy.deepcopy(m)
    assert isinstance(c.weight, nn.Parameter) and c.weight.requires_grad and c.weight.device == m.weight.device
    assert c.weight is not m.weight and torch.equal(c.weight.detach().cpu(), m.weight.detach().cpu())
    c.weight.data.zero_()  # a copy, not a view of the original
    assert m.weight.detach().abs().sum().item() > 0
    ref = nn.Linear(3, 2)
    ref(torch.ones(1, 3)).sum().backward()
    assert (c.weight.grad is None) == (copy.deepcopy(ref).weight.grad is None)  # as PyTorch does on CPU
    c.cpu()  # Module._apply needs Parameters
    assert c.weight.device.type == "cpu" and isinstance(c.weight, nn.Parameter)


@pytest.mark.parametrize("backend", ["cpu", "rocm"])
def test_torch_tensor_with_an_fl_device(backend):
    # torch.tensor(..., device=...) runs below Python dispatch: the transfer reaches the PrivateUse1 key
    fl.set_backend(backend)
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device="fl")
    assert t.device == fl.current_device() and t.cpu().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    s = torch.tensor(7, device="fl")
    assert s.dtype == torch.int64 and s.item() == 7
    a = torch.as_tensor([1.5, 2.5], dtype=torch.float64, device="fl")
    assert a.dtype == torch.float64 and (a * 2).cpu().tolist() == [3.0, 5.0]
    fl.set_backend("cpu")
