// TcpStore: the key-value store every rank meets through (rendezvous, NCCL unique id, start-up agreement,
// failure signalling). Rank 0 runs a TcpStoreServer on MASTER_ADDR:MASTER_PORT in a thread; every rank (rank 0
// included) talks to it with a TcpStore client. Plain POSIX sockets; values are byte strings.
//
// Note [Store failure signalling]
// A rank that fails sets the key kAbortKey ("rank R: reason"); the first writer wins (set_if_absent), so the key
// names the root cause. The server also writes it when a client that said hello with its rank disconnects without
// saying goodbye (its process died): "rank R disconnected (process exited or crashed)". Blocking waits
// (get/wait) check kAbortKey between polls and throw StoreAborted naming that rank.
//
// Note [One store per job]
// A second job started on the same MASTER_PORT cannot host its store (rank 0 fails to listen), but its other ranks
// would still reach the first job's store, write their keys into it and, when their own job stops them, leave it
// as ranks that died: the healthy first job would abort, blaming its own rank. So every client opens with a hello
// carrying its job's run id (the launcher gives each job one: TORCHELASTIC_RUN_ID, as torchrun, comm/dist_env.h); a server answers
// clients of another run id with a refusal and forgets them, and the refused client throws an error naming the
// port and how to choose another. Neither side touches the other job's state.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/core/check.h"

namespace dscpp {

using Bytes = std::vector<char>;
inline constexpr const char* kAbortKey = "dscpp/abort";

struct StoreAborted : Error {                 // a wait saw the abort key
  StoreAborted(const std::string& msg, std::string abort_value) : Error(msg), reason(std::move(abort_value)) {}
  std::string reason;                         // the abort key's value ("rank R: ...")
};

class TcpStoreServer {
 public:
  // Listens on `port` (all interfaces; 0 = any free port) and serves the clients of job `run_id` from a thread
  // until destroyed (Note [One store per job]).
  explicit TcpStoreServer(int port, std::string run_id = "");
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }

 private:
  struct State;
  std::unique_ptr<State> s_;
  int port_ = 0;
};

class TcpStore {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later). `rank` >= 0 registers this
  // client so that the server can report its death (Note [Store failure signalling]); -1 = anonymous. A server of
  // another `run_id` refuses the client: throws at once (Note [One store per job]).
  TcpStore(const std::string& host, int port, int rank, std::chrono::milliseconds timeout, std::string run_id = "");
  ~TcpStore();  // says goodbye: a clean exit is not a death
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const Bytes& value);
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  bool set_if_absent(const std::string& key, const Bytes& value);  // true when this call wrote it
  // Blocks until the key exists (or timeout / abort: throws Error / StoreAborted). timeout 0 = the store's default.
  Bytes get(const std::string& key, std::chrono::milliseconds timeout = {});
  std::string get_string(const std::string& key, std::chrono::milliseconds timeout = {});
  std::optional<Bytes> try_get(const std::string& key);  // non-blocking
  int64_t add(const std::string& key, int64_t delta);    // atomic counter (absent = 0); returns the new value
  bool check(const std::vector<std::string>& keys);      // all exist? (non-blocking)
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout = {});
  void erase(const std::string& key);

  // Failure signalling (Note [Store failure signalling]). abort() never throws (it runs on error paths).
  void abort(int rank, const std::string& reason);
  std::optional<std::string> abort_reason();  // the abort key's value, if set (nullopt also when unreachable)

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  Bytes request(uint8_t cmd, const std::string& key, const Bytes& value);  // one round trip, under mu_
  std::mutex mu_;
  int fd_ = -1;
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
};

// Rank-0-hosts-the-server pattern: on `rank` 0 starts a server on `port` (kept alive by the returned pair) and
// connects every rank's client. Used by init_process_group and by tests.
struct StoreHandle {
  std::shared_ptr<TcpStoreServer> server;  // non-null on the rank that hosts it
  std::shared_ptr<TcpStore> store;
};
StoreHandle connect_store(const std::string& host, int port, int rank, bool host_server,
                          std::chrono::milliseconds timeout, const std::string& run_id = "");

}  // namespace dscpp
