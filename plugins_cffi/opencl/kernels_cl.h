/* kernels_cl.h — the OpenCL C sources of the torch_fl OpenCL plugin, as C string
 * literals. Each program is built at first use per device, once per compute type
 * (build options -DT=float ... pick the type). */
#ifndef FL_OPENCL_KERNELS_CL_H
#define FL_OPENCL_KERNELS_CL_H

/* shared prelude: strided walks and the parameter block (layouts match opencl.c) */
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
"__kernel void r_bernoulli(__global T *out, walk_t w, ulong seed, ulong start, REAL pr) {\n"
"  HEAD out[o[0]] = (T)(runi(seed, start + (ulong)g) < pr ? 1 : 0); }\n"
"#ifdef IS_FLOAT\n"
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
"#define RAW(U, n) __kernel void cp_##n(__global U *out, __global const U *x, walk_t w) { HEAD out[o[0]] = x[o[1]]; }\\\n"
"  __kernel void fl_##n(__global U *out, walk_t w, U v) { HEAD out[o[0]] = v; }\n"
"RAW(uchar, 1) RAW(ushort, 2) RAW(uint, 4) RAW(ulong, 8)\n";

/* reductions, built per T with ACC (accumulator) */
static const char *const CL_RED_SRC = FL_CL_PRELUDE
"typedef struct { long osize[8]; long ost_o[8]; long ost_i[8]; long rsize[8]; long rst[8];\n"
"  long ooff, ioff, ondim, rndim, nout, nred, chunk, nchunk; } red_t;\n"
"#ifdef IS_FLOAT\n#define MAXOP(m, v) m = (isnan(v) || v > m || isnan(m)) ? (isnan(m) ? m : v) : m\n"
"#else\n#define MAXOP(m, v) m = v > m ? v : m\n#endif\n"
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
"  T acc = part[oi]; for (long c = 1; c < r.nchunk; c++) { T v = part[c * r.nout + oi]; MAXOP(acc, v); } out[oo] = acc; }\n";

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

#endif
