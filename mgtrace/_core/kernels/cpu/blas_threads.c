/* The bridge between OpenBLAS's threads and OpenMP's, for every BLAS call
 * of the process (conv.c's GEMMs, attention.c's, matmul's in gemm.c): one
 * pool of threads, OpenMP's. Why: see conv.c's header comment
 * ("Threads"). blas_threads.h declares it. */
#include <pthread.h>
#include <stdlib.h>
#include <cblas.h>
#include "blas_threads.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* OpenBLAS's jobs on OpenMP threads. OpenBLAS calls this with all the jobs
 * of one threaded call (numjobs records jobdata_elsize bytes apart) and
 * expects them done on return. The jobs of a level-3 call wait on each
 * other, so they must all run at once: one OpenMP team of numjobs threads,
 * or, where OpenMP cannot promise that team (inside a parallel region,
 * dynamic teams, a thread limit), plain threads for all but the first. */
typedef struct {
    openblas_dojob_callback dojob;
    int index, data;
    void *job;
} blas_job;

static void *blas_job_run(void *arg) {
    blas_job *j = arg;
    j->dojob(j->index, j->job, j->data);
    return NULL;
}

static void blas_run_jobs(int sync, openblas_dojob_callback dojob, int numjobs, size_t jobdata_elsize,
                          void *jobdata, int dojob_data) {
    (void)sync;   /* OpenBLAS's exec_blas passes 1: return when all are done */
    if (numjobs <= 1) {
        if (numjobs == 1) dojob(0, jobdata, dojob_data);
        return;
    }
#ifdef _OPENMP
    if (!omp_in_parallel() && !omp_get_dynamic() && numjobs <= omp_get_thread_limit()) {
        #pragma omp parallel num_threads(numjobs)
        {
            const int i = omp_get_thread_num();
            dojob(i, (char *)jobdata + (size_t)i * jobdata_elsize, dojob_data);
        }
        return;
    }
#endif
    blas_job jobs[numjobs];
    pthread_t tids[numjobs];
    int started[numjobs];
    for (int i = 0; i < numjobs; i++) {
        jobs[i] = (blas_job){dojob, i, dojob_data, (char *)jobdata + (size_t)i * jobdata_elsize};
        started[i] = i > 0 && pthread_create(&tids[i], NULL, blas_job_run, &jobs[i]) == 0;
    }
    /* a job whose thread could not start runs here after job 0 (a level-3
     * job 0 that waits on it would hang: only when threads run out) */
    blas_job_run(&jobs[0]);
    for (int i = 1; i < numjobs; i++) {
        if (started[i]) pthread_join(tids[i], NULL);
        else blas_job_run(&jobs[i]);
    }
}

void mt_nn_blas_threads_init(void) {
    scipy_openblas_set_threads_callback_function(blas_run_jobs);
}

/* OpenBLAS runs single-threaded while any conv's OpenMP region calls it (each
 * OpenMP thread runs its own GEMMs); the first to enter saves the library's
 * thread count, the last to leave restores it. */
static int blas_users = 0, blas_saved = 1;

void mt_nn_blas_single_begin(void) {
    #pragma omp critical(mt_nn_blas_threads)
    {
        if (blas_users++ == 0) {
            blas_saved = scipy_openblas_get_num_threads();
            if (blas_saved != 1) scipy_openblas_set_num_threads(1);
        }
    }
}

void mt_nn_blas_single_end(void) {
    #pragma omp critical(mt_nn_blas_threads)
    {
        if (--blas_users == 0 && blas_saved != 1) scipy_openblas_set_num_threads(blas_saved);
    }
}
