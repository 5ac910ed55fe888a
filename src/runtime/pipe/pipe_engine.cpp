// The pipeline engine (Note [Pipeline engine], runtime/pipe_engine.h): runs a schedule's instructions
// (Note [Pipeline schedules], schedule.h) over the stage's Engine.
#include "dscpp/runtime/pipe_engine.h"

#include <algorithm>
#include <map>

#include "dscpp/kernels/ops.h"
#include "runtime/pipe/partition.h"
#include "runtime/pipe/schedule.h"

namespace dscpp {

StageLayers pipe_stage_layers(const ModelConfig& cfg, const std::string& method, int stages, int virtual_stages,
                              int stage) {
  const auto parts = partition_layers(method, pipe_item_params(cfg), int64_t(stages) * virtual_stages);
  return StageLayers::of_rank(parts, stage, stages, virtual_stages);
}

void check_pipeline_config(const DeepSpeedConfig& c, int stages, int virtual_stages) {
  const int64_t gas = c.gradient_accumulation_steps;
  if (virtual_stages > 1 && gas % stages != 0)
    throw ConfigError("gradient_accumulation_steps", "gradient_accumulation_steps = " + std::to_string(gas) +
                      " with dscpp.pipeline.virtual_stages " + std::to_string(virtual_stages) + ": interleaving "
                      "needs the micro-batches to be a multiple of the " + std::to_string(stages) +
                      " pipeline stages");
}

std::unique_ptr<PipelineEngine> initialize_pipeline(std::unique_ptr<Model> model, const DeepSpeedConfig& config,
                                                    EngineOptions options, PipeOptions pipe) {
  if (!options.model_parallel_group) options.model_parallel_group = pipe.pipe_group;
  auto engine = initialize(std::move(model), config, options);
  // DeepSpeed's PipelineModule(activation_checkpoint_interval=1): every layer recomputes in backward (whatever
  // activation_checkpointing.number_checkpoints chose; the parser refuses longer runs of layers).
  if (config.pipeline.activation_checkpoint_interval == 1) {
    Model& m = engine->model();
    m.set_checkpoint_policy(CheckpointPolicy(size_t(m.config().n_layer), true));
  }
  return std::make_unique<PipelineEngine>(std::move(engine), pipe);
}

PipelineEngine::PipelineEngine(std::unique_ptr<Engine> engine, PipeOptions o)
    : engine_(std::move(engine)), pipe_(o.pipe_group), virtual_stages_(o.virtual_stages) {
  DSCPP_CHECK(engine_ && pipe_, "PipelineEngine: needs an engine and the pipe group");
  stage_ = pipe_->rank();
  stages_ = pipe_->size();
  Model& m = engine_->model();
  DSCPP_CHECK(dynamic_cast<PipelineStage*>(&m), "PipelineEngine: the engine's model is not a pipeline stage "
              "(build it with make_pipeline_stage)");
  const int chunks = int(stage().layers().chunks.size());
  DSCPP_CHECK(chunks == virtual_stages_, "PipelineEngine: the stage holds ", chunks, " chunks of layers but "
              "dscpp.pipeline.virtual_stages is ", virtual_stages_);
  check_pipeline_config(engine_->config(), stages_, virtual_stages_);
  PipeShape{stages_, int(engine_->config().gradient_accumulation_steps), virtual_stages_}.validate();
  const bool tied = m.config().tie_embeddings && stages_ > 1;
  if (tied) tied_ = pipe_->new_subgroup({0, stages_ - 1});  // every pipe rank takes part; the two get the group
  // The tied group's members must be the two copies, whatever the partition.
  DSCPP_CHECK(!tied || (stage_ != 0 && stage_ != stages_ - 1) || stage().tied_table_id() >= 0,
              "PipelineEngine: stage ", stage_, " has no copy of the tied token table");
}

PipelineEngine::~PipelineEngine() = default;

PipelineStage& PipelineEngine::stage() { return dynamic_cast<PipelineStage&>(engine_->model()); }

Loss PipelineEngine::forward(const Tensor&, const Tensor&) {
  DSCPP_FAIL("PipelineEngine: forward() is not available under pipeline parallelism: only train_batch() and "
             "eval_batch() run micro-batches (DeepSpeed's PipelineError)");
}
void PipelineEngine::backward() {
  DSCPP_FAIL("PipelineEngine: backward() is not available under pipeline parallelism: only train_batch() runs it");
}
void PipelineEngine::step() {
  DSCPP_FAIL("PipelineEngine: step() is not available under pipeline parallelism: train_batch() steps the optimizer");
}

// Note [Tied gradients under ZeRO]: the two copies of a tied table sum their gradients, each already averaged over
// the data-parallel ranks. Under ZeRO >= 1 over several ranks each data-parallel rank holds only its chunks of a
// copy's gradient, and the chunks fall elsewhere in the table on the two stages (the first stage's unit holds
// GPT-2's positions too). So the table's gradient is put together over the data-parallel group first (each element
// from the one rank that owns it), summed with the other copy's, and each rank takes its chunks back: one table of
// f32 in flight, as the unpartitioned sum.
void PipelineEngine::sum_tied_grads() {
  const ParamInfo& p = engine_->model().params().info(stage().tied_table_id());
  ProcessGroup* dp = engine_->dp_group();
  if (!dp || engine_->zero_stage() == 0) {  // the whole averaged gradient is here
    Tensor g = engine_->model().params().grad(stage().tied_table_id());
    tied_->all_reduce(g, ReduceOp::sum)->wait();
    return;
  }
  Tensor table = Tensor::zeros({p.numel}, DType::f32, engine_->model().params().device());
  const std::vector<FlatRange>& owned = engine_->owned_ranges();
  auto each_owned_piece = [&](const auto& fn) {  // fn(this rank's gradient piece, the same elements of table)
    for (size_t k = 0; k < owned.size(); k++) {
      const int64_t lo = std::max(owned[k].begin, p.offset), hi = std::min(owned[k].end, p.offset + p.numel);
      if (lo < hi)
        fn(engine_->owned_grads(k).slice(lo - owned[k].begin, hi - lo), table.slice(lo - p.offset, hi - lo));
    }
  };
  each_owned_piece([](Tensor mine, Tensor in_table) { in_table.copy_from(mine); });
  dp->all_reduce(table, ReduceOp::sum)->wait();
  tied_->all_reduce(table, ReduceOp::sum)->wait();
  each_owned_piece([](Tensor mine, const Tensor& in_table) { mine.copy_from(in_table); });
}

float PipelineEngine::train_batch(const MicroBatches& batch) { return run(batch, true); }
float PipelineEngine::eval_batch(const MicroBatches& batch) { return run(batch, false); }

float PipelineEngine::run(const MicroBatches& batch, bool train) {
  const int64_t gas = engine_->config().gradient_accumulation_steps, m = int64_t(batch.size());
  DSCPP_CHECK(!train || m == gas, "train_batch: ", m, " micro-batches, but gradient_accumulation_steps is ", gas,
              " (a pipeline batch is that many)");
  DSCPP_CHECK(m >= 1, "eval_batch: no micro-batches");
  // Eval runs the model alone (Engine::model() lands any pending update first), leaving the engine's counters.
  Model& model = engine_->model();
  PipelineStage& st = stage();
  const ModelConfig& mc = model.config();
  const int64_t items = mc.n_layer + 2;
  const ParamSet& ps = model.params();
  const auto& chunks = st.layers().chunks;
  const auto list = build_schedule({stages_, int(m), virtual_stages_}, train)[size_t(stage_)];
  auto key = [&](const PipeInstr& i) { return int64_t(i.mb) * virtual_stages_ + i.chunk; };
  auto hidden = [&](int mb) {
    const Tensor& x = batch[size_t(mb)].first;
    return Tensor::empty({st.hidden_rows(x.numel()), mc.n_embd}, ps.dtype(), ps.device());
  };
  std::map<int64_t, Tensor> inbox, outbox;  // received / to send, by key
  Tensor loss_sum = Tensor::zeros({1}, DType::f32, ps.device());
  int64_t completed = 0;
  for (const PipeInstr& i : list) {
    const bool embed = i.mb >= 0 && chunks[size_t(i.chunk)].first == 0;
    const bool head = i.mb >= 0 && chunks[size_t(i.chunk)].second == items;
    switch (i.op) {
      case PipeOp::load_micro_batch: {
        const auto& [x, y] = batch[size_t(i.mb)];
        DSCPP_CHECK(x.dtype() == DType::i32 && x.dim() == 2 && y.shape() == x.shape(), "micro-batch ", i.mb,
                    ": tokens and targets must be i32 [B, T] alike, got ", x.str(), " and ", y.str());
        break;
      }
      case PipeOp::recv_activation:
      case PipeOp::recv_grad: {
        Tensor t = hidden(i.mb);
        pipe_->recv(t, i.peer)->wait();
        inbox[key(i)] = t;
        break;
      }
      case PipeOp::send_activation:
      case PipeOp::send_grad: {
        auto it = outbox.find(key(i));
        DSCPP_CHECK(it != outbox.end(), "pipeline: nothing to ", to_string(i));
        pipe_->send(it->second, i.peer)->wait();
        outbox.erase(it);
        break;
      }
      case PipeOp::forward: {
        const auto& [x, y] = batch[size_t(i.mb)];
        st.select_chunk(i.chunk);
        if (!embed) st.set_input(inbox.extract(key(i)).mapped());
        const Loss l = train ? engine_->forward(x, y) : model.forward(x, y);
        if (head) ops::add_inplace(loss_sum, l.tensor());
        else outbox[key(i)] = st.output();
        if (train) st.stash(key(i));
        else st.drop_activations();
        break;
      }
      case PipeOp::backward: {
        st.unstash(key(i));
        if (!head) st.set_output_grad(inbox.extract(key(i)).mapped());
        const bool completes = i.chunk == 0;  // a micro-batch's backward ends at this rank's first chunk
        engine_->backward_part(completes);
        if (!embed) outbox[key(i)] = st.input_grad();
        if (completes && ++completed < m) engine_->step();  // the boundary's step waits for the tied reduction
        break;
      }
      case PipeOp::reduce_tied_grads:
        if (tied_) sum_tied_grads();
        break;
      case PipeOp::optimizer_step:
        engine_->step();
        break;
    }
  }
  DSCPP_CHECK(inbox.empty() && outbox.empty(), "pipeline: ", inbox.size(), " received and ", outbox.size(),
              " unsent tensors left after the schedule");
  // The loss: the last stage's mean, averaged over the data-parallel ranks, then broadcast along the pipeline.
  Tensor loss = Tensor::zeros({1}, DType::f32, ps.device());
  if (is_last_stage()) {
    float mean = loss_sum.to(Device::cpu()).data<float>()[0] / float(m);
    if (ProcessGroup* dp = engine_->dp_group()) mean = all_reduce_values(*dp, {mean}, ReduceOp::avg, ps.device())[0];
    Tensor h = Tensor::empty({1}, DType::f32, Device::cpu());
    h.data<float>()[0] = mean;
    loss.copy_from(h);
  }
  if (stages_ > 1) pipe_->broadcast(loss, stages_ - 1)->wait();
  return loss.to(Device::cpu()).data<float>()[0];
}

}  // namespace dscpp
