// Adapter: our TcpStore as a gloo::rendezvous::Store, keys under a per-group prefix. Private to src/comm/gloo.
#pragma once
#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>

#include "dscpp/comm/store.h"

namespace dscpp::comm_detail {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<TcpStore> store, std::string prefix) : s_(std::move(store)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override { s_->set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return s_->get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, s_->timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    s_->wait(full, timeout);
  }

 private:
  std::shared_ptr<TcpStore> s_;
  std::string prefix_;
};

}  // namespace dscpp::comm_detail
