// The process supervisor behind `dscpp launch` (see supervisor.h for the contract). One thread, one poll() loop over
// the children's stdout/stderr pipes, a self-pipe fed by the signal handler, and optionally our stdin; children are
// reaped with waitpid(pid, WNOHANG) on each turn (never waitpid(-1): the caller may own other children).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "dscpp/core/check.h"
#include "dscpp/launcher/process.h"
#include "dscpp/launcher/supervisor.h"

namespace dscpp::launcher {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxLine = 64 * 1024;  // a longer line without '\n' is passed on in pieces

int g_signal_pipe = -1;  // write end, for the handler

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (g_signal_pipe >= 0) (void)!write(g_signal_pipe, &b, 1);
  errno = saved;
}

// Handlers live only while a run is in progress; the previous dispositions come back afterwards.
struct SignalScope {
  int pipe_fd[2] = {-1, -1};
  bool forward;
  struct sigaction old_int{}, old_term{}, old_hup{}, old_pipe{};
  explicit SignalScope(bool fwd) : forward(fwd) {
    DSCPP_CHECK(pipe2(pipe_fd, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2: ", std::strerror(errno));
    struct sigaction ign{};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &old_pipe);  // a closed stdout must not kill the launcher mid-cleanup
    if (!forward) return;
    g_signal_pipe = pipe_fd[1];
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
  }
  ~SignalScope() {
    if (forward) {
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      sigaction(SIGHUP, &old_hup, nullptr);
      g_signal_pipe = -1;
    }
    sigaction(SIGPIPE, &old_pipe, nullptr);
    close(pipe_fd[0]);
    close(pipe_fd[1]);
  }
};

void write_all(int fd, const std::string& s) {
  const char* p = s.data();
  size_t n = s.size();
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the reader is gone; keep supervising anyway
    p += w;
    n -= (size_t)w;
  }
}

