"""IPython magics for torch_fl: `%load_ext fl_magics`.

    %fl_backend [NAME] [--move NAME ...] [--caps] [--as-cuda]   show or switch the fl backend
    %%fl_profile [-o NAME] [--backend X] [--compare X] [--top N] [--fusion]
    %fl_caps [BACKEND]                              the capability explorer widget
    %fl_explain OP [--dtype D]                      the path OP takes on each backend, and why
    %fl_align MODEL INPUTS [TARGET] [--backend X] [--reference Y] [--steps N] [-o NAME]
    %fl_watch MODEL [OPTIMIZER] [-o NAME]           a live per-step view of a training loop
    %%fl_align [MODEL INPUTS [TARGET]] [options]     runs the cell, then aligns what it defined
                                                    (by default model, inputs and, if the cell set it, target)

Each magic is a thin call into torch_fl's Python API (the same call works
outside IPython); the magic only parses arguments, finds names in the user
namespace and displays the result. Option defaults are traitlets settings:
`%config FlMagics.top = 5` (or `c.FlMagics.top = 5` in ipython_config.py)."""

from __future__ import annotations

import argparse
import ast
import builtins
import itertools
import keyword
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .requirements import JUPYTER_PACKAGES

try:
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
    from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
    from IPython.display import display
    from traitlets import Integer

    if TYPE_CHECKING:
        from IPython.core.interactiveshell import InteractiveShell
except ModuleNotFoundError as e:  # torch_fl alone installs no IPython: name the extra that does
    raise ModuleNotFoundError(
        f"fl_magics needs IPython ({e.name} is not installed): install torch_fl's jupyter extra, "
        f"pip install 'torch_fl[jupyter]', or, torch_fl being installed already, just its packages (no rebuild "
        f"of torch_fl): pip install {' '.join(repr(p) for p in JUPYTER_PACKAGES)}",
        name=e.name,
    ) from e

import torch_fl as fl

_UNSET = object()


def _backend_or_usage(name: str) -> str:
    choices = fl.available_backends()
    if name not in choices:
        raise UsageError(f"unknown fl backend {name!r}; choose one of: {', '.join(choices)}")
    return name


