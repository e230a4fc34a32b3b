"""fl tensors are real PyTorch tensors (PrivateUse1 TensorImpls over plugin memory): what that makes
true for code torch_fl did not write: module conversion, torch.compile, serialization, storages,
processes, streams, accelerator APIs and autoload."""

import copy
import gc
import io
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo as dynamo
from conftest import run_py
from torch import nn

import torch_fl as fl


def test_an_fl_tensor_is_a_plain_tensor():
    x = torch.randn(3, 4, device="fl")
    assert type(x) is torch.Tensor and x.device.type == "fl"
    assert x.data_ptr() != 0 and x.untyped_storage().device == x.device
    y = x.t()  # PyTorch's own views, in C++
    assert y._base is x and y.data_ptr() == x.data_ptr() and y.stride() == (1, 4)


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.emb(x))


@pytest.mark.parametrize("backend", ["cpu", "rocm"])
def test_module_conversion_keeps_parameter_objects_and_ties(backend):
    fl.set_backend(backend)
    torch.manual_seed(0)
    m = _Tied()
    weight = m.emb.weight
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)  # made before the move, as with .cuda()
    m.to("fl")
    assert m.emb.weight is weight and m.head.weight is m.emb.weight and weight.device.type == "fl"
    assert isinstance(weight, nn.Parameter) and len(list(m.parameters())) == 1
    x = torch.tensor([1, 2, 3]).to("fl")
    m(x).sum().backward()
    before = weight.detach().cpu().clone()
    opt.step()
    assert not torch.equal(before, weight.detach().cpu())  # the optimizer trained the moved parameter
    for convert in (
        lambda mm: mm.double(),
        lambda mm: mm.half(),
        lambda mm: mm.float(),
        lambda mm: mm.cpu(),
        lambda mm: mm.to("fl"),
    ):
        convert(m)
        assert m.emb.weight is weight and m.head.weight is weight
    c = copy.deepcopy(m)
    assert c.head.weight is c.emb.weight and c.emb.weight is not weight
    fresh = _Tied().to("fl")
    fresh.load_state_dict(m.state_dict())
    assert fresh.head.weight is fresh.emb.weight and torch.equal(fresh.emb.weight.cpu(), weight.detach().cpu())


def test_aot_eager_has_no_graph_breaks_and_matches_eager_in_training():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("fl")
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2, enable_nested_tensor=False
    ).to("fl")
    for model, x in ((mlp, torch.randn(5, 8)), (enc, torch.randn(2, 5, 16))):
        x = x.to("fl").requires_grad_()
        explained = dynamo.explain(model)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        compiled = torch.compile(model, backend="aot_eager")
        out = compiled(x)
        out.square().sum().backward()
        grads = [p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()]
        model.zero_grad()
        x.grad = None
        ref = model(x)
        ref.square().sum().backward()
        torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
        for g, p in zip(grads, [p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()], strict=True):
            torch.testing.assert_close(g, p, rtol=1e-4, atol=1e-5)
        dynamo.reset()


def test_hugging_face_bert_called_with_keywords_compiles_without_breaks():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval().to("fl")
    ids = torch.randint(0, 64, (2, 7)).to("fl")
    mask = torch.ones(2, 7, dtype=torch.long).to("fl")
    explained = dynamo.explain(model)(input_ids=ids, attention_mask=mask)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    out = torch.compile(model, backend="aot_eager")(input_ids=ids, attention_mask=mask).last_hidden_state
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
    dynamo.reset()


def test_save_and_load_with_every_kind_of_map_location():
    t = torch.arange(6.0).to("fl")
    state = {"t": t, "view": t[2:], "p": nn.Parameter(torch.ones(2).to("fl"))}
    buf = io.BytesIO()
    torch.save(state, buf)

    def load(**kw):
        buf.seek(0)
        return torch.load(buf, **kw)

    same_storage = lambda d: d["view"].untyped_storage().data_ptr() == d["t"].untyped_storage().data_ptr()  # noqa: E731
    d = load()
    assert d["t"].device == t.device and same_storage(d) and d["view"].cpu().tolist() == [2.0, 3.0, 4.0, 5.0]
    assert isinstance(d["p"], nn.Parameter)
    for where in ("cpu", torch.device("cpu"), {str(t.device): "cpu"}, lambda storage, loc: storage):
        d = load(map_location=where)
        assert d["t"].device.type == "cpu" and same_storage(d), where
    d = load(map_location="fl")
    assert d["t"].device.type == "fl" and same_storage(d)
    d = load(map_location="cpu", weights_only=True)
    assert d["t"].device.type == "cpu"


def test_untyped_storage_on_the_device_and_resize():
    s = torch.UntypedStorage(8, device="fl")
    assert s.device.type == "fl" and s.nbytes() == 8
    t = torch.empty(0, device="fl").set_(s)
    t.fill_(1.0)
    s.resize_(16)  # grows on the device, keeps its bytes
    assert s.nbytes() == 16 and torch.equal(torch.empty(0, device="fl").set_(s)[:2].cpu(), torch.ones(2))
    x = torch.ones(2, device="fl")
    x.resize_(5)
    assert x.shape == (5,) and x[:2].cpu().tolist() == [1.0, 1.0]


