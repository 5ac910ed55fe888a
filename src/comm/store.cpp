// TcpStore server and client over POSIX sockets.
//
// Wire format (both directions little-endian host order: every peer is the same build on the same kind of host):
//   request  = u8 cmd, u32 key_len, key bytes, u32 value_len, value bytes
//   response = u8 status (1 ok / found, 0 missing), u32 len, bytes
// The server handles every request at once (nothing blocks server-side); blocking get/wait poll from the client
// with a short backoff, which keeps the protocol one-request-one-response and lets a waiting client give up on its
// own timeout without leaving a half-answered request on its connection.
#include "dscpp/comm/store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

namespace dscpp {

namespace {

enum Cmd : uint8_t { kHello = 1, kBye, kSet, kSetNx, kGet, kAdd, kCheck, kErase };
using Clock = std::chrono::steady_clock;

void put_u32(Bytes& b, uint32_t v) { b.insert(b.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 4); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

// Reads exactly n bytes before `deadline`; false on EOF, error or timeout (*timed_out tells which).
bool recv_all(int fd, char* p, size_t n, Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  while (n > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return (*timed_out = true), false;
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, int(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) continue;
    ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return false;
    p += got;
    n -= size_t(got);
  }
  return true;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += k + '\0';
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Server: one thread, poll() over the listening socket, every client and a wake-up pipe.

struct TcpStoreServer::State {
  std::string run_id;  // this job's (Note [One store per job])
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::map<std::string, Bytes> data;
  struct Client {
    Bytes in;
    bool greeted = false;  // said hello with this job's run id
    int rank = -1;
    bool said_bye = false;
  };
  std::map<int, Client> clients;
  std::atomic<int> n_clients{0};        // for the destructor's linger (Note [Store failure signalling])
  std::atomic<bool> aborted{false};

  void serve();
  bool handle(int fd, Client& c);  // false: drop the client
  void drop(int fd);
};

TcpStoreServer::TcpStoreServer(int port, std::string run_id) : s_(std::make_unique<State>()) {
  s_->run_id = std::move(run_id);
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  bool v6 = fd >= 0;
  if (!v6) fd = ::socket(AF_INET, SOCK_STREAM, 0);
  DSCPP_CHECK(fd >= 0, "TcpStoreServer: socket() failed: ", std::strerror(errno));
  int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // accept IPv4 clients too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(port));
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(port));
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0 || ::listen(fd, 1024) != 0) {
    int e = errno;
    ::close(fd);
    if (e == EADDRINUSE)
      DSCPP_FAIL("rank 0 cannot host the job's store on port ", port, ": ", std::strerror(e), "; another job on this ",
                 "machine probably uses it. Start this job on another port: dscpp launch --master_port <port> (or ",
                 "--master_port 0 for a free one), or MASTER_PORT=<port> under other launchers");
    DSCPP_FAIL("rank 0 cannot host the job's store on port ", port, ": ", std::strerror(e));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s_->listen_fd = fd;
  DSCPP_CHECK(::pipe(s_->wake) == 0, "TcpStoreServer: pipe() failed");
  s_->thread = std::thread([st = s_.get()] { st->serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  // After a failure the other ranks still need to read the abort key to name the failed rank: keep serving while
  // they are connected, for a few seconds at most, rather than vanish with this process.
  for (int i = 0; i < 300 && s_->aborted && s_->n_clients > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  char c = 'x';
  (void)!::write(s_->wake[1], &c, 1);
  if (s_->thread.joinable()) s_->thread.join();
  for (auto& [fd, c] : s_->clients) ::close(fd);
  ::close(s_->listen_fd);
  ::close(s_->wake[0]);
  ::close(s_->wake[1]);
}

void TcpStoreServer::State::drop(int fd) {
  Client& c = clients[fd];
  if (c.rank >= 0 && !c.said_bye) {
    std::string msg = "rank " + std::to_string(c.rank) + ": disconnected from the store without shutting down " +
                      "(process exited or crashed)";
    data.emplace(kAbortKey, Bytes(msg.begin(), msg.end()));  // first writer wins
    aborted = true;
  }
  ::close(fd);
  clients.erase(fd);
  n_clients = int(clients.size());
}

void TcpStoreServer::State::serve() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake[0], POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (auto& [fd, c] : clients) fds.push_back({fd, POLLIN, 0});
    int r = ::poll(fds.data(), fds.size(), -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[0].revents & POLLIN)) return;
    if (fds[1].revents & POLLIN) {
      int cfd = ::accept(listen_fd, nullptr, nullptr);
      if (cfd >= 0) {
        int one = 1;
        ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        clients[cfd] = Client{};
        n_clients = int(clients.size());
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      int fd = fds[i].fd;
      char buf[65536];
      ssize_t got = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) {
        drop(fd);
        continue;
      }
      Client& c = clients[fd];
      c.in.insert(c.in.end(), buf, buf + got);
      if (!handle(fd, c)) drop(fd);
    }
  }
}

bool TcpStoreServer::State::handle(int fd, Client& c) {
  for (;;) {  // every complete request in the buffer
    if (c.in.size() < 5) return true;
    uint32_t klen = get_u32(c.in.data() + 1);
    if (c.in.size() < 9 + size_t(klen)) return true;
    uint32_t vlen = get_u32(c.in.data() + 5 + klen);
    size_t total = 9 + size_t(klen) + vlen;
    if (c.in.size() < total) return true;
    uint8_t cmd = uint8_t(c.in[0]);
    std::string key(c.in.data() + 5, klen);
    Bytes val(c.in.begin() + 9 + klen, c.in.begin() + total);
    c.in.erase(c.in.begin(), c.in.begin() + total);

    uint8_t status = 1;
    Bytes out;
    if (cmd != kHello && !c.greeted) return false;  // every client of this job opens with its run id
    bool refused = false;
    switch (cmd) {
      case kHello:
        if (std::string(val.begin(), val.end()) != run_id) {  // another job's rank: answer, then forget it
          status = 0;
          out.assign(run_id.begin(), run_id.end());
          refused = true;
          break;
        }
        c.greeted = true;
        c.rank = std::stoi(key);
        break;
      case kBye: c.said_bye = true; break;
      case kSet: data[key] = std::move(val); break;
      case kSetNx: status = data.emplace(key, std::move(val)).second ? 1 : 0; break;
      case kGet: {
        auto it = data.find(key);
        if (it == data.end()) status = 0;
        else out = it->second;
        break;
      }
      case kAdd: {
        int64_t delta = std::stoll(std::string(val.begin(), val.end()));
        auto it = data.find(key);
        int64_t cur = it == data.end() ? 0 : std::stoll(std::string(it->second.begin(), it->second.end()));
        std::string s = std::to_string(cur + delta);
        data[key] = Bytes(s.begin(), s.end());
        out = data[key];
        break;
      }
      case kCheck: {
        size_t start = 0;
        for (size_t i = 0; i < key.size(); ++i)
          if (key[i] == '\0') {
            if (!data.count(key.substr(start, i - start))) status = 0;
            start = i + 1;
          }
        break;
      }
      case kErase: data.erase(key); break;
      default: return false;  // not our protocol
    }
    if (key == kAbortKey && (cmd == kSet || cmd == kSetNx)) aborted = true;
    Bytes resp;
    resp.push_back(char(status));
    put_u32(resp, uint32_t(out.size()));
    resp.insert(resp.end(), out.begin(), out.end());
    if (!send_all(fd, resp.data(), resp.size()) || refused) return false;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Client

TcpStore::TcpStore(const std::string& host, int port, int rank, std::chrono::milliseconds timeout,
                   std::string run_id)
    : host_(host), port_(port), timeout_(timeout) {
  auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  for (int attempt = 0;; ++attempt) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = std::string("cannot resolve host: ") + gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline)
      DSCPP_FAIL("TcpStore: cannot connect to ", host, ":", port, " within ", timeout.count(), " ms (", last_error,
                 "); is rank 0 running and MASTER_ADDR/MASTER_PORT right?");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10 * (attempt + 1), 200)));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  Bytes answer = request(kHello, std::to_string(rank), Bytes(run_id.begin(), run_id.end()));
  if (answer[0] == 0) {
    ::close(fd_);
    fd_ = -1;
    auto name = [](const std::string& id) { return id.empty() ? std::string("none") : "'" + id + "'"; };
    DSCPP_FAIL("the store at ", host, ":", port, " belongs to another job (its run id ",
               name(std::string(answer.begin() + 1, answer.end())), ", this job's ", name(run_id),
               "): another job is using MASTER_PORT=", port, ". Start this job on another port: dscpp launch ",
               "--master_port <port> (or --master_port 0 for a free one), or MASTER_PORT=<port> under other launchers");
  }
}

TcpStore::~TcpStore() {
  if (fd_ < 0) return;  // refused, or the connection was lost
  try {
    request(kBye, "", {});
  } catch (...) {  // the server may be gone already: nothing to say goodbye to
  }
  ::close(fd_);
}

Bytes TcpStore::request(uint8_t cmd, const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mu_);
  DSCPP_CHECK(fd_ >= 0, "TcpStore: connection to ", host_, ":", port_, " is closed");
  Bytes msg;
  msg.push_back(char(cmd));
  put_u32(msg, uint32_t(key.size()));
  msg.insert(msg.end(), key.begin(), key.end());
  put_u32(msg, uint32_t(value.size()));
  msg.insert(msg.end(), value.begin(), value.end());
  char head[5];
  bool timed_out = false;
  auto lost = [&]() {
    ::close(fd_);
    fd_ = -1;
    DSCPP_FAIL("TcpStore: lost the connection to the store at ", host_, ":", port_,
               timed_out ? " (no answer in time)" : " (rank 0, which hosts the store, may have exited)");
  };
  if (!send_all(fd_, msg.data(), msg.size())) lost();
  auto deadline = Clock::now() + std::max(timeout_, std::chrono::milliseconds(1000));
  if (!recv_all(fd_, head, 5, deadline, &timed_out)) lost();
  Bytes out(get_u32(head + 1));
  if (!out.empty() && !recv_all(fd_, out.data(), out.size(), deadline, &timed_out)) lost();
  if (head[0] == 0) out.insert(out.begin(), '\0');  // status travels as a leading marker for the callers below
  else out.insert(out.begin(), '\1');
  return out;
}

