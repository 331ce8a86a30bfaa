/* The CPU's int8 kernel table (contract/quant_kernels.h): qgemm.c, qconv.c,
 * qpool.c, qelemwise.c and qblock.c as mt_backend's ``quant`` member, which
 * mgtrace._core.qint8 installs on mt_cpu_backend at import (the table
 * lives in that extension, beside its kernels). The kernels' definitions
 * stay in their files; their prototypes are declared here, once, in the
 * table's member types. */
#include "backend.h"
#include "quant_kernels.h"
#include "qteam.h"

int mt_qgemm_has_vnni(void);
int mt_qconv_has_amx(void);
void mt_quantize_f32(const float *x, int64_t n, float scale, float zp, float lo, float hi,
                     int kind, void *out, int path);
void mt_dequantize_f32(const void *q, int kind, int64_t n, float scale, float zp, float *out);
int64_t mt_qgemm_packed_size(int64_t N, int64_t K);
void mt_qgemm_pack_s8(int64_t N, int64_t K, const int8_t *w, int8_t *packed, int32_t *wsum);
int mt_qgemm_u8s8(int64_t M, int64_t N, int64_t K, const uint8_t *a, int64_t lda, int32_t a_zp,
                  const int8_t *packed, const int32_t *wsum, const int32_t *bias,
                  const double *mult, int32_t out_zp, int32_t lo, int32_t hi, int out_u8,
                  void *out, int64_t ldo_m, int64_t ldo_n, int path);
void mt_qim2col_u8(const uint8_t *x, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                   int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,
                   int64_t OH, int64_t OW, uint8_t pad, uint8_t *cols);
int mt_qconv_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W, int32_t a_zp,
                  const int8_t *wrows, int64_t lw, const int32_t *wsum, int64_t Co, int64_t G,
                  int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
                  int64_t DH, int64_t DW, int64_t OH, int64_t OW, const int32_t *bias,
                  const double *mult, int32_t out_zp, int32_t lo, int32_t hi, int out_u8,
                  void *out, int path);
void mt_qdwconv_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                     int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW, int64_t SH,
                     int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW, int64_t OH,
                     int64_t OW, const int32_t *bias, const double *mult, int32_t out_zp,
                     int32_t lo, int32_t hi, int out_u8, void *out);
int mt_qdwconv_vec_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                        int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW, int64_t SH,
                        int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW, int64_t OH,
                        int64_t OW, const int32_t *bias, const double *mult, int32_t out_zp,
                        int32_t lo, int32_t hi, int out_u8, void *out, int path);
int mt_qadd_u8(const void *a, int ak, float as, float az, const void *b, int bk, float bs,
               float bz, int64_t n, float os, float oz, float lo, float hi, int relu, void *out,
               int ok, int path);
int mt_qmaxpool2d_u8(const uint8_t *x, int64_t planes, int64_t H, int64_t W, int64_t KH,
                     int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH,
                     int64_t DW, int64_t OH, int64_t OW, uint8_t *out);
int mt_qavgpool2d(const void *x, int is_s8, int64_t planes, int64_t H, int64_t W, int64_t OH,
                  int64_t OW, const int64_t *ys, const int64_t *ye, const int64_t *dy,
                  const int64_t *xs, const int64_t *xe, const int64_t *dx, int32_t zp,
                  int32_t lo, int32_t hi, void *out);
void mt_qconcat_u8(int n_in, const void *const *xs, const int *kinds, const float *scales,
                   const float *zps, const int64_t *inner, int64_t outer, float os, float oz,
                   float lo, float hi, int ok, uint8_t *tables, void *out);

int mt_qblock_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W, int32_t a_zp,
                   const mt_qblock_conv *expand, const mt_qblock_conv *dw, const int64_t *geom,
                   const mt_qblock_conv *project, uint8_t *mid1, uint8_t *mid2, void *out,
                   const mt_qblock_add *add);

/* a signed activation's bytes for the u8 x s8 kernels: q + 128 as uint8 */
static void q_flip_s8(const int8_t *x, int64_t n, uint8_t *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = (uint8_t)((uint8_t)x[i] ^ 0x80u);
}

const mt_quant_kernels mt_cpu_quant_kernels = {
    mt_qgemm_has_vnni, mt_qconv_has_amx, mt_q_set_threads,
    mt_quantize_f32, mt_dequantize_f32,
    mt_qgemm_packed_size, mt_qgemm_pack_s8, mt_qgemm_u8s8, mt_qim2col_u8,
    mt_qconv_u8s8, mt_qdwconv_u8s8, mt_qdwconv_vec_u8s8,
    mt_qadd_u8, mt_qmaxpool2d_u8, mt_qavgpool2d, mt_qconcat_u8, q_flip_s8, mt_qblock_u8s8,
};
