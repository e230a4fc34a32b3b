"""torch.Generator(device="fl"): seeded random numbers on the device, on every tier (dispatch/rng.py and the C++
core's FlGenerator). Diffusion pipelines, samplers and every `generator=` argument of PyTorch's random ops use it;
before, making one raised NotImplementedError (no getNewGenerator in the PrivateUse1 hooks)."""

import pytest
import torch

import torch_fl as fl

BACKENDS = ["cpu", "rocm", "ascend", "minimal"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    fl.set_backend(request.param)
    yield request.param
    fl.set_backend("cpu")


DRAWS = {
    "randn (native normal_)": lambda g: torch.randn(64, device="fl", generator=g),
    "uniform_": lambda g: torch.empty(33, device="fl").uniform_(-1, 2, generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((40,), 0.3, device="fl"), generator=g),
    "randperm": lambda g: torch.randperm(20, device="fl", generator=g),
    "randint": lambda g: torch.randint(0, 100, (30,), device="fl", generator=g),
    "multinomial": lambda g: torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device="fl"), 25, True, generator=g),
    "random_": lambda g: torch.empty(10, dtype=torch.int64, device="fl").random_(0, 50, generator=g),
}


@pytest.mark.parametrize("draw", list(DRAWS))
def test_a_seeded_generator_repeats_and_moves_on(backend, draw):
    fn = DRAWS[draw]
    g = torch.Generator(device="fl").manual_seed(1234)
    first = fn(g).cpu()
    second = fn(g).cpu()
    g.manual_seed(1234)
    again = fn(g).cpu()
    assert torch.equal(first, again), f"{draw} on {backend}: the same seed gave other numbers"
    assert not torch.equal(first, second), f"{draw} on {backend}: the generator's state did not move on"


def test_a_generator_leaves_the_device_default_stream_alone(backend):
    torch.fl.manual_seed(7)
    expected = torch.randn(16, device="fl").cpu()
    torch.fl.manual_seed(7)
    g = torch.Generator(device="fl").manual_seed(99)
    torch.randn(100, device="fl", generator=g)
    torch.randperm(10, device="fl", generator=g)
    assert torch.equal(torch.randn(16, device="fl").cpu(), expected)


def test_state_roundtrip_and_offsets():
    g = torch.Generator(device="fl")
    assert g.device == torch.device("fl", 0)
    g.manual_seed(5)
    assert (g.initial_seed(), g.get_offset()) == (5, 0)
    torch.rand(10, device="fl", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 24
    a = torch.rand(10, device="fl", generator=g).cpu()
    h = torch.Generator(device="fl")
    h.set_state(state)
    assert torch.equal(torch.rand(10, device="fl", generator=h).cpu(), a)
    big = torch.Generator(device="fl").manual_seed(2**64 - 1)  # seeds use all 64 bits, as CUDA's do
    assert torch.Generator(device="fl").set_state(big.get_state()).initial_seed() == 2**64 - 1
    g.set_offset(0)
    g.manual_seed(5)
    assert g.get_offset() == 0


def test_the_default_generator_state_is_the_device_state():
    """torch.fl.get_rng_state() and a generator's get_state() share one layout, so either can restore the other."""
    torch.fl.manual_seed(21)
    state = torch.fl.get_rng_state()
    g = torch.Generator(device="fl")
    g.set_state(state)
    assert torch.equal(torch.rand(8, device="fl", generator=g).cpu(), torch.rand(8, device="fl").cpu())


def test_misuse_says_what_to_do():
    with pytest.raises(RuntimeError, match="Expected a 'fl' device type for generator but found 'cpu'"):
        torch.randn(3, device="fl", generator=torch.Generator())
    with pytest.raises(RuntimeError, match="24 bytes"):
        torch.Generator(device="fl").set_state(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.Generator(device="fl:63")
    assert torch.randn(2, device="fl").device.type == "fl"  # the process stays usable


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_range_checks_hold_after_a_decomposition_used_the_op(backend):
    """random_ on uint16 (no ABI dtype) runs a decomposition that calls uniform_ inside; the checks of
    the user's own later uniform_ calls must still run (the C++ fast path, which checks nothing, must not
    have learnt the signature from the decomposition's call)."""
    fl.initialize(backend)
    big = torch.finfo(torch.float32).max
    torch.empty(64, dtype=torch.uint16, device="fl").random_(0, None)
    t = torch.empty(64, device="fl")
    for _ in range(3):
        with pytest.raises(RuntimeError, match="uniform_ expects to-from"):
            t.uniform_(-big, big)
        with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range"):
            t.uniform_(42, -42)
    t.uniform_(-42, 42)
    assert -42 <= t.min().item() and t.max().item() <= 42


def test_a_leaked_device_only_state_cannot_switch_the_fallback_off():
    """An exception between two statements (a signal's: pytest-timeout's) once left the thread marked as
    inside a device-only decomposition, and every later op that needed the CPU fallback failed ("cannot run
    on fl backend 'minimal'"). A user's call starts with nothing decomposing, so the mark is cleared."""
    from torch_fl.dispatch import plan

    fl.initialize("minimal")
    plan.TLS.device_only = 3  # as a lost exit would leave it
    x = torch.empty(8, dtype=torch.float64, device="fl").uniform_()  # float64: the fallback serves it
    assert x.dtype == torch.float64 and 0 <= x.min().item() and x.max().item() <= 1
    assert plan.TLS.device_only == 0
