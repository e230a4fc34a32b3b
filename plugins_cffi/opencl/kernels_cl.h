/* kernels_cl.h — the OpenCL C sources of the torch_fl OpenCL plugin, as C string
 * literals. Each program is built at first use per device, once per compute type
 * (build options -DT=float ... pick the type). */
#ifndef FL_OPENCL_KERNELS_CL_H
#define FL_OPENCL_KERNELS_CL_H

/* shared prelude: strided walks and the parameter block (layouts match ocl.h) */
#define FL_CL_PRELUDE                                                                                  \
"#ifdef HAS_FP64\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\ntypedef double REAL;\n#else\ntypedef float REAL;\n#endif\n" \
"typedef struct { long size[8]; long st[4][8]; long off[4]; long ndim; long n; } walk_t;\n"          \
"typedef struct { long si[4]; long pi[4]; REAL sd[4]; REAL pd[4]; } prm_t;\n"                        \
"inline void offs(const walk_t *w, long g, long *o) {\n"                                             \
"  o[0] = w->off[0]; o[1] = w->off[1]; o[2] = w->off[2]; o[3] = w->off[3];\n"                        \
"  if (w->ndim == 1) { o[0] += g * w->st[0][0]; o[1] += g * w->st[1][0]; o[2] += g * w->st[2][0]; o[3] += g * w->st[3][0]; return; }\n" \
"  for (int d = (int)w->ndim - 1; d >= 0; d--) { long s = w->size[d]; long i = g % s; g /= s;\n"     \
"    o[0] += i * w->st[0][d]; o[1] += i * w->st[1][d]; o[2] += i * w->st[2][d]; o[3] += i * w->st[3][d]; }\n" \
"}\n"                                                                                                  \
"inline void seterr(__global int *err, int code, long v) { if (atomic_cmpxchg(err, 0, code) == 0) ((__global long *)err)[1] = v; }\n" \
"inline ulong smix(ulong x) { x += 0x9e3779b97f4a7c15UL; x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9UL;\n" \
"  x = (x ^ (x >> 27)) * 0x94d049bb133111ebUL; return x ^ (x >> 31); }\n"                           \
"#ifdef HAS_FP64\ninline REAL runi(ulong seed, ulong c) { return (double)(smix(seed ^ smix(c)) >> 11) * (1.0 / 9007199254740992.0); }\n" \
"#else\ninline REAL runi(ulong seed, ulong c) { return (float)(smix(seed ^ smix(c)) >> 40) * (1.0f / 16777216.0f); }\n#endif\n"

/* elementwise program, built per T (float, double, long, int, uchar=bool) */
static const char *const CL_EW_SRC = FL_CL_PRELUDE
"#define LD(k, p) ((sm & (1u << (k))) ? SCAL(k) : p[o[(k) + 1]])\n"
"#ifdef IS_FLOAT\n#define SCAL(k) ((T)p.sd[k])\n#define PA ((T)p.pd[0])\n#define PB ((T)p.pd[1])\n"
"#else\n#define SCAL(k) ((T)p.si[k])\n#define PA ((T)p.pi[0])\n#define PB ((T)p.pi[1])\n#endif\n"
"#define HEAD long g = get_global_id(0); if (g >= w.n) return; long o[4]; offs(&w, g, o);\n"
"#define EW1(name, E) __kernel void u_##name(__global T *out, __global const T *x, walk_t w, prm_t p, uint sm) {\\\n"
"  HEAD T a = LD(0, x); out[o[0]] = (E); }\n"
"#define EW2(name, E) __kernel void b_##name(__global T *out, __global const T *x, __global const T *y, walk_t w, prm_t p, uint sm) {\\\n"
"  HEAD T a = LD(0, x); T b = LD(1, y); out[o[0]] = (E); }\n"
"#define CMP(name, E) __kernel void c_##name(__global uchar *out, __global const T *x, __global const T *y, walk_t w, prm_t p, uint sm) {\\\n"
"  HEAD T a = LD(0, x); T b = LD(1, y); out[o[0]] = (E) ? 1 : 0; }\n"
"EW2(add, a + PA * b)\n"
"EW2(sub, a - PA * b)\n"
"EW2(mul, a * b)\n"
"EW1(neg, -a)\n"
"CMP(eq, a == b) CMP(ne, a != b) CMP(lt, a < b) CMP(le, a <= b) CMP(gt, a > b) CMP(ge, a >= b)\n"
"__kernel void t_where(__global T *out, __global const uchar *c, __global const T *x, __global const T *y, walk_t w, prm_t p, uint sm) {\n"
"  HEAD uchar cc = (sm & 1u) ? (uchar)(p.si[0] != 0) : c[o[1]]; T a = LD(1, x); T b = LD(2, y); out[o[0]] = cc ? a : b; }\n"
"__kernel void x_gather(__global T *out, __global const T *x, __global const long *idx, walk_t w, long xs, long xn, __global int *err) {\n"
"  HEAD long i = idx[o[1]]; if (i < 0 || i >= xn) { seterr(err, 1, i); out[o[0]] = (T)0; return; } out[o[0]] = x[o[2] + i * xs]; }\n"
/* scatter family, one work-item per line along dim (PyTorch CPU's order: deterministic, last write wins).
 * mode 0: out[i] = src, 1: out[i] = value, 2: out[i] += src */
