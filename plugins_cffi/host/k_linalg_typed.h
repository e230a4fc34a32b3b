/* Instantiates the typed section of the including file once per element type:
 * #define LIN_SELF "k_conv.c" (the file itself), then include this. The
 * typed section sees LIN_T (the C type), LIN_S (a name suffix: f32, f64) and
 * LIN_DT (the fl_dtype_t). Not a header guard on purpose: each file includes it once. */
#define LIN_T float
#define LIN_S f32
#define LIN_DT FL_FLOAT32
#include LIN_SELF
#undef LIN_T
#undef LIN_S
#undef LIN_DT
#define LIN_T double
#define LIN_S f64
#define LIN_DT FL_FLOAT64
#include LIN_SELF
#undef LIN_T
#undef LIN_S
#undef LIN_DT
