// StepWorker: the thread that runs the optimizer offload's host step beside the training loop (Note [Optimizer
// offload], optimizer_offload.h). One job at a time; a job reports its progress as a count that other threads wait
// for, so the next forward can use each unit as soon as its update is on its way to the device. An exception in the
// job is rethrown by every wait after it. Private to the runtime.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dscpp {

class StepWorker {
 public:
  StepWorker();
  ~StepWorker();  // finishes the job in hand, then stops the thread
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  // Starts `job` on the worker thread with the progress count at `progress` (the previous job must be done: wait()).
  void run(std::function<void()> job, int64_t progress = 0);
  void wait();                        // until the job in hand is done; rethrows its exception
  bool idle() const;                  // no job in hand (a failed one counts as done)

  void advance(int64_t progress);     // from the job: the count is now `progress`
  void wait_for(int64_t progress);    // until the count reaches `progress`; rethrows the job's exception
  bool reached(int64_t progress) const;
  void set_progress(int64_t progress);  // while idle, from the thread that runs jobs

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  int64_t progress_ = 0;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the rest is set up
};

}  // namespace dscpp
