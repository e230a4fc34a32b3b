"""out= arguments judged as PyTorch judges them, before any tier.

An out= tensor must live on the op's device (CUDA refuses a CPU one: torch.nonzero(x, out=cpu_tensor)). Its
dtype is where PyTorch's rules differ op by op: pointwise ops built on TensorIterator write any dtype the result
can be cast to, a few of them (neg, abs, floor, sign, ...) only the input's own; structured ops such as mm, gather
or softmax only exactly their result's dtype; reductions (sum, mean, cumsum) any. No table kept by hand would
stay true, so when an out= tensor's dtype differs from the result's (rare outside tests: the common case costs
nothing), PyTorch's CPU kernel is asked, once per signature: the op runs on the CPU on zeros of the same shapes
(stride-0 views of one zero: no memory) into an out= tensor of the given dtype, and, as a control, of the
result's dtype. Where only the given dtype is refused, fl raises CPU's exception, with its message; where both
run, fl writes the cast result as before. A CPU probe that fails either way says nothing about dtypes, and the
call goes on."""

from __future__ import annotations

import torch

from ..runtime import is_fl, iter_tensors, map_tensors

_VERDICTS: dict = {}  # (op, argument signature) -> None (allowed) or the exception CPU raised
_MAX = 4096


def check(f, dev, vals: list, outs: list, layouts) -> None:
    """Raise what PyTorch raises for these out= tensors (f: the out= overload's facts; vals: its normalized
    arguments; outs: the out= tensors; layouts: the functional twin's result layouts, or None)."""
    for out in iter_tensors(outs):
        if not is_fl(out):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{dev.torch_device} and {out.device}! (when checking the out= argument of "
                f"{f.name}). Make the out= tensor on {dev.torch_device}."
            )
    flat = list(iter_tensors(outs))
    expected = [lay[2] if isinstance(lay, tuple) and len(lay) == 3 else None for lay in (layouts or ())]
    if len(expected) == len(flat) and all(o.dtype == e for o, e in zip(flat, expected, strict=True)):
        return  # the common case: the out= tensors have the result's dtypes
    key = (f.func, tuple(_signature(v) for v in vals))
    if key not in _VERDICTS:
        if len(_VERDICTS) >= _MAX:
            _VERDICTS.clear()
        _VERDICTS[key] = _probe(f, vals, expected if len(expected) == len(flat) else None)
    verdict = _VERDICTS[key]
    if verdict is not None:
        raise type(verdict)(*verdict.args)


def _signature(v):
    if isinstance(v, torch.Tensor):
        return (v.dtype, tuple(v.shape), v.device.type)
    if isinstance(v, (list, tuple)):
        return tuple(_signature(x) for x in v)
    if isinstance(v, float):
        return (float, v if v == v else "nan")
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


def _probe(f, vals: list, expected: list | None) -> Exception | None:
    """CPU's verdict on the given out= dtypes: the exception only the given dtypes raise, else None."""
    outs_at = set(f.functional[2]) if f.functional is not None else set(i for i in f.mutable if f.kwarg_only[i])

    def zeros(t):
        if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
            return t
        return torch.zeros((), dtype=t.dtype).expand(t.shape)

    def attempt(dtypes) -> Exception | None:
        args = []
        it = iter(dtypes)
        for i, v in enumerate(vals):
            if i in outs_at:
                args.append(map_tensors(lambda _t: torch.empty(0, dtype=next(it)), [v])[0])
            else:
                args.append(map_tensors(zeros, [v])[0])
        try:
            with torch.no_grad():
                f.call(args)
        except Exception as e:  # noqa: BLE001 - CPU's verdict, whatever it is
            return e
        return None

    given = [t.dtype for i in sorted(outs_at) for t in iter_tensors([vals[i]])]
    refused = attempt(given)
    if refused is None:
        return None
    if (expected is None or None in expected) and f.functional is not None:
        # no meta function (nonzero's size depends on the values): the functional op on the same zeros says
        ff, ins, _ = f.functional
        try:
            with torch.no_grad():
                result = ff.call(map_tensors(zeros, [vals[i] for i in ins]))
        except Exception:  # noqa: BLE001 - no verdict
            return None
        expected = [t.dtype for t in iter_tensors([result])]
    if expected is None or None in expected or len(expected) != len(given):
        return None
    return refused if attempt(expected) is None else None
