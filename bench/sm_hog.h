// launch_sm_hog: occupy `blocks` whole SMs for about `us` microseconds on `stream` (bench/sm_hog.cu).
#pragma once
#include <cuda_runtime_api.h>

namespace bench {
void launch_sm_hog(int blocks, double us, cudaStream_t stream);
}