"__kernel void x_scat(__global T *out, __global const long *idx, __global const T *src, walk_t w, long L, long os, long on, long is, long ss,\n"
"    prm_t p, int mode, __global int *err) {\n"
"  HEAD for (long j = 0; j < L; j++) { long i = idx[o[1] + j * is]; if (i < 0 || i >= on) { seterr(err, 1, i); return; }\n"
"    T v = mode == 1 ? SCAL(0) : src[o[2] + j * ss]; __global T *q = out + o[0] + i * os;\n"
"#ifdef IS_BOOL\n    if (mode == 2) *q = (*q | v) ? 1 : 0; else *q = v; }\n#else\n    if (mode == 2) *q = *q + v; else *q = v; }\n#endif\n"
"}\n"
/* embedding_dense_backward: one work-item per column, rows in order */
"__kernel void x_embbw(__global T *out, __global const long *idx, __global const T *gr, walk_t w, long Dm, long gsl, long ooff, long os0, long os1,\n"
"    long nw, long pad, __global int *err) {\n"
"  long k = get_global_id(0); if (k >= Dm) return; long o[4];\n"
"  for (long n = 0; n < w.n; n++) { offs(&w, n, o); long i = idx[o[0]]; if (i < 0 || i >= nw) { seterr(err, 1, i); continue; }\n"
"    if (i == pad) continue; out[ooff + i * os0 + k * os1] += gr[o[1] + k * gsl]; } }\n"
/* bool-valued predicates computed in T */
"#define PRED(name, E) __kernel void p_##name(__global uchar *out, __global const T *x, walk_t w, prm_t p, uint sm) {\\\n"
"  HEAD T a = LD(0, x); out[o[0]] = (E) ? 1 : 0; }\n"
"PRED(lnot, a == (T)0)\n"
/* division-like ops: d_* take an error flag (integer division by zero) */
"#define EWD(name, E) __kernel void d_##name(__global T *out, __global const T *x, __global const T *y, walk_t w, prm_t p, uint sm, __global int *err) {\\\n"
"  HEAD T a = LD(0, x); T b = LD(1, y); ZCHK out[o[0]] = (E); }\n"
"__kernel void r_bernoulli(__global T *out, walk_t w, ulong seed, ulong start, REAL pr) {\n"
"  HEAD out[o[0]] = (T)(runi(seed, start + (ulong)g) < pr ? 1 : 0); }\n"
"#ifdef IS_FLOAT\n"
"#define ZCHK\n"
"inline T divfloor(T a, T b) { if (b == (T)0) return a / b; T mod = fmod(a, b); T dv = (a - mod) / b;\n"
"  if (mod != (T)0 && ((b < (T)0) != (mod < (T)0))) dv -= (T)1; T fd;\n"
"  if (dv != (T)0) { fd = floor(dv); if (dv - fd > (T)0.5) fd += (T)1; } else fd = copysign((T)0, a / b); return fd; }\n"
"inline T remf(T a, T b) { T m = fmod(a, b); if (m != (T)0 && ((b < (T)0) != (m < (T)0))) m += b; return m; }\n"
"EWD(divtrunc, trunc(a / b)) EWD(divfloor, divfloor(a, b)) EWD(fmod, fmod(a, b)) EWD(rem, remf(a, b))\n"
"EW1(sin, sin(a)) EW1(cos, cos(a)) EW1(ceil, ceil(a)) EW1(floor, floor(a)) EW1(trunc, trunc(a))\n"
"EW1(sign, a > (T)0 ? (T)1 : (a < (T)0 ? (T)-1 : (T)0))\n"
"PRED(signbit, signbit(a))\n"
"EW2(div, a / b)\n"
"EW2(maximum, isnan(a) ? a : (isnan(b) ? b : (a > b ? a : b)))\n"
"EW2(minimum, isnan(a) ? a : (isnan(b) ? b : (a < b ? a : b)))\n"
"EW1(abs, fabs(a)) EW1(exp, exp(a)) EW1(log, log(a)) EW1(sqrt, sqrt(a)) EW1(rsqrt, rsqrt(a)) EW1(tanh, tanh(a))\n"
"EW1(erf, erf(a)) EW1(sigmoid, (T)1 / ((T)1 + exp(-a))) EW1(relu, a < 0 ? (T)0 : a)\n"
"EW1(gelu, (T)0.5 * a * ((T)1 + erf(a * (T)M_SQRT1_2)))\n"
"EW1(gelut, (T)0.5 * a * ((T)1 + tanh((T)0.7978845608028654 * (a + (T)0.044715 * a * a * a))))\n"
"EW1(silu, a / ((T)1 + exp(-a)))\n"
"EW1(pow, pow(a, PA)) EW1(sq, a * a)\n"
"EW1(threshold, a <= PA ? PB : a)\n"
"EW2(threshold_bw, b <= PA ? (T)0 : a)\n"
"EW2(sigmoid_bw, a * ((T)1 - b) * b)\n"
"EW2(tanh_bw, a * ((T)1 - b * b))\n"
"inline T sg(T x) { return (T)1 / ((T)1 + exp(-x)); }\n"
"EW2(silu_bw, a * sg(b) * ((T)1 + b * ((T)1 - sg(b))))\n"
"EW2(gelu_bw, a * ((T)0.5 * ((T)1 + erf(b * (T)M_SQRT1_2)) + b * exp((T)-0.5 * b * b) * (T)0.3989422804014327))\n"
"inline T gtbw(T g, T x) { T xsq = x * x; T t = tanh((T)0.7978845608028654 * (x + (T)0.044715 * xsq * x));\n"
"  return g * ((T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * (T)0.7978845608028654 * ((T)1 + (T)3 * (T)0.044715 * xsq)); }\n"
"EW2(gelut_bw, gtbw(a, b))\n"
"__kernel void r_uniform(__global T *out, walk_t w, ulong seed, ulong start, REAL lo, REAL hi) {\n"
"  HEAD out[o[0]] = (T)(lo + (hi - lo) * runi(seed, start + (ulong)g)); }\n"
"__kernel void r_normal(__global T *out, walk_t w, ulong seed, ulong start, REAL m, REAL s) {\n"
"  HEAD REAL u1 = runi(seed, start + 2 * (ulong)g), u2 = runi(seed, start + 2 * (ulong)g + 1);\n"
"  out[o[0]] = (T)(m + s * sqrt((REAL)-2 * log((REAL)1 - u1)) * cos((REAL)2 * M_PI * u2)); }\n"
"__kernel void a_arange(__global T *out, walk_t w, REAL start, REAL step) { HEAD out[o[0]] = (T)(start + (REAL)g * step); }\n"
"#else\n"
"EW2(band, a & b) EW2(bor, a | b) EW2(bxor, a ^ b)\n"
"#ifdef IS_BOOL\nEW1(bnot, !a)\n#else\nEW1(bnot, ~a)\n#endif\n"
"#define ZCHK if (b == (T)0) { seterr(err, 2, 0); out[o[0]] = (T)0; return; }\n"
"inline T idivfloor(T a, T b) { T q = a / b; if ((a % b) != 0 && ((a < 0) != (b < 0))) q--; return q; }\n"
"inline T iremf(T a, T b) { T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }\n"
"EWD(divtrunc, a / b) EWD(divfloor, idivfloor(a, b)) EWD(fmod, a % b) EWD(rem, iremf(a, b))\n"
"EW1(ceil, a) EW1(floor, a) EW1(trunc, a) EW1(sign, (T)((a > 0) - (a < 0)))\n"
"PRED(signbit, a < 0)\n"
"EW2(maximum, a > b ? a : b) EW2(minimum, a < b ? a : b)\n"
"EW1(abs, a < 0 ? -a : a) EW1(relu, a < 0 ? (T)0 : a)\n"
"EW2(threshold_bw, b <= PA ? (T)0 : a)\n"
"__kernel void a_arange(__global T *out, walk_t w, long start, long step) { HEAD out[o[0]] = (T)(start + g * step); }\n"
"#endif\n";

