// Pipeline schedules: for one stage of a pipeline, the ordered instructions of one train_batch or eval_batch.
// Private to the runtime (and its tests).
//
// Note [Pipeline schedules]: a pipeline of p ranks runs m micro-batches through V = p * v virtual stages (v chunks of
// layers per rank, chunk c of rank r being virtual stage c * p + r; v = 1 without interleaving). Each rank's
// *compute order* is its sequence of forward(mb, chunk) and backward(mb, chunk):
//   1F1B (PipeDream-Flush, DeepSpeed's TrainSchedule): min(p - r - 1, m) warm-up forwards, then one forward and one
//     backward in turn, then the remaining backwards; at most p - r activation sets are held at once.
//   interleaved 1F1B (Megatron, v > 1, m % p == 0): micro-batches go through the chunks in groups of p (forwards:
//     chunk 0 for micro-batches 0..p-1, chunk 1 for the same, ..., then the next group; backwards likewise from the
//     last chunk down), with (p - r - 1) * 2 + (v - 1) * p warm-up forwards. The bubble shrinks v times, to
//     (p - 1) / (v m + p - 1) of the batch.
//   eval: forwards only, in micro-batch order.
// The messages between ranks follow from the compute orders: build_schedule simulates all ranks in unit time slots
// (every forward and backward one slot, each rank starting its next compute as soon as its input exists) and
// appends each send and its matching recv to the two ranks' lists at the same moment of the simulation. Every list
// is then a projection of one global order in which each send/recv pair is a single event, so running the lists with
// blocking (rendezvous) point-to-point ops, as NCCL's send/recv on one stream are, cannot deadlock; and a rank that
// finishes a forward early sends it only when the simulation says its peer is ready, so it goes on computing
// meanwhile. A recv is always followed at once by the compute that consumes it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dscpp {

enum class PipeOp {
  load_micro_batch,   // the first virtual stage (tokens) and the last (targets) read micro-batch mb
  forward,            // chunk's forward of mb
  backward,           // chunk's backward of mb
  send_activation,    // the output of forward(mb, chunk) to the next virtual stage's rank
  recv_activation,    // the input of forward(mb, chunk) from the previous virtual stage's rank
  send_grad,          // d(input) of backward(mb, chunk) to the previous virtual stage's rank
  recv_grad,          // d(output) of backward(mb, chunk) from the next virtual stage's rank
  reduce_tied_grads,  // sum the tied embedding's gradients across the first and last stage
  optimizer_step,
};
const char* pipe_op_name(PipeOp op);

struct PipeInstr {
  PipeOp op;
  int mb = -1;     // micro-batch, -1 for reduce_tied_grads / optimizer_step
  int chunk = 0;   // local chunk on this rank (0..v-1)
  int peer = -1;   // send / recv: the other rank (pipe-group rank)
  bool operator==(const PipeInstr&) const = default;
};
std::string to_string(const PipeInstr& i);

struct PipeShape {
  int stages = 1;          // p: ranks of the pipe group
  int micro_batches = 1;   // m: gradient_accumulation_steps
  int virtual_stages = 1;  // v: chunks per rank (1 = plain 1F1B)
  void validate() const;   // throws naming the rule (m % p == 0 when v > 1)
};

// One compute of a rank's compute order.
struct PipeCompute {
  bool forward;
  int mb, chunk;
};
// The compute order of rank `stage` (Note [Pipeline schedules]); eval: forwards only.
std::vector<PipeCompute> compute_order(const PipeShape& s, int stage, bool train);

// Every rank's instruction list of one train_batch (train) or eval_batch, index = pipe rank.
std::vector<std::vector<PipeInstr>> build_schedule(const PipeShape& s, bool train);

}  // namespace dscpp
