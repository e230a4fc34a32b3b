"""fl_plugin.h is the one source of every constant C and Python share (issue 19): the runtime's string
codes, feature flags, statuses, argument kinds and dtype codes are what a C compiler reads in the header,
and torch_fl.get_include() names the folder a plugin compiles against, fl_kernel_util.h included."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch

import torch_fl
from torch_fl.runtime import STRING_CODES, TO_CODE, abi, get_include, header_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CC = shutil.which(os.environ.get("CC", "cc"))
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")


def _compile_and_run(tmp_path, body: str, includes=("fl_plugin.h",)) -> str:
    src = tmp_path / "probe.c"
    head = "".join(f'#include "{h}"\n' for h in includes)
    src.write_text("#include <stdio.h>\n" + head + "int main(void) {\n" + body + "\nreturn 0;\n}\n")
    exe = tmp_path / "probe"
    subprocess.run(
        [CC, "-std=gnu11", "-Wall", "-Werror", "-I", get_include(), str(src), "-o", str(exe), "-lm"],
        check=True,
        capture_output=True,
        text=True,
    )
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def test_get_include_is_public_and_holds_both_headers():
    assert "get_include" in torch_fl.__all__
    folder = torch_fl.get_include()
    assert folder == get_include() == os.path.dirname(header_path())  # header_path keeps working
    assert os.path.isfile(os.path.join(folder, "fl_plugin.h"))
    assert os.path.isfile(os.path.join(folder, "fl_kernel_util.h"))


@needs_cc
def test_the_runtime_reads_its_constants_from_the_header(tmp_path):
    """Each Python value equals what the C compiler sees for the same name in fl_plugin.h."""
    pairs = [(f"FL_STR_{s}", code) for s, code in STRING_CODES.items()]
    pairs += [("FL_STR_UNKNOWN", abi.STRING_UNKNOWN)]
    pairs += [(f"FL_FEATURE_{name}", value) for name, value in abi.FEATURES.items()]
    pairs += [
        ("FL_KERNEL_FUSED", abi.KERNEL_FUSED),
        ("FL_KERNEL_ANY_OUT_LAYOUT", abi.KERNEL_ANY_OUT_LAYOUT),
        ("FL_ABI_VERSION", abi.ABI_VERSION),
        ("FL_MAX_DIMS", abi.MAX_DIMS),
    ]
    pairs += [(name, code) for code, name in abi.STATUS_NAMES.items()]
    pairs += [
        (f"FL_ARG_{k}", getattr(abi, f"ARG_{k}"))
        for k in ("NONE", "TENSOR", "TENSOR_LIST", "INT", "FLOAT", "BOOL", "INT_LIST", "DTYPE", "OTHER")
    ]
    pairs += [(f"FL_{str(d).replace('torch.', '').upper()}", code) for d, code in TO_CODE.items()]
    body = "\n".join(f'printf("%lld\\n", (long long){name});' for name, _ in pairs)
    seen = [int(v) for v in _compile_and_run(tmp_path, body).split()]
    assert seen == [v for _, v in pairs]


def test_every_string_code_of_the_header_reaches_python():
    """The enum is the list: a constant added to fl_string_code_t is a string the runtime passes, with
    its code, and no other string has one."""
    with open(header_path()) as f:
        text = f.read()
    enum = text[text.index("typedef enum {\n    FL_STR_UNKNOWN") :]
    enum = enum[: enum.index("} fl_string_code_t;")]
    declared = {m.group(1): int(m.group(2)) for m in re.finditer(r"FL_STR_(\w+) = (-?\d+)", enum)}
    assert declared.pop("UNKNOWN") == abi.STRING_UNKNOWN == -1
    assert STRING_CODES == declared
    assert len(set(declared.values())) == len(declared)  # one code per string
    assert {"none", "tanh", "L", "U", "amax", "right"} <= set(STRING_CODES)  # strings the host kernels read


def test_dtype_codes_come_from_the_header():
    assert TO_CODE[torch.float32] == 0 and TO_CODE[torch.bfloat16] == 3 and TO_CODE[torch.complex128] == 11
    assert len(TO_CODE) == abi.ffi.typeof("fl_dtype_t").relements["FL_DTYPE_COUNT"]


@needs_cc
def test_kernel_util_walks_broadcasts_and_converts(tmp_path):
    """fl_kernel_util.h on its own (the header vendors get): a broadcast add over a transposed operand
    through fl_iter_t, the lines of fl_rows_t, fl_walk_t's coordinates, bf16 rounding, argument
    accessors and the size grammar."""
    body = r"""
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30}, o[6] = {0};
    /* a: [3, 2] read transposed as [2, 3]; b: [3] broadcast over the rows */
    fl_tensor_t ta = {a, 0, FL_FLOAT32, 2, {2, 3}, {1, 2}}, tb = {b, 0, FL_FLOAT32, 1, {3}, {1}};
    fl_tensor_t to = {o, 0, FL_FLOAT32, 2, {2, 3}, {3, 1}}, vb;
    if (fl_bcast(&tb, to.ndim, to.sizes, &vb)) return 1;
    fl_tensor_t bad = {b, 0, FL_FLOAT32, 1, {2}, {1}}, vbad;
    printf("%d\n", fl_bcast(&bad, to.ndim, to.sizes, &vbad));
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){&to, &ta, &vb});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, r, base);
        for (int64_t i = 0; i < it.inner; i++)
            o[base[0] + i * it.inner_stride[0]] =
                a[base[1] + i * it.inner_stride[1]] + b[base[2] + i * it.inner_stride[2]];
    }
    for (int i = 0; i < 6; i++) printf("%g\n", o[i]);
    fl_rows_t rows; /* the columns of `to` (dim 0): 3 lines of 2 */
    if (fl_rows_init(&rows, (const fl_tensor_t *[]){&to}, 1, 0)) return 2;
    int64_t off[FL_ROWS_MAX];
    fl_rows_at(&rows, (const fl_tensor_t *[]){&to}, 2, off);
    printf("%lld %lld %lld %g\n", (long long)rows.nrows, (long long)rows.len, (long long)rows.st[0],
           o[off[0] + rows.st[0]]);
    fl_walk_t w;
    fl_walk_init(&w, ta.ndim, ta.sizes);
    int k = fl_walk_add(&w, &ta);
    int64_t ctr[FL_MAX_DIMS], woff[FL_WALK_MAX];
    fl_walk_seek(&w, 4, ctr, woff);
    printf("%lld %lld %g\n", (long long)ctr[0], (long long)ctr[1], a[woff[k]]);
    printf("%g %g\n", fl_bf16_to_f32(fl_f32_to_bf16(1.00390625f)), fl_f16_to_f32(fl_f32_to_f16(0.1f)));
    fl_arg_t args[2] = {{FL_ARG_FLOAT, 0, 0, 2.5, {0}}, {FL_ARG_OTHER, 0, FL_STR_amax, 0, {0}}};
    int d = -5, wrapped = fl_wrap_dim(-1, 3, &d);
    printf("%g %lld %lld %d %d %d\n", fl_arg_num(&args[0]), (long long)fl_arg_code(args, 2, 1),
           (long long)fl_arg_int_or(args, 2, 5, 7), wrapped, d, fl_wrap_dim(3, 3, &d));
    uint64_t sz = 0, other = 0;
    int ok = fl_parse_size("1.5 GiB", &sz), refused = fl_parse_size("12Q", &other);
    printf("%d %llu %d\n", ok, (unsigned long long)sz, refused);
    printf("%.6f\n", fl_vexpf(1.0f));
    """
    out = _compile_and_run(tmp_path, body, ("fl_kernel_util.h",)).split("\n")
    assert out[0] == "-1"
    assert out[1:7] == ["11", "23", "35", "12", "24", "36"]  # a.t() + b
    assert out[7] == "3 2 3 36"
    assert out[8] == "1 1 4"  # element 4 of the [2, 3] view: coordinates (1, 1), a[1 + 2 * 1]
    assert out[9] == "1 0.0999756"  # 1 + 2**-8 rounds to even in bfloat16; 0.1 in float16
    assert out[10] == "2.5 9 7 0 2 -1"  # FL_STR_amax; the default; dim -1 of 3 is 2, dim 3 is out of range
    assert out[11] == "0 1610612736 -1"
    assert out[12] == "2.718282"


@pytest.mark.slow  # a subprocess
@needs_cc
def test_template_builds_against_the_installed_headers_alone(tmp_path):
    """plugins_cffi/template/Makefile with FL_INCLUDE=torch_fl.get_include(): fl_plugin.h and
    fl_kernel_util.h are all it needs, and only the two FL_EXPORT symbols leave the library."""
    for name in ("fl_template.c", "Makefile"):
        shutil.copy(os.path.join(ROOT, "plugins_cffi", "template", name), tmp_path / name)
    subprocess.run(
        ["make", "-C", str(tmp_path), f"FL_INCLUDE={torch_fl.get_include()}", "CFLAGS=-O1 -Wall -Wextra -Werror"],
        check=True,
        capture_output=True,
    )
    nm = shutil.which("nm")
    if nm:
        out = subprocess.run(
            [nm, "-D", "--defined-only", str(tmp_path / "libfl_template.so")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert sorted(line.split()[-1] for line in out.splitlines()) == ["fl_plugin_abi_version", "fl_plugin_init"]
