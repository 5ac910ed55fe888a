// Command-line flags of the bench programs: `--key value`, `--key=value` and value-less switches. Any error prints
// "<program>: <why>" and the usage text, and exits 2 (what the run_*.sh scripts expect of a bad invocation).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace dscpp::bench {

struct Flags {
  const char* program;
  const char* usage;  // printed after "usage: "

  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\nusage: %s", program, why.c_str(), usage);
    std::exit(2);
  }

  int64_t to_int(const std::string& key, const std::string& v, int64_t min) const {
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || x < min)
      fail("--" + key + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
    return x;
  }

  static std::vector<std::string> list(const std::string& v) {  // "a,b,,c" -> {a, b, c}
    std::vector<std::string> out;
    std::stringstream ss(v);
    for (std::string x; std::getline(ss, x, ',');)
      if (!x.empty()) out.push_back(x);
    return out;
  }

  // on_switch(name) for the value-less flags named in `switches`, on_value(name, value) for every other flag.
  void parse(int argc, char** argv, const std::vector<std::string>& switches,
             const std::function<void(const std::string&)>& on_switch,
             const std::function<void(const std::string&, const std::string&)>& on_value) const {
    for (int i = 1; i < argc; i++) {
      std::string k = argv[i], v;
      if (k == "-h" || k == "--help") fail("help");
      if (k.rfind("--", 0) != 0) fail("unexpected argument '" + k + "'");
      k = k.substr(2);
      bool is_switch = false;
      for (const std::string& s : switches) is_switch |= s == k;
      if (is_switch) {
        on_switch(k);
        continue;
      }
      if (size_t eq = k.find('='); eq != std::string::npos) {
        v = k.substr(eq + 1);
        k = k.substr(0, eq);
      } else {
        if (i + 1 >= argc) fail("--" + k + " needs a value");
        v = argv[++i];
      }
      on_value(k, v);
    }
  }
};

}  // namespace dscpp::bench
