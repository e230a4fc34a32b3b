"""torch.cuda's API as CUDA code calls it, run with FL_ALIAS_CUDA=1: what each call answers, and the
error each feature the alias does not cover raises. Nothing here imports torch_fl. Takes the path of a
checkpoint saved on CUDA (its storages tagged cuda:0); prints one JSON line for tests/cuda_alias/test_cuda_alias.py."""

import json
import sys

import torch

facts: dict = {}
n = torch.cuda.device_count()
last = n - 1
facts["available"] = torch.cuda.is_available()
facts["initialized"] = torch.cuda.is_initialized()
facts["count"] = n
facts["current"] = torch.cuda.current_device()
facts["name"] = torch.cuda.get_device_name()
props = torch.cuda.get_device_properties(0)
facts["props"] = [props.name, props.total_memory, props.multi_processor_count]
free, total = torch.cuda.mem_get_info()
facts["mem_get_info"] = [free <= total, total == props.total_memory]
facts["devices"] = {
    "str": str(torch.zeros(1, device="cuda").device),
    "str_last": str(torch.zeros(1, device=f"cuda:{last}").device),
    "torch_device": str(torch.ones(1, device=torch.device("cuda", last)).device),
    "int": str(torch.empty(1, device=last).device),
    "tensor_cuda": str(torch.ones(1).cuda().device),
    "tensor_cuda_last": str(torch.ones(1).cuda(last).device),
    "tensor_cuda_kw": str(torch.ones(1).cuda(device=f"cuda:{last}").device),
    "storage_cuda": str(torch.UntypedStorage(4).cuda(last).device),
    "tensor_to": str(torch.ones(1).to("cuda", torch.float64).device),
    "tensor_to_kw": str(torch.ones(1).to(device=f"cuda:{last}").device),
    "like": str(torch.zeros_like(torch.ones(2), device="cuda").device),
    "new": str(torch.ones(2).new_zeros(3, device="cuda").device),
    "module_cuda": str(torch.nn.Linear(2, 2).cuda().weight.device),
    "module_to_int": str(torch.nn.Linear(2, 2).to(last).weight.device),
    "is_cuda": torch.ones(1).cuda().is_cuda,
    "type": torch.ones(1).cuda().device.type,
}
torch.set_default_device("cuda")
facts["devices"]["default_device"] = str(torch.randn(2).device)
torch.set_default_device(None)
with torch.device(f"cuda:{last}"):
    facts["devices"]["device_context"] = str(torch.randn(2).device)
torch.cuda.set_device(last)
facts["after_set_device"] = [torch.cuda.current_device(), str(torch.zeros(1, device="cuda").device)]
with torch.cuda.device(0):
    facts["in_device_block"] = torch.cuda.current_device()
facts["after_device_block"] = torch.cuda.current_device()
torch.cuda.set_device(0)

# the legacy tensor types of older CUDA code
legacy = [
    torch.ones(2).type(torch.cuda.FloatTensor),
    torch.ones(2).type("torch.cuda.HalfTensor"),
    torch.cuda.LongTensor([1, 2]),
]
facts["legacy"] = [[str(t.device), str(t.dtype)] for t in legacy] + [
    legacy[2].cpu().tolist(),
    isinstance(legacy[0], torch.cuda.FloatTensor),
    torch.ones(1).type(),
    torch.ones(2).type(torch.DoubleTensor).dtype == torch.float64,
]
torch.set_default_tensor_type("torch.cuda.DoubleTensor")
facts["legacy_default"] = [str(torch.zeros(1).device), str(torch.zeros(1).dtype)]
torch.set_default_tensor_type(torch.FloatTensor)
facts["legacy_default"] += [str(torch.zeros(1).device), str(torch.zeros(1).dtype)]
try:
    torch.set_default_tensor_type(torch.cuda.LongTensor)
except TypeError as e:
    facts["legacy_int_default"] = [type(e).__name__, str(e)]

# random numbers: seeded runs repeat, the state round-trips
torch.cuda.manual_seed(7)
a = torch.randn(4, device="cuda")
torch.cuda.manual_seed_all(7)
b = torch.randn(4, device="cuda")
state = torch.cuda.get_rng_state()
c = torch.randn(4, device="cuda")
torch.cuda.set_rng_state(state)
d = torch.randn(4, device="cuda")
facts["seeded_repeat"] = torch.equal(a.cpu(), b.cpu())
facts["state_roundtrip"] = torch.equal(c.cpu(), d.cpu())
facts["initial_seed"] = torch.cuda.initial_seed()

# streams and events
s = torch.cuda.Stream()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
before = torch.cuda.current_stream()
with torch.cuda.stream(s):
    inside = torch.cuda.current_stream()
    start.record()
    y = torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")
    end.record()
end.synchronize()
torch.cuda.current_stream().wait_stream(s)
facts["streams"] = {
    "inside_is_s": inside == s,
    "restored": torch.cuda.current_stream() == before,
    "default_is_current": torch.cuda.default_stream() == before,
    "isinstance": [
        isinstance(s, torch.cuda.Stream),
        isinstance(before, torch.cuda.Stream),
        isinstance(start, torch.cuda.Event),
    ],
    "elapsed_ms_nonnegative": start.elapsed_time(end) >= 0,
    "query": end.query(),
}