/* conversions and raw copies/fills between every declared storage type */
static const char *const CL_CVT_SRC = FL_CL_PRELUDE
"#define HEAD long g = get_global_id(0); if (g >= w.n) return; long o[4]; offs(&w, g, o);\n"
"#define CV(S, sn, D, dn) __kernel void cv_##sn##_##dn(__global D *out, __global const S *x, walk_t w) { HEAD out[o[0]] = (D)x[o[1]]; }\n"
"#define CVB(S, sn) __kernel void cv_##sn##_b(__global uchar *out, __global const S *x, walk_t w) { HEAD out[o[0]] = x[o[1]] != (S)0 ? 1 : 0; }\n"
"#ifdef HAS_FP64\n#define ROWF64(S, sn) CV(S, sn, double, f64)\n#else\n#define ROWF64(S, sn)\n#endif\n"
"#define ROW(S, sn) CV(S, sn, float, f32) ROWF64(S, sn) CV(S, sn, long, i64) CV(S, sn, int, i32) CV(S, sn, short, i16) CV(S, sn, char, i8) CV(S, sn, uchar, u8) CVB(S, sn)\n"
"ROW(float, f32) ROW(long, i64) ROW(int, i32) ROW(short, i16) ROW(char, i8) ROW(uchar, u8) ROW(uchar, b)\n"
"#ifdef HAS_FP64\nROW(double, f64)\n#endif\n"
/* float16 storage: vload_half / vstore_half (OpenCL 1.2 core, no cl_khr_fp16 needed) */
"#define FROMH(D, dn) __kernel void cv_f16_##dn(__global D *out, __global const half *x, walk_t w) { HEAD out[o[0]] = (D)vload_half(o[1], x); }\n"
"#define TOH(S, sn) __kernel void cv_##sn##_f16(__global half *out, __global const S *x, walk_t w) { HEAD vstore_half_rte((float)x[o[1]], o[0], out); }\n"
"FROMH(float, f32) FROMH(long, i64) FROMH(int, i32) FROMH(short, i16) FROMH(char, i8) FROMH(uchar, u8)\n"
"__kernel void cv_f16_b(__global uchar *out, __global const half *x, walk_t w) { HEAD out[o[0]] = vload_half(o[1], x) != 0.0f ? 1 : 0; }\n"
"TOH(float, f32) TOH(long, i64) TOH(int, i32) TOH(short, i16) TOH(char, i8) TOH(uchar, u8) TOH(uchar, b)\n"
"#ifdef HAS_FP64\nFROMH(double, f64)\n"
"__kernel void cv_f64_f16(__global half *out, __global const double *x, walk_t w) { HEAD vstore_half_rte(x[o[1]], o[0], out); }\n#endif\n"
"#define RAW(U, n) __kernel void cp_##n(__global U *out, __global const U *x, walk_t w) { HEAD out[o[0]] = x[o[1]]; }\\\n"
"  __kernel void fl_##n(__global U *out, walk_t w, U v) { HEAD out[o[0]] = v; }\n"
"RAW(uchar, 1) RAW(ushort, 2) RAW(uint, 4) RAW(ulong, 8)\n";

