// StepChannel: how the ranks of a tensor-parallel model run the same forwards (private to src/inference/).
//
// Note [Tensor-parallel steps]
// Rank 0 alone schedules and samples: its scheduler and state manager choose every forward, and the other ranks
// (followers) run that forward on their shards with no request state of their own. Each forward's inputs go out from
// rank 0 as they are uploaded: a header (forward, idle or stop; the layout; the decode graph's bucket, if one
// replays it) and the packed index inputs, broadcast over the model's group, the second straight into the
// followers' device buffer. Rank 0 samples from the logits every rank gathered, so tokens exist in one place.
// Why not every rank running the same scheduler on the same requests: a server's requests reach rank 0 alone, so
// the followers would need every arrival, cancellation and seed anyway, and any drift between ranks (an unseeded
// draw, a sampling kernel's nondeterminism) would become a hang or wrong text rather than an error; with one
// decision-maker there is nothing to drift, and a follower's loop is receive, forward, repeat.
// A follower waits for the next header in a broadcast, which times out with the group (DEEPSPEED_TIMEOUT): a leader
// that sent nothing for a quarter of the timeout (an idle server) sends an idle header, so an idle follower never
// times out while a dead leader is still noticed. A step holds the channel from its header until the forward is
// enqueued, so an idle header never lands among a forward's collectives.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "dscpp/core/tensor.h"

namespace dscpp {
class ProcessGroup;
}

namespace dscpp::inference {

struct StepHeader {
  enum Kind : int32_t { forward = 0, idle = 1, stop = 2 };
  int32_t kind = forward;
  int32_t N = 0, S = 0, width = 0;  // the forward's InputLayout
  int32_t bucket = 0;               // the decode graph replayed (its batch size), 0: eager
  int32_t n_inputs = 0;             // the packed inputs' elements (InputLayout::total)
};

class StepChannel {
 public:
  // Every rank of `group`; rank 0 leads. Buffers on `device` (the model's).
  StepChannel(ProcessGroup& group, Device device);
  ~StepChannel();  // the leader's idle headers stop
  StepChannel(const StepChannel&) = delete;
  StepChannel& operator=(const StepChannel&) = delete;
  bool leader() const;

  // Leader: sends h and inputs[0, h.n_inputs) (the packed i32 inputs, uploaded on the current stream). Hold the
  // returned lock until the forward is enqueued.
  std::unique_lock<std::mutex> send(const StepHeader& h, const Tensor& inputs);
  void send_stop();
  // Follower: waits for the next forward or stop; a forward's inputs arrive in inputs[0, h.n_inputs).
  StepHeader receive(const Tensor& inputs);

 private:
  void send_header(const Tensor& header);  // mu_ held
  void keep_alive();                       // the leader's idle headers

  ProcessGroup& group_;
  Device device_;
  Tensor header_host_, header_dev_;  // i32[6]: the step's header (the same tensor on the CPU)
  Tensor idle_;                      // an idle header, on the device
  std::mutex mu_;
  std::condition_variable cv_;
  std::chrono::steady_clock::time_point last_send_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

}  // namespace dscpp::inference
