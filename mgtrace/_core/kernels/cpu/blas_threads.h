/* OpenBLAS on OpenMP's threads (blas_threads.c). */
#ifndef MT_BLAS_THREADS_H
#define MT_BLAS_THREADS_H

/* hands every threaded OpenBLAS call to OpenMP threads (once, at import of
 * mgtrace._core.nn) */
void mt_nn_blas_threads_init(void);
/* OpenBLAS single-threaded while OpenMP threads run their own GEMMs (the
 * first caller saves OpenBLAS's thread count, the last restores it) */
void mt_nn_blas_single_begin(void);
void mt_nn_blas_single_end(void);

#endif