void TcpStore::set(const std::string& key, const Bytes& value) { request(kSet, key, value); }

bool TcpStore::set_if_absent(const std::string& key, const Bytes& value) {
  return request(kSetNx, key, value)[0] == 1;
}

std::optional<Bytes> TcpStore::try_get(const std::string& key) {
  Bytes r = request(kGet, key, {});
  if (r[0] == 0) return std::nullopt;
  return Bytes(r.begin() + 1, r.end());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string d = std::to_string(delta);
  Bytes r = request(kAdd, key, Bytes(d.begin(), d.end()));
  return std::stoll(std::string(r.begin() + 1, r.end()));
}

bool TcpStore::check(const std::vector<std::string>& keys) { return request(kCheck, join_keys(keys), {})[0] == 1; }

void TcpStore::erase(const std::string& key) { request(kErase, key, {}); }

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = timeout_;
  auto deadline = Clock::now() + timeout;
  bool watch_abort = true;
  for (const auto& k : keys) watch_abort = watch_abort && k != kAbortKey;
  for (int i = 0;; ++i) {
    if (check(keys)) return;
    if (watch_abort)
      if (auto why = abort_reason())
        throw StoreAborted("TcpStore: gave up waiting for '" + keys[0] + "': the job was aborted by " + *why, *why);
    if (Clock::now() >= deadline) {
      std::string names;
      for (const auto& k : keys) names += (names.empty() ? "'" : ", '") + k + "'";
      DSCPP_FAIL("TcpStore: timed out after ", timeout.count(), " ms waiting for key(s) ", names, " at ", host_, ":",
                 port_);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(i < 20 ? 1 : 10));
  }
}

Bytes TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  if (auto v = try_get(key)) return *v;
  wait({key}, timeout);
  return *try_get(key);
}

std::string TcpStore::get_string(const std::string& key, std::chrono::milliseconds timeout) {
  Bytes b = get(key, timeout);
  return std::string(b.begin(), b.end());
}

void TcpStore::abort(int rank, const std::string& reason) {
  try {
    std::string msg = "rank " + std::to_string(rank) + ": " + reason;
    set_if_absent(kAbortKey, Bytes(msg.begin(), msg.end()));
  } catch (...) {  // abort runs on error paths: never let it hide the original error
  }
}

std::optional<std::string> TcpStore::abort_reason() {
  try {
    if (auto v = try_get(kAbortKey)) return std::string(v->begin(), v->end());
  } catch (...) {
  }
  return std::nullopt;
}

StoreHandle connect_store(const std::string& host, int port, int rank, bool host_server,
                          std::chrono::milliseconds timeout, const std::string& run_id) {
  StoreHandle h;
  if (host_server) h.server = std::make_shared<TcpStoreServer>(port, run_id);
  h.store = std::make_shared<TcpStore>(host, host_server ? h.server->port() : port, rank, timeout, run_id);
  return h;
}

}  // namespace dscpp
