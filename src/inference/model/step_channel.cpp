// StepChannel (Note [Tensor-parallel steps]): the leader's headers and inputs broadcast to the followers.
#include "inference/model/step_channel.h"

#include "dscpp/comm/process_group.h"
#include "dscpp/core/check.h"
#include "dscpp/core/cuda.h"

namespace dscpp::inference {
namespace {

constexpr int64_t kFields = 6;  // StepHeader's

Tensor host_i32(int64_t n, Device device) {
  return device.is_cuda() ? empty_pinned({n}, DType::i32) : Tensor::empty({n}, DType::i32);
}

// A broadcast from rank 0 whose result the host reads (on a GPU, copied into host_copy). A follower may wait
// minutes for an idle server's next step, so past a decode step's time it polls with sleeps rather than holding a
// core; a failed op (a dead peer: the NCCL watchdog marks it, Gloo reports it) throws from wait() with the reason.
void broadcast_from_leader(ProcessGroup& g, Tensor& t, const Tensor& host_copy) {
  WorkPtr w = g.broadcast(t, 0);
  const auto t0 = std::chrono::steady_clock::now();
  while (!w->is_completed()) {
    if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  w->wait();
  if (t.device().is_cuda()) {
    copy_async(host_copy, t);
    cuda_stream_synchronize(t.device().index);
  }
}

}  // namespace

StepChannel::StepChannel(ProcessGroup& group, Device device)
    : group_(group), device_(device), header_host_(host_i32(kFields, device)),
      last_send_(std::chrono::steady_clock::now()) {
  header_dev_ = device.is_cuda() ? Tensor::empty({kFields}, DType::i32, device) : header_host_;
  if (!leader()) return;
  Tensor idle = host_i32(kFields, device);
  idle.zero();
  idle.data<int32_t>()[0] = StepHeader::idle;
  idle_ = device.is_cuda() ? idle.to(device) : idle;
  heartbeat_ = std::thread([this] { keep_alive(); });
}

StepChannel::~StepChannel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

bool StepChannel::leader() const { return group_.rank() == 0; }

void StepChannel::send_header(const Tensor& header) {
  Tensor h = header;
  group_.broadcast(h, 0)->wait();
  last_send_ = std::chrono::steady_clock::now();
}

std::unique_lock<std::mutex> StepChannel::send(const StepHeader& h, const Tensor& inputs) {
  std::unique_lock<std::mutex> lock(mu_);
  DSCPP_CHECK(leader() && !stopping_, "StepChannel::send on rank ", group_.rank(), " (rank 0 sends, until stop)");
  int32_t* p = header_host_.data<int32_t>();
  p[0] = h.kind, p[1] = h.N, p[2] = h.S, p[3] = h.width, p[4] = h.bucket, p[5] = h.n_inputs;
  // The previous step's copy has run: its logits were read since (model_runner.h).
  if (device_.is_cuda()) copy_async(header_dev_, header_host_);
  send_header(header_dev_);
  if (h.n_inputs > 0) {
    Tensor in = inputs.slice(0, h.n_inputs);
    group_.broadcast(in, 0)->wait();
  }
  return lock;
}

void StepChannel::send_stop() {
  StepHeader h;
  h.kind = StepHeader::stop;
  std::unique_lock<std::mutex> lock = send(h, Tensor());
  stopping_ = true;  // no idle header after the stop: the followers have gone
  cv_.notify_all();
}

StepHeader StepChannel::receive(const Tensor& inputs) {
  DSCPP_CHECK(!leader(), "StepChannel::receive on rank 0 (which sends)");
  for (;;) {
    broadcast_from_leader(group_, header_dev_, header_host_);
    const int32_t* p = header_host_.data<int32_t>();
    StepHeader h{p[0], p[1], p[2], p[3], p[4], p[5]};
    DSCPP_CHECK(h.kind >= StepHeader::forward && h.kind <= StepHeader::stop && h.n_inputs >= 0 &&
                    h.n_inputs <= inputs.numel(),
                "tensor-parallel step from rank 0: a header of kind ", h.kind, " with ", h.n_inputs,
                " inputs (this rank holds ", inputs.numel(), "); the ranks run different programs");
    if (h.kind == StepHeader::idle) continue;
    if (h.kind == StepHeader::forward && h.n_inputs > 0) {
      Tensor in = inputs.slice(0, h.n_inputs);
      group_.broadcast(in, 0)->wait();
    }
    return h;
  }
}

void StepChannel::keep_alive() {
  if (device_.is_cuda()) cuda_set_device(device_.index);
  const auto every = group_.timeout() / 4;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_until(lock, last_send_ + every);
    if (stopping_ || std::chrono::steady_clock::now() < last_send_ + every) continue;
    try {
      send_header(idle_);
    } catch (const std::exception&) {
      return;  // the group is broken: the engine's next step reports it
    }
  }
}

}  // namespace dscpp::inference