/* reductions, built per T with ACC (accumulator) */
static const char *const CL_RED_SRC = FL_CL_PRELUDE
"typedef struct { long osize[8]; long ost_o[8]; long ost_i[8]; long rsize[8]; long rst[8];\n"
"  long ooff, ioff, ondim, rndim, nout, nred, chunk, nchunk; } red_t;\n"
"#ifdef IS_FLOAT\n#define MAXOP(m, v) m = (isnan(v) || v > m || isnan(m)) ? (isnan(m) ? m : v) : m\n"
"#define MINOP(m, v) m = (isnan(v) || v < m || isnan(m)) ? (isnan(m) ? m : v) : m\n"
"#define BETTER_MAX(v, m) ((isnan(v) && !isnan(m)) || v > m)\n#define BETTER_MIN(v, m) ((isnan(v) && !isnan(m)) || v < m)\n"
"#else\n#define MAXOP(m, v) m = v > m ? v : m\n#define MINOP(m, v) m = v < m ? v : m\n"
"#define BETTER_MAX(v, m) (v > m)\n#define BETTER_MIN(v, m) (v < m)\n#endif\n"
"typedef struct { long st[8]; long off; } ist_t;\n"
"inline long ioff_of(const red_t *r, const ist_t *s, long oi) { long o = s->off, rem = oi;\n"
"  for (int d = (int)r->ondim - 1; d >= 0; d--) { long i = rem % r->osize[d]; rem /= r->osize[d]; o += i * s->st[d]; } return o; }\n"
"#define RBODY(INIT, STEP, ACCT) \\\n"
"  long g = get_global_id(0); if (g >= r.nout * r.nchunk) return; long oi = g % r.nout, c = g / r.nout;\\\n"
"  long oo = r.ooff, io = r.ioff, rem = oi;\\\n"
"  for (int d = (int)r.ondim - 1; d >= 0; d--) { long i = rem % r.osize[d]; rem /= r.osize[d]; oo += i * r.ost_o[d]; io += i * r.ost_i[d]; }\\\n"
"  long lo = c * r.chunk, hi = lo + r.chunk; if (hi > r.nred) hi = r.nred;\\\n"
"  long ctr[8]; rem = lo; long ro = io;\\\n"
"  for (int d = (int)r.rndim - 1; d >= 0; d--) { ctr[d] = rem % r.rsize[d]; rem /= r.rsize[d]; ro += ctr[d] * r.rst[d]; }\\\n"
"  ACCT acc = INIT; int last = (int)r.rndim - 1; long ls = r.rst[last], lsz = r.rsize[last];\\\n"
"  for (long q = lo; q < hi;) { long run = lsz - ctr[last]; if (run > hi - q) run = hi - q;\\\n"
"    for (long t = 0; t < run; t++) { ACCT v = (ACCT)x[ro + t * ls]; STEP; }\\\n"
"    q += run; ro += run * ls; ctr[last] += run;\\\n"
"    for (int d = last; d > 0 && ctr[d] >= r.rsize[d]; d--) { ro -= ctr[d] * r.rst[d]; ctr[d] = 0; ctr[d - 1]++; ro += r.rst[d - 1]; } }\n"
"__kernel void r_sum(__global T *out, __global ACC *part, __global const T *x, red_t r, REAL scale) {\n"
"  RBODY((ACC)0, acc += v, ACC)\n"
"  if (r.nchunk == 1) out[oo] = (T)(acc * (ACC)scale); else part[c * r.nout + oi] = acc; }\n"
"__kernel void f_sum(__global T *out, __global const ACC *part, red_t r, REAL scale) {\n"
"  long oi = get_global_id(0); if (oi >= r.nout) return; long oo = r.ooff, rem = oi;\n"
"  for (int d = (int)r.ondim - 1; d >= 0; d--) { long i = rem % r.osize[d]; rem /= r.osize[d]; oo += i * r.ost_o[d]; }\n"
"  ACC acc = 0; for (long c = 0; c < r.nchunk; c++) acc += part[c * r.nout + oi]; out[oo] = (T)(acc * (ACC)scale); }\n"
"__kernel void r_max(__global T *out, __global T *part, __global const T *x, red_t r, REAL scale) {\n"
"  RBODY(x[io], MAXOP(acc, v), T)\n"
"  if (r.nchunk == 1) out[oo] = acc; else part[c * r.nout + oi] = acc; }\n"
"__kernel void f_max(__global T *out, __global const T *part, red_t r, REAL scale) {\n"
"  long oi = get_global_id(0); if (oi >= r.nout) return; long oo = r.ooff, rem = oi;\n"
"  for (int d = (int)r.ondim - 1; d >= 0; d--) { long i = rem % r.osize[d]; rem /= r.osize[d]; oo += i * r.ost_o[d]; }\n"
"  T acc = part[oi]; for (long c = 1; c < r.nchunk; c++) { T v = part[c * r.nout + oi]; MAXOP(acc, v); } out[oo] = acc; }\n"
"__kernel void r_min(__global T *out, __global T *part, __global const T *x, red_t r, REAL scale) {\n"
"  RBODY(x[io], MINOP(acc, v), T)\n"
"  if (r.nchunk == 1) out[oo] = acc; else part[c * r.nout + oi] = acc; }\n"
"__kernel void f_min(__global T *out, __global const T *part, red_t r, REAL scale) {\n"
"  long oi = get_global_id(0); if (oi >= r.nout) return; long oo = r.ooff, rem = oi;\n"
"  for (int d = (int)r.ondim - 1; d >= 0; d--) { long i = rem % r.osize[d]; rem /= r.osize[d]; oo += i * r.ost_o[d]; }\n"
"  T acc = part[oi]; for (long c = 1; c < r.nchunk; c++) { T v = part[c * r.nout + oi]; MINOP(acc, v); } out[oo] = acc; }\n"
/* value and index of the max/min (first occurrence; NaN wins); flags 1 min, 2 write values, 4 write indices; nchunk 1 */
"__kernel void r_arg(__global T *out, __global long *iout, __global const T *x, red_t r, ist_t is, int flags) {\n"
"  long bi = 0; int mn = flags & 1;\n"
"  RBODY(x[io], if (mn ? BETTER_MIN(v, acc) : BETTER_MAX(v, acc)) { acc = v; bi = q + t; }, T)\n"
"  if (flags & 2) out[oo] = acc; if (flags & 4) iout[ioff_of(&r, &is, oi)] = bi; }\n"
/* cumulative sum along rows, accumulating in ACC */
"typedef struct { long osize[8]; long ost[2][8]; long off[2]; long ondim, nrows, L; long lst[2]; } crow_t;\n"
"__kernel void cumsum(__global T *out, __global const T *x, crow_t r) {\n"
"  long g = get_global_id(0); if (g >= r.nrows) return; long o0 = r.off[0], o1 = r.off[1], rem = g;\n"
"  for (int d = (int)r.ondim - 1; d >= 0; d--) { long i = rem % r.osize[d]; rem /= r.osize[d]; o0 += i * r.ost[0][d]; o1 += i * r.ost[1][d]; }\n"
"  ACC s = 0; for (long i = 0; i < r.L; i++) { s += (ACC)x[o1 + i * r.lst[1]]; out[o0 + i * r.lst[0]] = (T)s; } }\n"
/* sort / topk by rank: each element counts the elements that go before it (stable: ties keep their order;
 * NaN sorts above everything, as in PyTorch) and writes itself there when its rank is below K */