# precision: autocast's dtype, TF32 accepted but float32 stays float32
with torch.autocast("cuda"):
    m = torch.randn(8, 8, device="cuda") @ torch.randn(8, 8, device="cuda")
    facts["autocast"] = [
        str(m.dtype),
        str(torch.get_autocast_dtype("cuda")),
        torch.is_autocast_enabled("cuda"),
        torch.is_autocast_enabled(),
    ]
facts["autocast_after"] = torch.is_autocast_enabled("cuda")
facts["bf16_supported"] = torch.cuda.is_bf16_supported()
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True
torch.set_float32_matmul_precision("high")
g = torch.Generator().manual_seed(3)
x64 = torch.randn(96, 96, generator=g, dtype=torch.float64)
err = ((x64.float().cuda() @ x64.float().cuda()).cpu().double() - x64 @ x64).abs().max() / (x64 @ x64).abs().max()
facts["matmul_rel_error_with_tf32_allowed"] = err.item()
facts["scaler_device"] = torch.amp.GradScaler("cuda")._device


class Twice(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, t):
        return t * 2

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        return grad * 2


with torch.autocast("cuda"):
    low = torch.randn(2, device="cuda").to(torch.get_autocast_dtype("cuda"))
    facts["custom_fwd_dtype"] = str(Twice.apply(low).dtype)

# a checkpoint saved on CUDA
path = sys.argv[1]
facts["load"] = {
    "plain": str(torch.load(path)["w"].device),
    "map_location_cuda": str(torch.load(path, map_location="cuda")["w"].device),
    "map_location_device": str(torch.load(path, map_location=torch.device("cuda", last))["w"].device),
    "map_location_fn": str(torch.load(path, map_location=lambda st, loc: st.cuda())["w"].device),
    "map_location_cpu": str(torch.load(path, map_location="cpu")["w"].device),
    "values": torch.load(path)["w"].cpu().tolist(),
}

# DataLoader pin_memory=True
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)
facts["pinned"] = all(batch.is_pinned() for (batch,) in loader)
facts["memory_summary_first_line"] = torch.cuda.memory_summary().splitlines()[0]


def outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads the type and the message
        return [type(e).__name__, str(e)]
    return ["no error", ""]


def extension(kind):
    from torch.utils import cpp_extension

    if kind == "CUDAExtension":
        cpp_extension.CUDAExtension("k", ["k.cu"])
    elif kind == "load_inline":
        cpp_extension.load_inline("k", "", cuda_sources="__global__ void k() {}")
    else:
        cpp_extension.load("k", ["k.cu"])


facts["unsupported"] = {
    "torch.cuda.CUDAGraph": outcome(lambda: torch.cuda.CUDAGraph()),
    "torch.cuda.graph": outcome(lambda: torch.cuda.graph(None)),
    "torch.cuda.make_graphed_callables": outcome(lambda: torch.cuda.make_graphed_callables(lambda t: t, ())),
    "torch.cuda.graphs.graph_pool_handle": outcome(lambda: torch.cuda.graphs.graph_pool_handle()),
    "torch.cuda.nccl.all_reduce": outcome(lambda: torch.cuda.nccl.all_reduce([torch.ones(1, device="cuda")])),
    "torch.cuda.nccl.version": outcome(lambda: torch.cuda.nccl.version()),
    "torch.cuda.jiterator._create_jit_fn": outcome(
        lambda: torch.cuda.jiterator._create_jit_fn("template <typename T> T f(T x) { return x; }")
    ),
    "torch.utils.cpp_extension.CUDAExtension": outcome(lambda: extension("CUDAExtension")),
    "torch.utils.cpp_extension.load_inline": outcome(lambda: extension("load_inline")),
    "torch.utils.cpp_extension.load": outcome(lambda: extension("load")),
    "torch.cuda.nvtx.range_push": outcome(lambda: torch.cuda.nvtx.range_push("step")),
    "torch.cuda.get_device_capability": outcome(lambda: torch.cuda.get_device_capability()),
    "torch.cuda.get_device_properties().major": outcome(lambda: torch.cuda.get_device_properties().major),
    "torch.nn.DataParallel": outcome(lambda: torch.nn.DataParallel(torch.nn.Linear(2, 2))),
    "torch.Generator(device='cuda')": outcome(lambda: torch.Generator(device="cuda")),
    "torch.cuda.sparse.FloatTensor": outcome(lambda: torch.ones(1).type("torch.cuda.sparse.FloatTensor")),
    "torch.cuda.ExternalStream": outcome(lambda: torch.cuda.ExternalStream(0)),
    "torch.cuda.set_per_process_memory_fraction": outcome(lambda: torch.cuda.set_per_process_memory_fraction(0.5)),
    "torch.cuda.utilization": outcome(lambda: torch.cuda.utilization()),
    "torch.cuda.memory_stats_as_nested_dict": outcome(lambda: torch.cuda.memory_stats_as_nested_dict()),
    "init_process_group(device_id=)": outcome(
        lambda: torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", 0))
    ),
}
facts["missing_device"] = outcome(lambda: torch.zeros(1, device=f"cuda:{n}"))
facts["missing_set_device"] = outcome(lambda: torch.cuda.set_device(n))
facts["cpu_generator_still_works"] = isinstance(torch.Generator().manual_seed(1), torch.Generator)
print(json.dumps(facts))