struct Stream {
  int fd = -1;
  int dest = -1;
  std::string prefix, buf;
  void emit_lines(bool flush_partial) {
    size_t start = 0, nl;
    while ((nl = buf.find('\n', start)) != std::string::npos) {
      write_all(dest, prefix + buf.substr(start, nl - start + 1));
      start = nl + 1;
    }
    buf.erase(0, start);
    if (!buf.empty() && (flush_partial || buf.size() >= kMaxLine)) {
      write_all(dest, prefix + buf + "\n");
      buf.clear();
    }
  }
  void close_stream() {
    emit_lines(true);
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

struct Child {
  pid_t pid = -1;
  bool alive = false;
  int status = 0;
  int stdin_w = -1;
  Stream out, err;
};


// Starts one child; fds it needs are made here and the parent's copies of the child ends are closed.
void spawn(const ProcSpec& spec, Child& c, int out_fd, int err_fd) {
  DSCPP_CHECK(!spec.argv.empty(), "launch: empty command for ", spec.label);
  int in_fd = -1, in_w = -1, o[2] = {-1, -1}, e[2] = {-1, -1}, log_fd = -1;
  if (spec.stdin_pipe) {
    int p[2];
    DSCPP_CHECK(pipe2(p, O_CLOEXEC) == 0, "pipe2: ", std::strerror(errno));
    in_fd = p[0];
    in_w = p[1];
  } else {
    in_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (!spec.log_path.empty()) {
    log_fd = open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DSCPP_CHECK(log_fd >= 0, "cannot open rank log ", spec.log_path, ": ", std::strerror(errno));
  } else {
    DSCPP_CHECK(pipe2(o, O_CLOEXEC) == 0 && pipe2(e, O_CLOEXEC) == 0, "pipe2: ", std::strerror(errno));
  }
  const pid_t pid = spawn_process(spec.argv, spec.env, in_fd, log_fd >= 0 ? log_fd : o[1], log_fd >= 0 ? log_fd : e[1]);
  close(in_fd);
  if (log_fd >= 0) close(log_fd);
  if (o[1] >= 0) close(o[1]);
  if (e[1] >= 0) close(e[1]);
  c.pid = pid;
  c.alive = true;
  c.stdin_w = in_w;
  c.out = {o[0], out_fd, spec.prefix, {}};
  c.err = {e[0], err_fd, spec.prefix, {}};
}

}  // namespace

RunResult run_supervised(const std::vector<ProcSpec>& procs, const SuperviseOptions& opts) {
  SignalScope signals(opts.forward_signals);
  std::vector<Child> kids(procs.size());
  auto message = [&](const std::string& s) { write_all(opts.err_fd, "[launcher] " + s + "\n"); };
  auto signal_all = [&](int sig) {
    for (auto& k : kids) {
      if (k.pid > 0) kill(-k.pid, sig);  // the whole group: a rank's own children go too
      if (k.stdin_w >= 0) close(k.stdin_w), k.stdin_w = -1;
    }
  };
  auto reap_all_blocking = [&] {
    for (auto& k : kids)
      if (k.alive) waitpid(k.pid, &k.status, 0), k.alive = false;
  };
  try {
    for (size_t i = 0; i < procs.size(); i++) spawn(procs[i], kids[i], opts.out_fd, opts.err_fd);
  } catch (...) {
    signal_all(SIGKILL);
    reap_all_blocking();
    for (auto& k : kids) k.out.close_stream(), k.err.close_stream();
    throw;
  }

  RunResult res;
  int launcher_sig = 0;
  bool stopping = false, killed = false, stdin_open = opts.exit_on_stdin_eof;
  Clock::time_point kill_at;
  auto begin_stop = [&](int sig) {
    stopping = true;
    kill_at = Clock::now() + std::chrono::milliseconds((long)(opts.kill_grace_s * 1000));
    signal_all(sig);
  };
  auto read_into = [](Stream& s) {
    char buf[16384];
    ssize_t n = read(s.fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) return s.close_stream();
    s.buf.append(buf, (size_t)n);
    s.emit_lines(false);
  };
  auto poll_once = [&](int timeout_ms) {
    std::vector<pollfd> fds = {{signals.pipe_fd[0], POLLIN, 0}};
    if (stdin_open) fds.push_back({0, POLLIN, 0});
    std::vector<Stream*> streams;
    for (auto& k : kids)
      for (Stream* s : {&k.out, &k.err})
        if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0}), streams.push_back(s);
    if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    size_t i = 0;
    if (fds[i++].revents) {
      unsigned char sigs[16];
      ssize_t n = read(signals.pipe_fd[0], sigs, sizeof sigs);
      for (ssize_t j = 0; j < n; j++) {
        if (stopping) {  // asked while already stopping: do not wait for the grace period
          message(std::string("got ") + strsignal(sigs[j]) + " again, killing all processes");
          signal_all(SIGKILL);
          killed = true;
        } else if (!stopping) {
          launcher_sig = sigs[j];
          message(std::string("got signal ") + std::to_string(sigs[j]) + " (" + strsignal(sigs[j]) +
                  "), forwarding it to " + std::to_string(kids.size()) + " process(es)");
          begin_stop(sigs[j]);
        }
      }
    }
    if (stdin_open && fds[i++].revents) {
      char b[256];
      ssize_t n = read(0, b, sizeof b);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        stdin_open = false;
        if (!stopping) {
          message("stdin closed (the launcher that started this node is gone), stopping local ranks");
          launcher_sig = SIGTERM;
          begin_stop(SIGTERM);
        }
      }
    }
    for (size_t s = 0; s < streams.size(); s++)
      if (fds[i + s].revents) read_into(*streams[s]);
  };

  for (;;) {
    int alive = 0;
    for (size_t i = 0; i < kids.size(); i++) {
      Child& k = kids[i];
      if (!k.alive) continue;
      if (waitpid(k.pid, &k.status, WNOHANG) != k.pid) {
        alive++;
        continue;
      }
      k.alive = false;
      const bool failed = !(WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0);
      if (failed && !stopping) {
        res.failed = (int)i;
        res.exit_code = exit_code_of_status(k.status);
        res.reason = procs[i].label + " (pid " + std::to_string(k.pid) + ") " + describe_exit_status(k.status);
        int others = 0;
        for (auto& o : kids) others += o.alive;
        message(res.reason + "; stopping the other " + std::to_string(others) + " process(es)");
        begin_stop(SIGTERM);
      }
    }
    if (!alive) break;
    if (stopping && !killed && Clock::now() >= kill_at) {
      std::string late;
      for (size_t i = 0; i < kids.size(); i++)
        if (kids[i].alive) late.append(late.empty() ? "" : ", ").append(procs[i].label);
      message(late + " still running " + std::to_string(opts.kill_grace_s) + " s after SIGTERM, sending SIGKILL");
      signal_all(SIGKILL);
      killed = true;
    }
    poll_once(50);
  }
  // Every child is reaped; take what is left in the pipes, but do not wait on grandchildren that keep them open.
  auto drain_until = Clock::now() + std::chrono::milliseconds(300);
  for (;;) {
    bool open = false;
    for (auto& k : kids) open |= k.out.fd >= 0 || k.err.fd >= 0;
    if (!open || Clock::now() >= drain_until) break;
    poll_once(20);
  }
  if (stopping) signal_all(SIGKILL);  // leftovers of stopped groups
  for (auto& k : kids) {
    k.out.close_stream();
    k.err.close_stream();
    if (k.stdin_w >= 0) close(k.stdin_w);
  }
  bool all_clean = true;
  for (const auto& k : kids) all_clean &= WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0;
  if (res.failed < 0 && launcher_sig && !(opts.clean_stop_is_success && all_clean && !killed)) {
    res.exit_code = 128 + launcher_sig;
    res.reason = std::string("stopped by signal ") + std::to_string(launcher_sig) + " (" + strsignal(launcher_sig) + ")";
  }
  return res;
}

}  // namespace dscpp::launcher
