/* Int8 (quantized) inference kernels on any device: the backend table
 * (backend.h's ``quant``). The CPU's are kernels/cpu/qgemm.c, qconv.c,
 * qpool.c, qelemwise.c and qblock.c (their table: cpu/qtable.c, installed by
 * mgtrace._core.qint8 at import); a device without int8 kernels (CUDA
 * today) leaves ``quant`` NULL, and every quantized op on it raises
 * "no kernel for op X on device D" (qint8.pyx).
 *
 * The arithmetic of every entry is mgtrace.quantization's, bitwise: int32
 * accumulation of (a - a_zp) * w, then the epilogue
 *   y = clamp(rint(acc * mult[n]) + out_zp, lo, hi)   (double, half to even)
 * with ReLU folded into lo; out_u8 names the output storage: 0 int8, 1
 * uint8, 2 float32 (acc * mult[n] unrounded, then 0 at least where lo is
 * 0 and hi at most where hi > 0: ReLU, ReLU6). Activations are uint8 (a
 * signed one is passed with its bytes xor 0x80 and a_zp + 128: the same
 * integers), weights int8. Storage kinds ("kind", "ak", "ok"): 0 int8,
 * 1 uint8, 2 int32. ``path`` picks an instruction set where a device has
 * several (0: the best here; the CPU's numbering is in qint8.pyx); every
 * path gives the same bits. Pointers are device pointers except where a
 * comment says "host"; buffers are C-contiguous.
 *
 * Members go at the END of the struct (a device's table is initialised by
 * position).
 */
#ifndef MT_QUANT_KERNELS_H
#define MT_QUANT_KERNELS_H
#include "mt_types.h"

/* one conv of an int8 block (block_u8s8): its weights (a dense 1x1's
 * wrows [Co + 31, lw] and wsum [Co], as conv_u8s8 takes them; a
 * depthwise conv's taps [Co, KH * KW], lw and wsum unused), bias (or
 * NULL), multipliers and epilogue */
typedef struct {
    const int8_t *w;
    int64_t lw;
    const int32_t *wsum;
    const int32_t *bias;
    const double *mult;
    int64_t Co;
    int32_t out_zp, lo, hi;
    int out_u8, path;
} mt_qblock_conv;

/* a quantized add after an int8 block (block_u8s8), add_u8's arguments:
 * the block's output is its first operand (y_first) or its second, other
 * the other operand; all three int8 or uint8 (kinds 0, 1) */
typedef struct {
    const void *other;
    void *out;
    int y_first, y_kind, other_kind, out_kind, relu, path;
    float y_scale, y_zp, other_scale, other_zp, out_scale, out_zp, lo, hi;
} mt_qblock_add;