"typedef struct { long osize[8]; long ost[3][8]; long off[3]; long ondim, nrows, L; long lst[3]; } srow_t;\n"
"#ifdef IS_FLOAT\n#define SLT(a, b) (!isnan(a) && (isnan(b) || (a) < (b)))\n#else\n#define SLT(a, b) ((a) < (b))\n#endif\n"
"__kernel void sort_rank(__global T *vo, __global long *io, __global const T *x, srow_t r, long K, int desc) {\n"
"  long g = get_global_id(0); if (g >= r.nrows * r.L) return; long row = g / r.L, i = g % r.L;\n"
"  long o0 = r.off[0], o1 = r.off[1], o2 = r.off[2], rem = row;\n"
"  for (int d = (int)r.ondim - 1; d >= 0; d--) { long q = rem % r.osize[d]; rem /= r.osize[d]; o0 += q * r.ost[0][d]; o1 += q * r.ost[1][d]; o2 += q * r.ost[2][d]; }\n"
"  long ls = r.lst[2]; T xi = x[o2 + i * ls]; long rank = 0;\n"
"  if (desc) { for (long j = 0; j < r.L; j++) { T xj = x[o2 + j * ls]; rank += SLT(xi, xj) || (j < i && !SLT(xj, xi)); } }\n"
"  else { for (long j = 0; j < r.L; j++) { T xj = x[o2 + j * ls]; rank += SLT(xj, xi) || (j < i && !SLT(xi, xj)); } }\n"
"  if (rank < K) { vo[o0 + rank * r.lst[0]] = xi; io[o1 + rank * r.lst[1]] = i; } }\n"
/* long rows: a bitonic sort of (key, index) pairs per row in scratch padded to P (a power of two); the index
 * breaks ties, so the order is the stable one; padding (index >= L) goes last */
"inline void srow_offs(const srow_t *r, long row, long *o) { long rem = row; o[0] = r->off[0]; o[1] = r->off[1]; o[2] = r->off[2];\n"
"  for (int d = (int)r->ondim - 1; d >= 0; d--) { long q = rem % r->osize[d]; rem /= r->osize[d]; o[0] += q * r->ost[0][d]; o[1] += q * r->ost[1][d]; o[2] += q * r->ost[2][d]; } }\n"
"__kernel void bs_init(__global T *k, __global long *ix, __global const T *x, srow_t r, long P) {\n"
"  long g = get_global_id(0); if (g >= r.nrows * P) return; long row = g / P, i = g % P; long o[3]; srow_offs(&r, row, o);\n"
"  k[g] = i < r.L ? x[o[2] + i * r.lst[2]] : (T)0; ix[g] = i; }\n"
"inline int bbefore(T ka, long ia, T kb, long ib, long L, int desc) {\n"
"  if (ia >= L || ib >= L) return ia < ib;\n"
"  int lt = desc ? SLT(kb, ka) : SLT(ka, kb); int gt = desc ? SLT(ka, kb) : SLT(kb, ka); return lt || (!gt && ia < ib); }\n"
"__kernel void bs_step(__global T *k, __global long *ix, long nrows, long P, long L, long j, long kk, int desc) {\n"
"  long g = get_global_id(0); if (g >= nrows * P) return; long row = g / P, t = g % P, l = t ^ j; if (l <= t) return;\n"
"  long a = row * P + t, b = row * P + l; int up = (t & kk) == 0;\n"
"  int sw = up ? bbefore(k[b], ix[b], k[a], ix[a], L, desc) : bbefore(k[a], ix[a], k[b], ix[b], L, desc);\n"
"  if (sw) { T tk = k[a]; k[a] = k[b]; k[b] = tk; long ti = ix[a]; ix[a] = ix[b]; ix[b] = ti; } }\n"
"__kernel void bs_out(__global T *vo, __global long *io, __global const T *k, __global const long *ix, srow_t r, long P, long K) {\n"
"  long g = get_global_id(0); if (g >= r.nrows * K) return; long row = g / K, i = g % K; long o[3]; srow_offs(&r, row, o);\n"
"  vo[o[0] + i * r.lst[0]] = k[row * P + i]; io[o[1] + i * r.lst[1]] = ix[row * P + i]; }\n"
"#ifdef IS_FLOAT\n"
/* var / std (Welford, nchunk 1); flags 1 sqrt, 2 write the mean to out2 */
"__kernel void r_var(__global T *out, __global T *out2, __global const T *x, red_t r, ist_t is, REAL corr, int flags) {\n"
"  ACC wm = 0; ACC wn = 0;\n"
"  RBODY((ACC)0, wn += (ACC)1; ACC dl = v - wm; wm += dl / wn; acc += dl * (v - wm), ACC)\n"
"  ACC den = (ACC)r.nred - (ACC)corr; if (den < 0) den = 0; ACC res = acc / den; if (r.nred == 0) { res = NAN; wm = NAN; }\n"
"  out[oo] = (T)((flags & 1) ? sqrt(res) : res); if (flags & 2) out2[ioff_of(&r, &is, oi)] = (T)wm; }\n"
"#endif\n";

