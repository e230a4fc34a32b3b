"""IPython magics for torch_fl: `%load_ext fl_magics`.

    %fl_backend [NAME] [--move NAME ...] [--caps]   show or switch the fl backend
    %%fl_profile [-o NAME] [--backend X] [--compare X] [--top N]
    %fl_caps [BACKEND]                              the capability explorer widget
    %fl_explain OP [--dtype D]                      the path OP takes on each backend, and why
    %fl_align MODEL INPUTS [TARGET] [--backend X] [--reference Y] [--steps N] [-o NAME]

Each magic is a thin call into torch_fl's Python API (the same call works
outside IPython); the magic only parses arguments, finds names in the user
namespace and displays the result."""

from __future__ import annotations

import torch
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

import torch_fl as fl


def _backend_or_usage(name: str) -> str:
    choices = fl.available_backends()
    if name not in choices:
        raise UsageError(f"unknown fl backend {name!r}; choose one of: {', '.join(choices)}")
    return name


@magics_class
class FlMagics(Magics):
    def _lookup(self, name: str):
        ns = self.shell.user_ns
        if name not in ns:
            raise UsageError(f"no variable named {name!r} in this namespace")
        return ns[name]

    # -- %fl_backend ---------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("backend", nargs="?", help="backend to make current (omit to list them)")
    @argument("--move", nargs="+", default=[], metavar="NAME",
              help="models, tensors or optimizers in the namespace to move to the new backend's device")
    @argument("--caps", action="store_true", help="show the new backend's capability table")
    def fl_backend(self, line: str):
        """Show the current fl backend and the available ones, or switch backend
        live: new tensors go to the new backend, existing ones stay valid where
        they are (move named ones with --move)."""
        args = parse_argstring(self.fl_backend, line)
        if not args.backend:
            if args.move:
                raise UsageError("--move needs a backend to move to: %fl_backend NAME --move ...")
            print(f"current fl backend: {fl.get_current_backend_name()} ({fl.current_device()})")
            print(fl.list_backends().render())
            return None
        name = _backend_or_usage(args.backend)
        fl.set_backend(name)
        device = fl.current_device()
        moved = [self._move(n, device) for n in args.move]
        print(f"fl backend: {name} ({device})" + (f"; moved {', '.join(moved)}" if moved else ""))
        if args.caps:
            display(fl.capabilities(name))
        return None

    def _move(self, name: str, device: torch.device) -> str:
        obj = self._lookup(name)
        if isinstance(obj, torch.nn.Module):
            obj.to(device)
        elif isinstance(obj, torch.Tensor):
            self.shell.user_ns[name] = obj.to(device)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for k, v in list(state.items()):
                    if isinstance(v, torch.Tensor) and v.dim() > 0:
                        state[k] = v.to(device)
        else:
            raise UsageError(f"--move: {name!r} is a {type(obj).__name__}; only modules, tensors and optimizers move")
        return name

    # -- %%fl_profile -------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("-o", "--output", metavar="NAME", help="store the Profile (or Comparison) in this variable")
    @argument("--backend", help="profile the cell on this backend (the current one is restored after)")
    @argument("--compare", metavar="BACKEND", help="also run the cell on BACKEND and compare op by op")
    @argument("--top", type=int, default=15, help="rows of the per-op table (default 15)")
    @argument("--no-plot", action="store_true", help="table only")
    @argument("--fusion", action="store_true",
              help="run the cell with fl.compile's fusion off, then on (once unprofiled first: capture, JIT "
                   "compiles, folded weights), and show kernels before vs after and the fusion report of every "
                   "compiled model in the namespace")
    def fl_profile(self, line: str, cell: str):
        """Run the cell under fl.profile(): per-op time, calls, path, kernel
        launches and bytes copied, and where the time went by path. The cell's
        last expression still displays."""
        from torch_fl.notebook import comparison_kernels, fallback_paths, time_by_path

        args = parse_argstring(self.fl_profile, line)
        if args.fusion:
            if args.compare:
                raise UsageError("--fusion compares the cell with and without fusion; use it without --compare "
                                 "(fl.compare_backends(fn, a, b, fusion=True) compares two backends both ways)")
            return self._profile_fusion(args, cell)
        previous = fl.get_current_backend_name()
        first = _backend_or_usage(args.backend) if args.backend else previous
        second = _backend_or_usage(args.compare) if args.compare else None
        try:
            fl.set_backend(first)
            with fl.profile(label=first) as prof:
                result = self.shell.run_cell(cell)
            if not result.success:
                return None
            if second is None:
                print(prof.render(args.top))
                if not args.no_plot:
                    display(time_by_path(prof))
                    display(fallback_paths(prof))
                out = prof
            else:
                fl.set_backend(second)
                with fl.profile(label=second) as other:
                    result = self.shell.run_cell(cell, silent=True)
                if not result.success:
                    return None
                out = prof.compare(other, (first, second))
                print(out.render(args.top))
                if not args.no_plot:
                    display(comparison_kernels(out))
        finally:
            fl.set_backend(previous)
        if args.output:
            self.shell.user_ns[args.output] = out
        return None

    def _profile_fusion(self, args, cell: str):
        from torch_fl.compile import CompiledModel, disabled
        from torch_fl.notebook.figures import comparison_kernels, fusion_patterns

        previous = fl.get_current_backend_name()
        name = _backend_or_usage(args.backend) if args.backend else previous
        try:
            fl.set_backend(name)
            with disabled(), fl.profile(label="unfused") as before:
                result = self.shell.run_cell(cell, silent=True)
            if not result.success:
                return None
            result = self.shell.run_cell(cell, silent=True)  # one-time work: capture, JIT compiles, folds
            if not result.success:
                return None
            with fl.profile(label="fused") as after:
                result = self.shell.run_cell(cell)
            if not result.success:
                return None
        finally:
            fl.set_backend(previous)
        out = before.compare(after, ("unfused", "fused"))
        compiled = {k: v for k, v in self.shell.user_ns.items() if isinstance(v, CompiledModel) and not
                    k.startswith("_")}
        print(f"fusion on '{name}': kernels {before.kernels} -> {after.kernels}")
        if not compiled:
            print("no fl.compile'd model in the namespace: nothing was fused (compiled = fl.compile(model))")
        for k in sorted(compiled):
            print(f"\n{k}.fusion_report:\n{compiled[k].fusion_report.table()}")
        print()
        print(out.render(args.top))
        if not args.no_plot:
            display(comparison_kernels(out))
            for k in sorted(compiled):
                display(fusion_patterns(compiled[k].fusion_report))
        if args.output:
            self.shell.user_ns[args.output] = out
        return None

    # -- %fl_caps ----------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("backend", nargs="?", help="backend to open on (default: current)")
    def fl_caps(self, line: str):
        """The capability explorer: devices, op coverage, fused kernels, collectives, comparison."""
        from torch_fl.notebook import CapabilityExplorer

        args = parse_argstring(self.fl_caps, line)
        backend = _backend_or_usage(args.backend) if args.backend else None
        explorer = CapabilityExplorer(backend)
        display(explorer)
        return None

    # -- %fl_explain ------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("op", help='an aten op: "aten::add.Tensor", "add.Tensor", "mm", or "fl::conv_bn_relu"')
    @argument("--dtype", default="float32")
    def fl_explain(self, line: str):
        """Which path OP takes on every backend, and why."""
        args = parse_argstring(self.fl_explain, line)
        dtype = getattr(torch, args.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise UsageError(f"--dtype {args.dtype!r} is not a torch dtype (float32, bfloat16, int64, ...)")
        try:
            explanations = [fl.explain(args.op, dtype, backend=b) for b in fl.available_backends()]
        except ValueError as e:
            raise UsageError(str(e)) from None
        print("\n".join(e.render() for e in explanations))
        return None

    # -- %fl_align ---------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("model", help="name of an nn.Module in the namespace")
    @argument("inputs", help="name of its input tensor (or tuple of tensors), on the CPU")
    @argument("target", nargs="?", help="name of a target tensor for the loss")
    @argument("--backend", help="backend to check (default: current)")
    @argument("--reference", default="cpu", help='"cpu" (native PyTorch, default) or an fl backend')
    @argument("--steps", type=int, default=20, help="training steps to compare (default 20; 0 skips)")
    @argument("-o", "--output", metavar="NAME", help="store the AlignmentReport in this variable")
    @argument("--no-plot", action="store_true")
    def fl_align(self, line: str):
        """Precision alignment of MODEL on a backend against a reference: per-module
        outputs, gradients, autocast, and a short training run."""
        from torch_fl.notebook import alignment_layers, alignment_losses

        args = parse_argstring(self.fl_align, line)
        model, inputs = self._lookup(args.model), self._lookup(args.inputs)
        target = self._lookup(args.target) if args.target else None
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"{args.model!r} is a {type(model).__name__}, not an nn.Module")
        backend = _backend_or_usage(args.backend) if args.backend else None
        if args.reference != "cpu":
            _backend_or_usage(args.reference)
        report = fl.align(model, inputs, target, backend=backend, reference=args.reference, steps=args.steps)
        print(report.render())
        if not args.no_plot:
            display(alignment_layers(report))
            if report.training:
                display(alignment_losses(report))
        if args.output:
            self.shell.user_ns[args.output] = report
        return None


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(FlMagics)


def unload_ipython_extension(ipython) -> None:  # noqa: ARG001 - IPython's hook signature
    return None