typedef struct mt_quant_kernels {
    /* feature queries: 1 where the GEMM runs on u8 x s8 dot products
     * (AVX-512 VNNI), 1 where dense convs run on tiles (AMX-INT8) */
    int (*has_vnni)(void);
    int (*has_amx)(void);
    /* at most n threads for the calls that follow (this thread's calls) */
    void (*set_threads)(int n);
    /* out[i] = clamp(rint(x[i] / scale) + zp, lo, hi) in float32 (NaN: lo) */
    void (*quantize_f32)(const float *x, int64_t n, float scale, float zp, float lo, float hi,
                         int kind, void *out, int path);
    /* out[i] = (q[i] - zp) * scale in float32 */
    void (*dequantize_f32)(const void *q, int kind, int64_t n, float scale, float zp,
                           float *out);
    /* the GEMM's weight [N, K] packed: its size in bytes, and the packing
     * (wsum[n] = the sum of row n, host) */
    int64_t (*gemm_packed_size)(int64_t N, int64_t K);
    void (*gemm_pack_s8)(int64_t N, int64_t K, const int8_t *w, int8_t *packed, int32_t *wsum);
    /* out[m * ldo_m + n * ldo_n] = epilogue(sum_k (a[m, k] - a_zp) * w[n, k] + bias[n]);
     * bias may be NULL; returns the path used */
    int (*gemm_u8s8)(int64_t M, int64_t N, int64_t K, const uint8_t *a, int64_t lda,
                     int32_t a_zp, const int8_t *packed, const int32_t *wsum,
                     const int32_t *bias, const double *mult, int32_t out_zp, int32_t lo,
                     int32_t hi, int out_u8, void *out, int64_t ldo_m, int64_t ldo_n, int path);
    /* uint8 [C, H, W] -> [OH * OW, C * KH * KW], ``pad`` outside the input */
    void (*im2col_u8)(const uint8_t *x, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                      int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,
                      int64_t OH, int64_t OW, uint8_t pad, uint8_t *cols);
    /* dense or grouped conv2d, NCHW: wrows int8 [Co + 31, lw] (each filter
     * flattened, zero-padded to lw = ceil(K / 64) * 64), wsum [Co]; returns
     * the path used, 0 when out of memory */
    int (*conv_u8s8)(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                     int32_t a_zp, const int8_t *wrows, int64_t lw, const int32_t *wsum,
                     int64_t Co, int64_t G, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                     int64_t PH, int64_t PW, int64_t DH, int64_t DW, int64_t OH, int64_t OW,
                     const int32_t *bias, const double *mult, int32_t out_zp, int32_t lo,
                     int32_t hi, int out_u8, void *out, int path);
    /* depthwise conv2d, w int8 [C, KH * KW]: the general kernel, and the
     * vector ones, which return 0 where they do not apply (then the
     * general one runs) or the kernel used */
    void (*dwconv_u8s8)(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                        int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW, int64_t SH,
                        int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,
                        int64_t OH, int64_t OW, const int32_t *bias, const double *mult,
                        int32_t out_zp, int32_t lo, int32_t hi, int out_u8, void *out);
    int (*dwconv_vec_u8s8)(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                           int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW, int64_t SH,
                           int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,
                           int64_t OH, int64_t OW, const int32_t *bias, const double *mult,
                           int32_t out_zp, int32_t lo, int32_t hi, int out_u8, void *out,
                           int path);
    /* out = quantize((a - az) * as + (b - bz) * bs [then ReLU], os, oz), every
     * step in float32; returns the path used */
    int (*add_u8)(const void *a, int ak, float as, float az, const void *b, int bk, float bs,
                  float bz, int64_t n, float os, float oz, float lo, float hi, int relu,
                  void *out, int ok, int path);
    /* max pool of uint8 planes; 0 when out of memory */
    int (*maxpool2d_u8)(const uint8_t *x, int64_t planes, int64_t H, int64_t W, int64_t KH,
                        int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
                        int64_t DH, int64_t DW, int64_t OH, int64_t OW, uint8_t *out);
    /* average pool of int8 (is_s8) / uint8 planes over the windows [ys, ye)
     * x [xs, xe) divided by dy * dx (the six arrays: host); 0 when out of memory */
    int (*avgpool2d)(const void *x, int is_s8, int64_t planes, int64_t H, int64_t W,
                     int64_t OH, int64_t OW, const int64_t *ys, const int64_t *ye,
                     const int64_t *dy, const int64_t *xs, const int64_t *xe,
                     const int64_t *dx, int32_t zp, int32_t lo, int32_t hi, void *out);
    /* concatenation of n_in [outer, inner[j]] inputs, each requantized to
     * (os, oz); xs, kinds, scales, zps, inner: host arrays of n_in; tables:
     * 257 * n_in bytes of scratch */
    void (*concat_u8)(int n_in, const void *const *xs, const int *kinds, const float *scales,
                      const float *zps, const int64_t *inner, int64_t outer, float os,
                      float oz, float lo, float hi, int ok, uint8_t *tables, void *out);
    /* out[i] = x[i] ^ 0x80: int8 integers as the uint8 bytes the kernels
     * take (with the zero point + 128) */
    void (*flip_s8)(const int8_t *x, int64_t n, uint8_t *out);
    /* an inverted residual block (MobileNetV2's) in one call: x [NB, C, H,
     * W] -> 1x1 conv ``expand`` (uint8 out) -> mid1 [NB, E, H, W] ->
     * depthwise conv ``dw`` (uint8 out; geom: KH KW SH SW PH PW DH DW OH
     * OW) -> mid2 [NB, E, OH, OW] -> 1x1 conv ``project`` -> out [NB, Co,
     * OH, OW] (``expand`` NULL: none, the depthwise conv reads x and
     * mid1 is unused), then, where ``add`` is not NULL, add_u8 of out and
     * add->other into add->out (out is then scratch: the projection may
     * reach the add without it); each op's bits are those of its own
     * call; 0 when out of memory */
    int (*block_u8s8)(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                      int32_t a_zp, const mt_qblock_conv *expand, const mt_qblock_conv *dw,
                      const int64_t *geom, const mt_qblock_conv *project, uint8_t *mid1,
                      uint8_t *mid2, void *out, const mt_qblock_add *add);
} mt_quant_kernels;

#endif
