// matmul.cpp — linear layers through CBLAS.  Weights are [out, in] (PyTorch).
#include <cblas.h>

#include "ops/ops.h"

namespace attnres {

void matmul_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t I, int64_t O) {
  // out[N,O] = inp[N,I] · weight[O,I]ᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1.0f, inp, I, weight, I, 0.0f, out, O);
}

void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t I, int64_t O, bool accumulate_dinp) {
  // dinp[N,I] = dout[N,O] · weight[O,I]
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1.0f, dout, O, weight, I,
                accumulate_dinp ? 1.0f : 0.0f, dinp, I);
  // dweight[O,I] += dout[N,O]ᵀ · inp[N,I]
  if (dweight)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1.0f, dout, O, inp, I, 1.0f, dweight, I);
}

}  // namespace attnres