def _parse(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """parse_argstring, with a line shlex cannot split (an unterminated quote)
    reported as a UsageError like every other bad argument, not a traceback."""
    try:
        return parse_argstring(magic, line)
    except ValueError as e:
        raise UsageError(f"cannot parse the arguments {line!r}: {e}") from None


def output_name(name: str | None) -> str | None:
    """The variable an `-o NAME` option may write: a plain identifier that
    shadows nothing Python or IPython rely on (`-o __builtins__` would break
    every later cell, `-o 1bad` could never be read back)."""
    if name is None:
        return None
    if not name.isidentifier() or keyword.iskeyword(name):
        raise UsageError(f"-o {name!r} is not a valid Python variable name")
    if hasattr(builtins, name) or (name.startswith("__") and name.endswith("__")):
        raise UsageError(f"-o {name!r} would shadow a Python builtin or special name; choose another name")
    return name


def _cell_number(shell: InteractiveShell) -> int:
    """The In[N] of the cell being run: IPython counts a stored cell before it
    runs it, so during the run the counter is already one ahead."""
    return max(shell.execution_count - 1, 0)


def _hide_internal_frames(tb: types.TracebackType | None) -> None:
    """Mark torch_fl's and fl_magics' frames in a traceback with IPython's
    `__tracebackhide__`, so the user's own line comes first and the
    dispatcher's internals fold into "[... skipping hidden N frame]"."""
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.split(".", 1)[0] in ("torch_fl", "fl_magics"):
            tb.tb_frame.f_locals["__tracebackhide__"] = True
        tb = tb.tb_next


def _render_from_cell(shell: InteractiveShell, exc: BaseException, filename: str) -> None:
    """Give the exception IPython's `_render_traceback_` hook, so the shell
    shows its traceback from the cell's own line on, as for a cell without the
    magic, instead of starting at `get_ipython().run_cell_magic(...)`."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    if tb is None:
        return
    try:
        # IPython's hook is set on the instance: BaseException declares no such attribute
        exc._render_traceback_ = (  # type: ignore[attr-defined]
            lambda: shell.InteractiveTB.structured_traceback(type(exc), exc, tb, tb_offset=0)
        )
    except AttributeError:  # an exception type without an instance dict keeps IPython's rendering
        pass


def run_cell_code(shell: InteractiveShell, cell: str, *, display: bool = True) -> None:
    """Run a cell's code in the user namespace as IPython would -- its magics
    transformed, the last expression displayed, tracebacks pointing at the
    cell's own In[N] -- but let an exception propagate, so a profiling magic
    records what ran and the notebook still stops at the failing cell."""
    __tracebackhide__ = True
    source = shell.transform_cell(cell)
    filename = shell.compile.cache(source, _cell_number(shell), raw_code=cell)
    tree = shell.compile.ast_parse(source, filename=filename)
    last = tree.body.pop() if display and tree.body and isinstance(tree.body[-1], ast.Expr) else None
    try:
        with shell.builtin_trap, shell.display_trap:
            exec(shell.compile(tree, filename, "exec"), shell.user_global_ns, shell.user_ns)
            if last is not None:  # "single" mode hands the value to the display hook (Out[N])
                exec(shell.compile(ast.Interactive([last]), filename, "single"), shell.user_global_ns, shell.user_ns)
    except BaseException as e:
        _hide_internal_frames(e.__traceback__)
        _render_from_cell(shell, e, filename)
        raise


@magics_class
class FlMagics(Magics):
    """The magics; a traitlets Configurable (IPython's Magics), so the defaults of
    their options are set with `%config FlMagics.<name> = value`."""

    top = Integer(15, min=0, help="rows of %%fl_profile's per-op table when --top is not given").tag(config=True)
    steps = Integer(20, min=0, help="training steps %fl_align compares when --steps is not given (0 skips)").tag(
        config=True
    )

    @property
    def _shell(self) -> InteractiveShell:
        """The shell the magics were registered on: IPython's `shell` trait may be None, never once
        load_ipython_extension has registered them."""
        assert self.shell is not None, "FlMagics run inside IPython: %load_ext fl_magics"
        return self.shell

    def _lookup(self, name: str) -> Any:
        ns = self._shell.user_ns
        if name not in ns:
            raise UsageError(f"no variable named {name!r} in this namespace")
        return ns[name]

    # -- %fl_backend ---------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("backend", nargs="?", help="backend to make current (omit to list them)")
    @argument(
        "--move",
        nargs="+",
        default=[],
        metavar="NAME",
        help="models, tensors or optimizers in the namespace to move to the new backend's device",
    )
    @argument("--caps", action="store_true", help="show the new backend's capability table")
    @argument(
        "--as-cuda",
        action="store_true",
        help="also run code written for CUDA ('cuda', .cuda(), torch.cuda.*) on the fl backend: "
        "torch_fl.alias_cuda(), for the rest of the session",
    )
    def fl_backend(self, line: str) -> None:
        """Show the current fl backend and the available ones, or switch backend
        live: new tensors go to the new backend, existing ones stay valid where
        they are (move named ones with --move). With --as-cuda, 'cuda' means the
        fl backend from then on (the cuda alias follows later switches)."""
        from torch_fl.cuda_alias import CudaAliasError, is_active

        args = _parse(self.fl_backend, line)
        if not args.backend:
            if args.move:
                raise UsageError("--move needs a backend to move to: %fl_backend NAME --move ...")
            if args.as_cuda:
                self._alias_cuda(CudaAliasError)
            print(
                f"current fl backend: {fl.get_current_backend_name()} ({fl.current_device()})"
                + ("; 'cuda' runs here too (cuda alias)" if is_active() else "")
            )
            print(fl.list_backends().render())
            return None
        name = _backend_or_usage(args.backend)
        movable = {n: self._movable(n) for n in args.move}  # every argument checked before anything changes
        fl.set_backend(name)
        if args.as_cuda:
            self._alias_cuda(CudaAliasError)
        device = fl.current_device()
        for n, obj in movable.items():
            self._move(n, obj, device)
        print(
            f"fl backend: {name} ({device})"
            + (f"; moved {', '.join(movable)}" if movable else "")
            + ("; 'cuda' runs here too (cuda alias)" if is_active() else "")
        )
        if args.caps:
            display(fl.capabilities(name))
        return None

    @staticmethod
    def _alias_cuda(refused: type[Exception]) -> None:
        try:
            fl.alias_cuda()
        except refused as e:  # a real CUDA device: the magic says why instead of a traceback
            raise UsageError(str(e)) from None

    def _movable(self, name: str) -> Any:
        """The namespace object `--move NAME` names, if it is one that can move."""
        obj = self._lookup(name)
        if not isinstance(obj, (torch.nn.Module, torch.Tensor, torch.optim.Optimizer)):
            raise UsageError(f"--move: {name!r} is a {type(obj).__name__}; only modules, tensors and optimizers move")
        return obj

    def _move(self, name: str, obj: Any, device: torch.device) -> None:
        moved = fl.move(obj, device)
        if isinstance(obj, torch.Tensor):  # a tensor moves as a copy: the name is rebound to it
            self._shell.user_ns[name] = moved

    # -- %%fl_profile -------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("-o", "--output", metavar="NAME", help="store the Profile (or Comparison) in this variable")
    @argument("--backend", help="profile the cell on this backend (the current one is restored after)")
    @argument("--compare", metavar="BACKEND", help="also run the cell on BACKEND and compare op by op")
    @argument("--top", type=int, help="rows of the per-op table (default: %%config FlMagics.top, 15)")
    @argument("--no-plot", action="store_true", help="table only")
    @argument(
        "--fusion",
        action="store_true",
        help="run the cell eagerly (torch.compile'd code included), then compiled (once unprofiled first: "
        "compilation, JIT kernels, folded weights), and show kernels before vs after and the fusion "
        "report of every compiled model in the namespace",
    )
    def fl_profile(self, line: str, cell: str) -> None:
        """Run the cell under fl.profile(): per-op time, calls, path, kernel
        launches and bytes copied, and where the time went by path. The cell's
        last expression still displays."""
        __tracebackhide__ = True
        args = _parse(self.fl_profile, line)
        output = output_name(args.output)
        top = self.top if args.top is None else args.top
        if top < 0:
            raise UsageError(f"--top {top}: the number of rows must be 0 or more")
        if args.fusion:
            if args.compare:
                raise UsageError(
                    "--fusion compares the cell with and without fusion; use it without --compare "
                    "(fl.compare_backends(fn, a, b, fusion=True) compares two backends both ways)"
                )
            self._profile_fusion(args, output, cell, top)
            return None
        first = _backend_or_usage(args.backend) if args.backend else fl.get_current_backend_name()
        out: fl.Comparison | fl.Profile
        if args.compare:
            out = fl.compare_backends(
                self._cell_function(cell),
                first,
                _backend_or_usage(args.compare),
                warmup=0,
                namespace=self._shell.user_ns,
                names=self._cell_names(cell),
            )
        else:
            out = self._profile(first, cell, output)
        self._show_profile(out, top, args.no_plot)
        if output:
            self._shell.user_ns[output] = out
        return None

    def _profile(self, backend: str, cell: str, output: str | None) -> fl.Profile:
        """The cell run once under fl.profile() on a backend. If the cell
        raises, the profile of what ran is stored (in `output`) first and the
        exception goes on, so the notebook stops at this cell."""
        __tracebackhide__ = True
        with fl.using_backend(backend), fl.profile(label=backend) as prof:
            try:
                run_cell_code(self._shell, cell)
            except BaseException:
                if output:
                    self._shell.user_ns[output] = prof
                raise
        return prof

    def _cell_names(self, cell: str) -> set[str]:
        """The names the cell's code uses (its model and inputs are moved to each compared backend)."""
        from torch_fl.placement import code_names

        try:
            return code_names(compile(self._shell.transform_cell(cell), "<cell>", "exec"))
        except SyntaxError:
            return set()  # the run itself reports it

    def _cell_function(self, cell: str) -> Callable[[], None]:
        """The cell as the function fl.compare_backends runs on each backend;
        its last expression displays on the first run only."""
        runs = itertools.count()

        def run_cell() -> None:
            __tracebackhide__ = True
            run_cell_code(self._shell, cell, display=next(runs) == 0)

        return run_cell

    @staticmethod
    def _show_profile(out: fl.Comparison | fl.Profile, top: int, no_plot: bool) -> None:
        from torch_fl.notebook import comparison_kernels, fallback_paths, time_by_path

        # text in a terminal, an HTML table in a notebook (the fixed-width text wraps every row there)
        display({"text/plain": out.render(top), "text/html": out.html(top)}, raw=True)
        if no_plot:
            return
        if isinstance(out, fl.Comparison):
            display(comparison_kernels(out))
        else:
            display(time_by_path(out))
            display(fallback_paths(out))

    def _profile_fusion(self, args: argparse.Namespace, output: str | None, cell: str, top: int) -> None:
        __tracebackhide__ = True
        from torch_fl.compile import disabled
        from torch_fl.notebook.figures import comparison_kernels, fusion_patterns

        name = _backend_or_usage(args.backend) if args.backend else fl.get_current_backend_name()
        with fl.using_backend(name):
            with disabled(), fl.profile(label="eager") as before:
                run_cell_code(self._shell, cell, display=False)
            run_cell_code(self._shell, cell, display=False)  # one-time work: compilation, JIT kernels, folds
            after = self._profile(name, cell, None)
        out = before.compare(after, ("eager", "compiled"))
        reports = {
            k: fl.fusion_report(v)
            for k, v in self._shell.user_ns.items()
            if isinstance(v, torch._dynamo.eval_frame.OptimizedModule) and not k.startswith("_")
        }
        print(f"fusion on '{name}': kernels {before.kernels} -> {after.kernels}")
        if not reports:
            print(
                "no compiled model in the namespace: nothing was fused (compiled = fl.compile(model), or "
                "torch.compile(model, backend='fl'))"
            )
        for k in sorted(reports):
            print(f"\nfl.fusion_report({k}):\n{reports[k].table()}")
        display({"text/plain": out.render(top), "text/html": out.html(top)}, raw=True)
        if not args.no_plot:
            display(comparison_kernels(out))
            for k in sorted(reports):
                display(fusion_patterns(reports[k]))
        if output:
            self._shell.user_ns[output] = out
        return None

    # -- %fl_caps ----------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("backend", nargs="?", help="backend to open on (default: current)")
    def fl_caps(self, line: str) -> None:
        """The capability explorer: devices, op coverage, fused kernels, collectives, comparison."""
        from torch_fl.notebook import CapabilityExplorer

        args = _parse(self.fl_caps, line)
        backend = _backend_or_usage(args.backend) if args.backend else None
        explorer = CapabilityExplorer(backend)
        display(explorer)
        return None

    # -- %fl_explain ------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("op", help='an aten op: "aten::add.Tensor", "add.Tensor", "mm", or "fl::conv_bn_relu"')
    @argument("--dtype", default="float32")
    @argument("--detail", action="store_true", help="every tier's reason on each backend, not one row each")
    def fl_explain(self, line: str) -> None:
        """Which path OP takes on every backend, and why: one row per backend."""
        args = _parse(self.fl_explain, line)
        try:
            table = fl.explain_all(args.op, args.dtype)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if args.detail:
            print("\n".join(e.render() for e in table.rows))
        else:
            display(table)
        return None

    # -- %fl_watch ---------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("model", help="name of the nn.Module the loop trains")
    @argument("optimizer", nargs="?", help="name of its optimizer: each optimizer.step() ends a step")
    @argument(
        "-o",
        "--output",
        metavar="NAME",
        default="watch",
        help="the Watch's name in the namespace (default: watch); call NAME(loss) to record the loss",
    )
    def fl_watch(self, line: str) -> None:
        """A live view of a training loop: per step the loss, kernels, CPU fallbacks, bytes copied, device
        memory, and the ops taking each path; it redraws as each step ends."""
        from torch_fl.notebook import WatchView

        args = _parse(self.fl_watch, line)
        output = output_name(args.output)
        model = self._lookup(args.model)
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"{args.model!r} is a {type(model).__name__}, not an nn.Module")
        opt = self._lookup(args.optimizer) if args.optimizer else None
        if opt is not None and not isinstance(opt, torch.optim.Optimizer):
            raise UsageError(f"{args.optimizer!r} is a {type(opt).__name__}, not a torch.optim optimizer")
        w = fl.watch(model, opt)
        self._shell.user_ns[output] = w
        display(WatchView(w))
        return None

    # -- %fl_align ---------------------------------------------------------------------
    @line_cell_magic
    @magic_arguments()
    @argument("model", nargs="?", help="name of an nn.Module in the namespace (cell form: default 'model')")
    @argument(
        "inputs",
        nargs="?",
        help="name of its input tensor (or tuple of tensors), on the CPU (cell form: default 'inputs')",
    )
    @argument("target", nargs="?", help="name of a target tensor for the loss (cell form: 'target' if defined)")
    @argument("--backend", help="backend to check (default: current)")
    @argument("--reference", default="cpu", help='"cpu" (native PyTorch, default) or an fl backend')
    @argument("--steps", type=int, help="training steps to compare (0 skips; default: %%config FlMagics.steps, 20)")
    @argument("-o", "--output", metavar="NAME", help="store the AlignmentReport in this variable")
    @argument("--no-plot", action="store_true")
    def fl_align(self, line: str, cell: str | None = None) -> None:
        """Precision alignment of MODEL on a backend against a reference: per-module
        outputs, gradients, autocast, and a short training run. As a cell magic the
        cell runs first (it builds the model and its inputs), then what it defined is
        aligned: the names given, else `model`, `inputs` and (if defined) `target`."""
        from torch_fl.notebook import alignment_layers, alignment_losses

        args = _parse(self.fl_align, line)
        output = output_name(args.output)
        if cell is not None:
            __tracebackhide__ = True
            before = self._shell.user_ns.get("target", _UNSET)
            run_cell_code(self._shell, cell, display=False)
            if args.model is None:  # the default names; `target` only where this cell (re)defined it
                args.model, args.inputs = "model", args.inputs or "inputs"
                if self._shell.user_ns.get("target", _UNSET) is not before:
                    args.target = "target"
        elif not (args.model and args.inputs):
            raise UsageError(
                "%fl_align MODEL INPUTS [TARGET]: name the model and its inputs in this namespace "
                "(or use %%fl_align, whose cell defines model and inputs)"
            )
        model, inputs = self._lookup(args.model), self._lookup(args.inputs)
        target = self._lookup(args.target) if args.target else None
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"{args.model!r} is a {type(model).__name__}, not an nn.Module")
        if not (
            isinstance(inputs, torch.Tensor)
            or (isinstance(inputs, (tuple, list)) and inputs and all(isinstance(x, torch.Tensor) for x in inputs))
        ):
            raise UsageError(
                f"{args.inputs!r} is a {type(inputs).__name__}, not the model's input: pass the name of "
                f"a tensor (or a tuple of tensors) on the CPU"
            )
        if target is not None and not isinstance(target, torch.Tensor):
            raise UsageError(f"{args.target!r} is a {type(target).__name__}, not a target tensor")
        if args.steps is not None and args.steps < 0:
            raise UsageError(f"--steps {args.steps}: the number of training steps must be 0 or more")
        backend = _backend_or_usage(args.backend) if args.backend else None
        if args.reference != "cpu":
            _backend_or_usage(args.reference)
        steps = self.steps if args.steps is None else args.steps
        report = fl.align(model, inputs, target, backend=backend, reference=args.reference, steps=steps)
        print(report.render())
        if not args.no_plot:
            display(alignment_layers(report))
            if report.training:
                display(alignment_losses(report))
        if output:
            self._shell.user_ns[output] = report
        return None


def load_ipython_extension(ipython: InteractiveShell) -> None:
    import torch_fl.notebook  # noqa: F401 - registers the progress bar long runs show in a notebook

    ipython.register_magics(FlMagics)


def unload_ipython_extension(ipython: InteractiveShell) -> None:  # noqa: ARG001 - IPython's hook signature
    return None