/* float-only: softmax family, layer norm, GEMM (T float or double, ACC, VT vector of TN) */
static const char *const CL_NN_SRC = FL_CL_PRELUDE
"typedef struct { long osize[8]; long ost[3][8]; long off[3]; long ondim, nrows, L; long lst[3]; } rows_t;\n"
"__kernel void softmax(__global T *out, __global const T *x, __global const T *y, rows_t r, int kind) {\n"
"  long g = get_global_id(0); if (g >= r.nrows) return; long o0 = r.off[0], o1 = r.off[1], o2 = r.off[2], rem = g;\n"
"  for (int d = (int)r.ondim - 1; d >= 0; d--) { long i = rem % r.osize[d]; rem /= r.osize[d]; o0 += i * r.ost[0][d]; o1 += i * r.ost[1][d]; o2 += i * r.ost[2][d]; }\n"
"  long L = r.L, s0 = r.lst[0], s1 = r.lst[1], s2 = r.lst[2];\n"
"  if (kind <= 1) { T mx = -INFINITY; int nan = 0; for (long i = 0; i < L; i++) { T v = x[o1 + i * s1]; if (isnan(v)) nan = 1; mx = v > mx ? v : mx; }\n"
"    if (nan) mx = NAN;\n"
"    ACC s = 0; for (long i = 0; i < L; i++) s += (ACC)exp(x[o1 + i * s1] - mx);\n"
"    if (kind == 1) { T ls = (T)log(s); for (long i = 0; i < L; i++) out[o0 + i * s0] = x[o1 + i * s1] - mx - ls; }\n"
"    else { T inv = (T)((ACC)1 / s); for (long i = 0; i < L; i++) out[o0 + i * s0] = exp(x[o1 + i * s1] - mx) * inv; }\n"
"  } else { ACC s = 0;\n"
"    if (kind == 3) { for (long i = 0; i < L; i++) s += (ACC)x[o1 + i * s1] * (ACC)y[o2 + i * s2]; T fs = (T)s;\n"
"      for (long i = 0; i < L; i++) { T yy = y[o2 + i * s2]; out[o0 + i * s0] = yy * (x[o1 + i * s1] - fs); } }\n"
"    else { for (long i = 0; i < L; i++) s += (ACC)x[o1 + i * s1]; T fs = (T)s;\n"
"      for (long i = 0; i < L; i++) out[o0 + i * s0] = x[o1 + i * s1] - exp(y[o2 + i * s2]) * fs; } } }\n"
/* layer norm on [M, N] contiguous rows; w/b may be absent (flags bit 0/1) */
"__kernel void ln_fwd(__global T *out, __global T *mean, __global T *rstd, __global const T *x, __global const T *w, __global const T *b,\n"
"    long xo, long oo, long mo, long ro, long wo, long bo, long M, long N, REAL eps, int flags) {\n"
"  long i = get_global_id(0); if (i >= M) return; __global const T *xr = x + xo + i * N; ACC s = 0;\n"
"  for (long j = 0; j < N; j++) s += (ACC)xr[j]; ACC mu = s / (ACC)N; ACC v = 0;\n"
"  for (long j = 0; j < N; j++) { ACC d = (ACC)xr[j] - mu; v += d * d; } v /= (ACC)N; ACC rs = rsqrt(v + (ACC)eps);\n"
"  if (flags & 4) { mean[mo + i] = (T)mu; rstd[ro + i] = (T)rs; }\n"
"  T fmu = (T)mu, frs = (T)rs; __global T *orow = out + oo + i * N;\n"
"  for (long j = 0; j < N; j++) { T y = (xr[j] - fmu) * frs; if (flags & 1) y *= w[wo + j]; if (flags & 2) y += b[bo + j]; orow[j] = y; } }\n"
"__kernel void ln_bwd_in(__global T *gi, __global const T *go, __global const T *x, __global const T *mean, __global const T *rstd, __global const T *w,\n"
"    long gio, long goo, long xo, long mo, long ro, long wo, long M, long N, int flags) {\n"
"  long i = get_global_id(0); if (i >= M) return; T mu = mean[mo + i], rs = rstd[ro + i]; ACC a = 0, bsum = 0;\n"
"  for (long j = 0; j < N; j++) { T gw = go[goo + i * N + j] * ((flags & 1) ? w[wo + j] : (T)1); T xh = (x[xo + i * N + j] - mu) * rs; a += (ACC)gw; bsum += (ACC)gw * (ACC)xh; }\n"
"  T ma = (T)(a / (ACC)N), mb = (T)(bsum / (ACC)N);\n"
"  for (long j = 0; j < N; j++) { T gw = go[goo + i * N + j] * ((flags & 1) ? w[wo + j] : (T)1); T xh = (x[xo + i * N + j] - mu) * rs;\n"
"    gi[gio + i * N + j] = rs * (gw - ma - xh * mb); } }\n"
"__kernel void ln_bwd_wb(__global T *gw, __global T *gb, __global const T *go, __global const T *x, __global const T *mean, __global const T *rstd,\n"
"    long gwo, long gbo, long goo, long xo, long mo, long ro, long M, long N, int flags) {\n"
"  long j = get_global_id(0); if (j >= N) return; ACC sw = 0, sb = 0;\n"
"  for (long i = 0; i < M; i++) { T g = go[goo + i * N + j]; sb += (ACC)g; sw += (ACC)g * (ACC)((x[xo + i * N + j] - mean[mo + i]) * rstd[ro + i]); }\n"
"  if (flags & 1) gw[gwo + j] = (T)sw; if (flags & 2) gb[gbo + j] = (T)sb; }\n"
/* GEMM: C[b] (+)= alpha * A[b] @ B[b]. B and C have unit column stride; A any strides.
 * One work-item per BM x BN block of C, micro-tiles of TM x TN with TN-wide vectors, K in blocks of KB. */
