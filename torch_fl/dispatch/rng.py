"""Generators: a random op called with generator=torch.Generator("fl").

Plugin kernels draw from their device's counter-based RNG state (fl_plugin.h: rng_set_state), which is also the
device's default generator: the C++ core reads and writes it through. A generator made by the user keeps a
(seed, offset) pair of its own in the C++ core. For a call that is given one, the dispatcher swaps that pair into
the plugin, runs the call with generator=None, so that every tier draws from the device state (native kernels,
a decomposition's sub-ops, the JIT), stores the advanced offset back in the generator and puts the device's own
state back. The CPU fallback cannot draw from the device's RNG: inside such a call it hands PyTorch's CPU kernel
a CPU generator seeded from the pair, and the offset moves on by one. Either way the same generator state gives
the same numbers, and the device's default stream is left as it was."""

from __future__ import annotations

import threading

import torch

from ..runtime import REGISTRY, iter_tensors


class _State(threading.local):
    depth = 0  # > 0 while a call given an fl generator runs on this thread


STATE = _State()


def call_with_generator(f, vals: list, run):
    """Run an op (facts f, normalized values vals, whose generator argument is set) through run(f, args,
    kwargs) with the generator's state swapped into its device's plugin."""
    g = vals[f.generator_at]
    if not isinstance(g, torch.Generator):
        raise TypeError(f"{f.name}: generator must be a torch.Generator, not {type(g).__name__}")
    if g.device.type != "fl":
        raise RuntimeError(
            f"Expected a 'fl' device type for generator but found '{g.device.type}' (in {f.name}); "
            f"make it with torch.Generator(device='fl')"
        )
    dev = REGISTRY.device(g.device.index)
    for t in iter_tensors(vals):
        if t.device.type == "fl" and t.device != g.device:
            raise RuntimeError(
                f"{f.name}: the generator is on {g.device} but the tensors are on {t.device}; "
                f"make the generator with torch.Generator(device='{t.device}')"
            )
    vals = list(vals)
    vals[f.generator_at] = None
    args, kwargs = f.split(vals)
    plugin, local = dev.plugin, dev.local
    saved = plugin.rng_get_state(local)
    plugin.rng_set_state(local, g.initial_seed(), g.get_offset())
    STATE.depth += 1
    try:
        return run(f, args, kwargs)
    finally:
        STATE.depth -= 1
        offset = plugin.rng_get_state(local)[1]
        plugin.rng_set_state(local, *saved)
        g.set_offset(offset)  # after the restore: the default generator's offset is the device's own


def host_generator(dev) -> torch.Generator | None:
    """For the CPU fallback of a random op inside a call given an fl generator: a CPU generator seeded from the
    device state (the swapped-in pair), whose offset then moves on by one. None outside such calls (the CPU
    kernel then draws from PyTorch's CPU generator, as it always did)."""
    if not STATE.depth:
        return None
    seed, offset = dev.plugin.rng_get_state(dev.local)
    dev.plugin.rng_set_state(dev.local, seed, offset + 1)
    mixed = (seed * 0x9E3779B97F4A7C15 + (offset + 1) * 0xBF58476D1CE4E5B9) % (1 << 63)
    return torch.Generator().manual_seed(mixed)
