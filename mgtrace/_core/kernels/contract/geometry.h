/* The output size of a sliding window, the one rule every convolution and
 * pooling path uses (nn.pyx's conv2d, conv2d_nchwc and pooling checks, and
 * through mgtrace._core.nn.window_output_size the Python helpers of
 * functional/ and the passes). Device-neutral and header-only. */
#ifndef MT_GEOMETRY_H
#define MT_GEOMETRY_H
#include <stdint.h>

/* Along one axis of `size` inputs, a window of k taps dil apart, moved by
 * `stride`, over the input padded by `pad` on each side:
 *     (size + 2 pad - dil (k - 1) - 1) / stride + 1
 * rounded down, or with ceil_mode up (a last, partial window counts) as
 * long as the last window starts inside the input or the left padding
 * (PyTorch's pooling_output_shape, MegEngine's pooling). -1 when there is
 * no output: the dilated window is larger than the padded input (in
 * ceil_mode: by more than stride - 1). k, stride, dil >= 1 and size,
 * pad >= 0; computed in 128 bits, so no product wraps; an answer past
 * INT64_MAX is INT64_MAX (no caller can allocate it). */
static inline int64_t mt_window_out(int64_t size, int64_t k, int64_t stride, int64_t pad, int64_t dil,
                                    int ceil_mode) {
    const __int128 padded = (__int128)size + 2 * (__int128)pad, span = (__int128)dil * (k - 1) + 1;
    const __int128 num = padded - span + (ceil_mode ? stride - 1 : 0);
    if (num < 0) return -1;
    __int128 out = num / stride + 1;
    if (ceil_mode && (out - 1) * stride >= (__int128)size + pad) out -= 1;
    if (out < 1) return -1;
    return out > INT64_MAX ? INT64_MAX : (int64_t)out;
}

#endif