"typedef struct { long M, N, K, ao, ars, acs, abs, bo, brs, bbs, co, crs, cbs, accum; REAL alpha; } gemm_t;\n"
"#define BM 64\n#define BN 64\n#define TM 8\n#define KB 256\n"
"__kernel __attribute__((reqd_work_group_size(1, 1, 1)))\n"
"void gemm(__global T *C, __global const T *A, __global const T *B, gemm_t g) {\n"
"  long j0 = get_global_id(0) * BN, i0 = get_global_id(1) * BM, bt = get_global_id(2);\n"
"  __global const T *Ab = A + g.ao + bt * g.abs; __global const T *Bb = B + g.bo + bt * g.bbs; __global T *Cb = C + g.co + bt * g.cbs;\n"
"  long ars = g.ars, acs = g.acs, brs = g.brs, crs = g.crs; T alpha = (T)g.alpha;\n"
"  long iend = min(i0 + BM, g.M), jend = min(j0 + BN, g.N);\n"
"  for (long kb = 0; kb < g.K; kb += KB) { long kend = min(kb + KB, g.K); int first = kb == 0 && !g.accum;\n"
"    for (long jj = j0; jj < jend; jj += TN) { for (long ii = i0; ii < iend; ii += TM) {\n"
"      if (ii + TM <= iend && jj + TN <= jend) {\n"
"        VT c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, c7 = 0;\n"
"        __global const T *ap = Ab + ii * ars + kb * acs; __global const T *bp = Bb + kb * brs + jj;\n"
"        for (long k = kb; k < kend; k++) { VT bv = VLOAD(0, bp);\n"
"          c0 = fma((VT)ap[0], bv, c0); c1 = fma((VT)ap[ars], bv, c1); c2 = fma((VT)ap[2 * ars], bv, c2); c3 = fma((VT)ap[3 * ars], bv, c3);\n"
"          c4 = fma((VT)ap[4 * ars], bv, c4); c5 = fma((VT)ap[5 * ars], bv, c5); c6 = fma((VT)ap[6 * ars], bv, c6); c7 = fma((VT)ap[7 * ars], bv, c7);\n"
"          ap += acs; bp += brs; }\n"
"        __global T *cp = Cb + ii * crs + jj;\n"
"#define ST(r, cr) { __global T *q = cp + (r) * crs; VT v = alpha * cr; if (!first) v += VLOAD(0, q); VSTORE(v, 0, q); }\n"
"        ST(0, c0) ST(1, c1) ST(2, c2) ST(3, c3) ST(4, c4) ST(5, c5) ST(6, c6) ST(7, c7)\n"
"      } else {\n"
"        for (long i = ii; i < min(ii + TM, iend); i++) for (long j = jj; j < min(jj + TN, jend); j++) {\n"
"          ACC s = 0; for (long k = kb; k < kend; k++) s += (ACC)Ab[i * ars + k * acs] * (ACC)Bb[k * brs + j];\n"
"          T v = alpha * (T)s; if (!first) v += Cb[i * crs + j]; Cb[i * crs + j] = v; } } } } } }\n";

/* Convolution (float only, T float or double, TN-wide vectors VT; a 1-D one is 2-D with one row): the pieces of
 * ocl_conv.c's convolution kernels around its GEMM.
 * im2col / col2im move between an NCHW tensor of any strides and a column buffer covering the nb samples n0..
 * of a chunk: one row per (channel, tap) k = (c * KH + ki) * KW + kj and one column per (sample, output pixel)
 * j = s * OH * OW + oh * OW + ow, element (k, j) at k * ks + j * js (ocl_conv.c uses the (j, k) layout: js =
 * C * KH * KW, ks = 1). Work-items are laid out over 2-D / 3-D ranges and loop over the taps, so that the
 * index arithmetic has next to no divisions (they dominated a one-element-per-work-item version on pocl).
 * col2im gathers, one work-item per input element summing the taps that read it: no atomics, and the same
 * sum in the same order on every run. */
static const char *const CL_CONV_SRC =
"#ifdef HAS_FP64\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#endif\n"
"typedef struct { long C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw; long xs[4]; long xoff, n0, nb, ks, js; } conv_t;\n"
/* range (C, nb * OH * OW): the KH * KW taps of channel ch for column j */
"__kernel void im2col(__global T *col, __global const T *x, conv_t c) {\n"
"  int ch = get_global_id(0), j = get_global_id(1), P = (int)(c.OH * c.OW), OW = (int)c.OW;\n"
"  int s = j / P, p = j - s * P, oh = p / OW, ow = p - oh * OW;\n"
"  int H = (int)c.H, W = (int)c.W, ih0 = oh * (int)c.sh - (int)c.ph, iw0 = ow * (int)c.sw - (int)c.pw;\n"
"  __global const T *xc = x + c.xoff + (c.n0 + s) * c.xs[0] + ch * c.xs[1];\n"
"  __global T *d = col + (long)ch * c.KH * c.KW * c.ks + (long)j * c.js;\n"
"  for (int ki = 0; ki < (int)c.KH; ki++) {\n"
"    int ih = ih0 + ki * (int)c.dh; int rok = ih >= 0 && ih < H;\n"
"    for (int kj = 0; kj < (int)c.KW; kj++, d += c.ks) {\n"
"      int iw = iw0 + kj * (int)c.dw;\n"
"      *d = rok && iw >= 0 && iw < W ? xc[ih * c.xs[2] + iw * c.xs[3]] : (T)0; } } }\n"
/* range (W, H, nb * C) */
"__kernel void col2im(__global T *x, __global const T *col, conv_t c) {\n"
"  int w = get_global_id(0), h = get_global_id(1), sc = get_global_id(2), C = (int)c.C, s = sc / C, ch = sc - s * C;\n"
"  int OH = (int)c.OH, OW = (int)c.OW, KW = (int)c.KW, sh = (int)c.sh, sw = (int)c.sw;\n"
"  long kbase = (long)ch * c.KH * KW, jbase = (long)s * OH * OW;\n"
"  T acc = (T)0;\n"
"  for (int ki = 0; ki < (int)c.KH; ki++) {\n"
"    int th = h + (int)c.ph - ki * (int)c.dh; if (th < 0) break;\n"
"    int oh = sh == 1 ? th : th / sh; if (oh * sh != th || oh >= OH) continue;\n"
"    for (int kj = 0; kj < KW; kj++) {\n"
"      int tw = w + (int)c.pw - kj * (int)c.dw; if (tw < 0) break;\n"
"      int ow = sw == 1 ? tw : tw / sw; if (ow * sw != tw || ow >= OW) continue;\n"
"      acc += col[(kbase + ki * KW + kj) * c.ks + (jbase + oh * OW + ow) * c.js]; } }\n"
"  x[c.xoff + (c.n0 + s) * c.xs[0] + ch * c.xs[1] + h * c.xs[2] + w * c.xs[3]] = acc; }\n"
/* dst(b, i, j) = src(b, i, j), both of any strides, one work-item per 16 x 16 tile (range (J/16, I/16, B)):
 * the transposing copies of a convolution (a (pixel, channel) matrix into NCHW and back) stay within a few
 * cache lines per work-item, where one element per work-item strides through memory on one side. */
