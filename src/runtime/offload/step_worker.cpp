// The optimizer offload's worker thread (runtime/offload/step_worker.h).
#include "runtime/offload/step_worker.h"

#include <utility>

#include "dscpp/core/check.h"

namespace dscpp {

StepWorker::StepWorker() : thread_([this] { loop(); }) {}

StepWorker::~StepWorker() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepWorker::run(std::function<void()> job, int64_t progress) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DSCPP_CHECK(!busy_, "StepWorker: a job was started while another runs");
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    job_ = std::move(job);
    progress_ = progress;
    busy_ = true;
  }
  cv_.notify_all();
}

void StepWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (busy_ && job_); });
    if (stop_) return;
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

void StepWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

bool StepWorker::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !busy_;
}

void StepWorker::advance(int64_t progress) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_ = progress;
  }
  cv_.notify_all();
}

void StepWorker::wait_for(int64_t progress) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return progress_ >= progress || !busy_; });
  if (progress_ >= progress) return;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  DSCPP_FAIL("StepWorker: waited for progress ", progress, " but the job ended at ", progress_);
}

bool StepWorker::reached(int64_t progress) const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_ >= progress;
}

void StepWorker::set_progress(int64_t progress) {
  std::lock_guard<std::mutex> lock(mu_);
  DSCPP_CHECK(!busy_, "StepWorker: progress set while a job runs");
  progress_ = progress;
}

}  // namespace dscpp