@pytest.mark.slow  # a subprocess
def test_dataloader_workers_and_multiprocessing_pass_fl_tensors(tmp_path):
    script = tmp_path / "workers.py"  # spawned children import the parent's main module from a file
    script.write_text(
        textwrap.dedent("""
        import torch, torch_fl as fl
        import torch.multiprocessing as mp
        from torch.utils.data import DataLoader, Dataset

        class Rows(Dataset):
            def __len__(self): return 4
            def __getitem__(self, i): return torch.full((3,), float(i), device="fl")

        def double(t, q):
            q.put((t * 2).cpu().tolist())

        if __name__ == "__main__":
            print("BATCHES", [b.cpu().tolist() for b in DataLoader(Rows(), batch_size=2, num_workers=2)])
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=double, args=(torch.arange(3.0).to("fl"), q))
            p.start()
            print("SPAWNED", q.get(timeout=120))
            p.join()
    """)
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert "BATCHES [[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], [[2.0, 2.0, 2.0], [3.0, 3.0, 3.0]]]" in r.stdout, r.stderr
    assert "SPAWNED [0.0, 2.0, 4.0]" in r.stdout, r.stderr


def test_pinned_dataloader_batches_copy_without_blocking():
    from torch.utils.data import DataLoader, TensorDataset

    fl.set_backend("rocm")
    data = TensorDataset(torch.arange(12.0).reshape(6, 2))
    for (batch,) in DataLoader(data, batch_size=3, pin_memory=True):
        assert batch.is_pinned()
        moved = batch.to("fl", non_blocking=True)
        assert moved.device.type == "fl" and torch.equal(moved.cpu(), batch)


def test_accelerator_memory_apis_and_freed_models():
    gc.collect()
    torch.accelerator.empty_cache()
    start = torch.accelerator.memory_allocated()
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to("fl")
    model(torch.randn(16, 64, device="fl")).sum().backward()
    assert torch.accelerator.memory_allocated() > start
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.accelerator.memory_allocated()
    del model
    gc.collect()
    assert torch.accelerator.memory_allocated() == start
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == start


def test_ops_leave_no_python_objects_behind():
    x = torch.randn(32, 32, device="fl")
    for _ in range(50):
        (x @ x + 1).relu()
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(500):
        (x @ x + 1).relu()
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_streams_and_events():
    fl.set_backend("rocm")
    s = torch.Stream(device="fl")
    e = torch.Event(device="fl")
    x = torch.randn(1000, device="fl")
    with s:
        y = x * 2
    e.record(s)
    e.synchronize()
    assert e.query() and s.query()
    torch.accelerator.synchronize()
    assert torch.equal(y.cpu(), x.cpu() * 2)


@pytest.mark.slow  # a subprocess
def test_import_torch_alone_registers_fl_and_can_be_turned_off():
    r = run_py("""
        import torch
        print("DEVICE", torch.randn(2, device="fl").device, torch.accelerator.current_accelerator())
    """)
    assert "DEVICE fl:0 fl" in r.stdout, r.stderr
    r = run_py(
        """
        import torch
        print("NAME", torch._C._get_privateuse1_backend_name())
    """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert "NAME privateuseone" in r.stdout, r.stderr


@pytest.mark.slow  # a subprocess
def test_without_a_cxx_compiler_the_error_says_what_to_install(tmp_path):
    r = run_py(
        """
        try:
            import torch_fl
        except Exception as e:
            print(type(e).__name__, e)
    """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "CXX": "/nonexistent/g++", "FL_CACHE_DIR": str(tmp_path)},
    )
    assert "FlError" in r.stdout and "no C++ compiler was found ('/nonexistent/g++')" in r.stdout, r.stdout + r.stderr
    assert "apt install g++" in r.stdout
    r = run_py("import torch; print('IMPORTED')", env={"CXX": "/nonexistent/g++", "FL_CACHE_DIR": str(tmp_path)})
    assert "IMPORTED" in r.stdout and "torch_fl could not register the fl device" in r.stderr  # autoload warns


def test_move_switches_a_training_session_to_another_backend():
    """fl.move (what `%fl_backend NAME --move ...` calls): model in place with its ties, optimizer state
    moved so the optimizer made before the switch keeps training, tensors copied; the steps after the
    switch match the same steps without one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied
    ref = copy.deepcopy(model)
    x = torch.randint(0, 10, (3, 5))

    def step(m, opt, inp):
        opt.zero_grad()
        m(inp).logsumexp(-1).sum().backward()
        opt.step()

    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.1)
    for _ in range(4):
        step(ref, opt_ref, x)
    fl.set_backend("rocm")
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    step(model.to("fl"), opt, x.to("fl"))
    fl.set_backend("ascend")
    assert fl.move(model) is model and model[1].weight is model[0].weight
    assert fl.move(opt) is opt
    assert {v.device.type for s in opt.state.values() for v in s.values() if v.dim()} == {"fl"}
    assert all(s["exp_avg"].device == fl.device("ascend") for s in opt.state.values())
    xd = fl.move(x)
    assert xd.device == fl.device("ascend") and x.device.type == "cpu"
    for _ in range(3):
        step(model, opt, xd)
    assert model[0].weight.device == fl.device("ascend")
    torch.testing.assert_close(model[0].weight.cpu(), ref[0].weight, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="fl.move takes an nn.Module, a Tensor or an Optimizer, not list"):
        fl.move([x])
    fl.set_backend("cpu")