"typedef struct { long I, J, soff, sb, si, sj, doff, db, di, dj; } tcopy_t;\n"
"__kernel void tile_copy(__global T *dst, __global const T *src, tcopy_t t) {\n"
"  long j0 = get_global_id(0) * 16, i0 = get_global_id(1) * 16, b = get_global_id(2);\n"
"  long ie = min(i0 + 16, t.I), je = min(j0 + 16, t.J);\n"
"  __global const T *sp = src + t.soff + b * t.sb; __global T *dp = dst + t.doff + b * t.db;\n"
"  for (long i = i0; i < ie; i++) for (long j = j0; j < je; j++) dp[i * t.di + j * t.dj] = sp[i * t.si + j * t.sj]; }\n"
/* C (M x N) (+)= A (M x K) @ B (N x K)^T, A and B with unit stride along K: the forward's GEMM against the
 * weight as it is stored, (O, C/G * KH * KW), so that it is never transposed. One work-item per 4 x 4 block
 * of C (range (N/4, M/4), work-groups of one, as the gemm kernel), K in TN-wide vectors, then a scalar tail. */
"typedef struct { long M, N, K, ao, ars, bo, brs, co, crs, accum; } gnt_t;\n"
"inline T hsum(VT v) { T t[TN]; VSTORE(v, 0, t); T s = (T)0; for (int i = 0; i < TN; i++) s += t[i]; return s; }\n"
"__kernel __attribute__((reqd_work_group_size(1, 1, 1)))\n"
"void gemm_nt(__global T *C, __global const T *A, __global const T *B, gnt_t g) {\n"
"  long j0 = get_global_id(0) * 4, i0 = get_global_id(1) * 4, K = g.K;\n"
"  int ni = (int)min(4L, g.M - i0), nj = (int)min(4L, g.N - j0);\n"
"  __global const T *a0 = A + g.ao + i0 * g.ars, *a1 = a0 + (ni > 1 ? g.ars : 0), *a2 = a0 + (ni > 2 ? 2 * g.ars : 0),\n"
"                   *a3 = a0 + (ni > 3 ? 3 * g.ars : 0);\n"
"  __global const T *b0 = B + g.bo + j0 * g.brs, *b1 = b0 + (nj > 1 ? g.brs : 0), *b2 = b0 + (nj > 2 ? 2 * g.brs : 0),\n"
"                   *b3 = b0 + (nj > 3 ? 3 * g.brs : 0);\n"
"  VT c00 = 0, c01 = 0, c02 = 0, c03 = 0, c10 = 0, c11 = 0, c12 = 0, c13 = 0;\n"
"  VT c20 = 0, c21 = 0, c22 = 0, c23 = 0, c30 = 0, c31 = 0, c32 = 0, c33 = 0;\n"
"  long k = 0;\n"
"  for (; k + TN <= K; k += TN) {\n"
"    VT x0 = VLOAD(0, a0 + k), x1 = VLOAD(0, a1 + k), x2 = VLOAD(0, a2 + k), x3 = VLOAD(0, a3 + k);\n"
"    VT y0 = VLOAD(0, b0 + k), y1 = VLOAD(0, b1 + k), y2 = VLOAD(0, b2 + k), y3 = VLOAD(0, b3 + k);\n"
"    c00 = fma(x0, y0, c00); c01 = fma(x0, y1, c01); c02 = fma(x0, y2, c02); c03 = fma(x0, y3, c03);\n"
"    c10 = fma(x1, y0, c10); c11 = fma(x1, y1, c11); c12 = fma(x1, y2, c12); c13 = fma(x1, y3, c13);\n"
"    c20 = fma(x2, y0, c20); c21 = fma(x2, y1, c21); c22 = fma(x2, y2, c22); c23 = fma(x2, y3, c23);\n"
"    c30 = fma(x3, y0, c30); c31 = fma(x3, y1, c31); c32 = fma(x3, y2, c32); c33 = fma(x3, y3, c33); }\n"
"  T r[4][4] = {{hsum(c00), hsum(c01), hsum(c02), hsum(c03)}, {hsum(c10), hsum(c11), hsum(c12), hsum(c13)},\n"
"               {hsum(c20), hsum(c21), hsum(c22), hsum(c23)}, {hsum(c30), hsum(c31), hsum(c32), hsum(c33)}};\n"
"  __global const T *ar[4] = {a0, a1, a2, a3}, *br[4] = {b0, b1, b2, b3};\n"
"  for (; k < K; k++) for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) r[i][j] = fma(ar[i][k], br[j][k], r[i][j]);\n"
"  for (int i = 0; i < ni; i++) for (int j = 0; j < nj; j++) {\n"
"    __global T *q = C + g.co + (i0 + i) * g.crs + j0 + j; *q = g.accum ? *q + r[i][j] : r[i][j]; } }\n";

#endif
