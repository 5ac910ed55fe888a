// SMs kept free of GEMMs while communication may run beside them (Note [GEMM SM carve-out]).
//
//   set_gemm_sm_carveout(k)   CUDA GEMMs target (SM count - k) SMs from now on; 0 (default): all of them
//   ScopedGemmSmCarveout      sets it for a scope, restores the previous value after
//   comm_sm_carveout_from_env DSCPP_COMM_SM_CARVEOUT (default 0): what the engine reserves for NCCL in the windows
//                             where collectives overlap compute; the NCCL backend also caps its CTAs at k
//
// CPU GEMMs ignore it.
#pragma once

namespace dscpp {

int gemm_sm_carveout();
void set_gemm_sm_carveout(int sms);  // sms >= 0
int comm_sm_carveout_from_env();     // throws naming the variable when it is not a count in [0, 128]

class ScopedGemmSmCarveout {
 public:
  explicit ScopedGemmSmCarveout(int sms) : prev_(gemm_sm_carveout()) { set_gemm_sm_carveout(sms); }
  ~ScopedGemmSmCarveout() { set_gemm_sm_carveout(prev_); }
  ScopedGemmSmCarveout(const ScopedGemmSmCarveout&) = delete;
  ScopedGemmSmCarveout& operator=(const ScopedGemmSmCarveout&) = delete;

 private:
  int prev_;
};

}  // namespace dscpp
