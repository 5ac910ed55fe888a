// Command lines for remote nodes and for mpirun/srun. Unlike DeepSpeed we ask each MPI/Slurm launcher to label
// output lines with the rank (--tag-output, -prepend-rank, --label) so every rank's output is attributable, and
// Slurm gets its real host-selection flags (--nodelist/--exclude: srun has no --include).
#include <cctype>

#include "dscpp/core/check.h"
#include "launcher/runners.h"

namespace dscpp::launcher {

std::string shell_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s)
    if (!(std::isalnum((unsigned char)c) || std::string_view("_-./=:,@%+").find(c) != std::string_view::npos))
      plain = false;
  if (plain) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string s;
  for (auto& a : argv) s.append(s.empty() ? "" : " ").append(shell_quote(a));
  return s;
}

std::vector<std::string> split_args(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  bool have = false;
  char quote = 0;
  for (size_t i = 0; i < s.size(); i++) {
    char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
      else if (c == '\\' && quote == '"' && i + 1 < s.size()) cur += s[++i];
      else cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      have = true;
    } else if (c == '\\' && i + 1 < s.size()) {
      cur += s[++i];
      have = true;
    } else if (std::isspace((unsigned char)c)) {
      if (have) out.push_back(cur);
      cur.clear();
      have = false;
    } else {
      cur += c;
      have = true;
    }
  }
  DSCPP_CHECK(!quote, "unterminated quote in --launcher_args '", s, "'");
  if (have) out.push_back(cur);
  return out;
}

namespace {

std::vector<std::string> ssh_prefix(const LaunchOptions& o) {
  // BatchMode: a host that wants a password fails at once instead of waiting on a prompt nobody sees.
  std::vector<std::string> cmd = {"ssh", "-o", "PasswordAuthentication=no", "-o", "BatchMode=yes"};
  if (o.ssh_port > 0) cmd.insert(cmd.end(), {"-p", std::to_string(o.ssh_port)});
  return cmd;
}

}  // namespace

std::vector<std::string> ssh_check_command(const LaunchOptions& o, const std::string& host) {
  auto cmd = ssh_prefix(o);
  cmd.insert(cmd.end(), {"-o", "ConnectTimeout=10", host, "hostname"});
  return cmd;
}

std::vector<std::string> ssh_node_command(const LaunchOptions& o, const LaunchPlan& plan, int node_rank,
                                          const Env& exports, const std::string& cwd) {
  DSCPP_CHECK(!o.self_exe.empty(), "ssh launch needs the path of the dscpp binary");
  std::string remote;
  for (auto& [k, v] : exports) remote += "export " + k + "=" + shell_quote(v) + "; ";
  remote += "cd " + shell_quote(cwd) + "; ";
  std::vector<std::string> launch = {o.self_exe,
                                     "launch",
                                     "--world_info=" + encode_world_info(plan.world),
                                     "--node_rank=" + std::to_string(node_rank),
                                     "--master_addr=" + plan.master_addr,
                                     "--master_port=" + std::to_string(plan.master_port),
                                     "--exit_on_stdin_eof"};
  if (!plan.run_id.empty()) launch.push_back("--run_id=" + plan.run_id);
  if (plan.cpu) launch.push_back("--cpu");
  if (!o.each_rank_log_dir.empty()) launch.push_back("--enable_each_rank_log=" + o.each_rank_log_dir);
  launch.push_back("--");
  launch.insert(launch.end(), o.program.begin(), o.program.end());
  remote += join_command(launch);
  auto cmd = ssh_prefix(o);
  cmd.push_back(plan.world.at(node_rank).name);
  cmd.push_back(remote);
  return cmd;
}

std::vector<std::string> mpi_command(const LaunchOptions& o, const LaunchPlan& plan, const Env& exports) {
  const int total = world_size(plan.world);
  const auto extra = split_args(o.launcher_args);
  Env ex = exports;
  ex["MASTER_ADDR"] = plan.master_addr;
  ex["MASTER_PORT"] = std::to_string(plan.master_port);
  if (!plan.run_id.empty()) ex["TORCHELASTIC_RUN_ID"] = plan.run_id;
  std::vector<std::string> cmd;
  switch (o.runner) {
    case Runner::openmpi: {
      ex["UCX_TLS"] = "tcp";
      cmd = {"mpirun", "-n", std::to_string(total), "-hostfile", o.hostfile, "--mca", "btl", "^openib"};
      bool has_if = false;
      for (auto& a : extra) has_if |= a == "btl_tcp_if_include";
      if (!has_if) cmd.insert(cmd.end(), {"--mca", "btl_tcp_if_include", "eth0"});
      cmd.insert(cmd.end(), extra.begin(), extra.end());
      cmd.push_back("--tag-output");
      for (auto& [k, v] : ex) cmd.insert(cmd.end(), {"-x", k + "=" + v});
      break;
    }
    case Runner::mpich: {
      const int ppn = (int)plan.world[0].slots.size();
      cmd = {"mpirun", "-n", std::to_string(total), "-ppn", std::to_string(ppn)};
      cmd.insert(cmd.end(), extra.begin(), extra.end());
      cmd.push_back("-prepend-rank");
      ex["WORLD_SIZE"] = std::to_string(total);
      ex["LOCAL_SIZE"] = std::to_string(ppn);
      for (auto& [k, v] : ex) cmd.insert(cmd.end(), {"-genv", k, v});
      std::string hosts;
      for (auto& h : plan.world) hosts.append(hosts.empty() ? "" : ",").append(h.name);
      cmd.insert(cmd.end(), {"-hosts", hosts});
      break;
    }
    case Runner::slurm: {
      cmd = {"srun", "-n", std::to_string(total)};
      cmd.insert(cmd.end(), extra.begin(), extra.end());
      cmd.push_back("--label");
      auto hosts_only = [](const std::string& spec, const char* flag) {
        DSCPP_CHECK(spec.find(':') == std::string::npos, "the slurm launcher selects whole nodes: ", flag, " '",
                    spec, "' names slots");
        std::string s = spec;
        for (char& c : s)
          if (c == '@') c = ',';
        return s;
      };
      if (!o.include.empty()) cmd.push_back("--nodelist=" + hosts_only(o.include, "--include"));
      if (!o.exclude.empty()) cmd.push_back("--exclude=" + hosts_only(o.exclude, "--exclude"));
      if (o.num_nodes > 0) cmd.insert(cmd.end(), {"--nodes", std::to_string(o.num_nodes)});
      if (o.num_gpus > 0) cmd.insert(cmd.end(), {"--gpus", std::to_string(o.num_gpus)});
      std::string export_arg = "--export=ALL";
      for (auto& [k, v] : ex) export_arg += "," + k + "=" + v;
      cmd.push_back(export_arg);
      break;
    }
    case Runner::ssh: DSCPP_FAIL("mpi_command: the ssh runner starts per-node launchers, not one command");
  }
  cmd.insert(cmd.end(), o.program.begin(), o.program.end());
  return cmd;
}

}  // namespace dscpp::launcher
