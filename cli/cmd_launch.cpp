// dscpp launch: start a job's ranks the way DeepSpeed's `deepspeed` launcher does (hostfile, --include/--exclude,
// --num_nodes/--num_gpus, ssh/openmpi/mpich/slurm runners), or N CPU ranks with --nproc. The program comes after
// `--`; a bare dscpp subcommand (`dscpp launch --nproc 2 train ...`) runs this same binary on every rank.
#include <unistd.h>

#include <climits>
#include <cstdio>

#include "cli/autotune_cli.h"
#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/rules.h"
#include "dscpp/core/check.h"
#include "dscpp/launcher/launch.h"

namespace dscpp::cli {

namespace {

struct LaunchCli {
  launcher::LaunchOptions o;
  std::string runner = "ssh";
  std::vector<std::string> program;
  std::string autotuning;  // "tune" | "run": hand the job to `dscpp autotune`
};

// DeepSpeed's `deepspeed --autotuning tune|run`: the launcher's resources become the autotuner's pool and trial size.
int launch_autotuning(const LaunchCli& cli) {
  const launcher::LaunchOptions& l = cli.o;
  AutotuneOptions a;
  a.run_after = cli.autotuning == "run";
  a.hostfile = l.hostfile;
  a.include = l.include;
  a.exclude = l.exclude;
  a.num_nodes = l.num_nodes;
  a.num_gpus = l.num_gpus;
  if (l.nproc > 0) a.nproc = a.slots = l.nproc;  // CPU ranks: one trial at a time on them
  a.kill_grace_s = l.kill_grace_s;
  a.program = cli.program;
  return run_autotune(a);
}

}  // namespace

Command register_launch(CLI::App& app) {
  auto* sub = app.add_subcommand("launch", "Start one process per GPU (or --nproc N CPU ranks) on one or many nodes; "
                                           "usage: dscpp launch [options] -- <program> [args...]  or  "
                                           "dscpp launch [options] train [train options]");
  auto cli = std::make_shared<LaunchCli>();
  launcher::LaunchOptions& o = cli->o;
  sub->add_option("-H,--hostfile", o.hostfile, "DeepSpeed hostfile: lines `hostname slots=N`")->capture_default_str();
  sub->add_option("-i,--include", o.include, "Hosts/slots to use: host1@host2:0,2");
  sub->add_option("-e,--exclude", o.exclude, "Hosts/slots to leave out: host2:0");
  sub->add_option("--num_nodes", o.num_nodes, "Use the first N hosts of the hostfile")->check(whole(1, INT32_MAX));
  sub->add_option("--num_gpus,--num_accelerators", o.num_gpus, "Use slots [0, G) on each host")
      ->check(whole(1, INT32_MAX));
  sub->add_option("--nproc,--nproc_per_node", o.nproc, "Run N ranks on this machine (no hostfile; torchrun's "
                  "--nproc_per_node): CPU processes, CUDA_VISIBLE_DEVICES untouched (a GPU command takes device "
                  "LOCAL_RANK)")->check(whole(1, INT32_MAX));
  sub->add_flag("--cpu", o.cpu, "Ranks are CPU processes: hostfile slots are rank counts, CUDA_VISIBLE_DEVICES untouched");
  sub->add_option("--master_addr", o.master_addr, "Rendezvous host (default 127.0.0.1 on one node, else the first host)");
  sub->add_option("--master_port", o.master_port, "Rendezvous port (default 29500, or a free one when a job on this "
                  "machine uses 29500); 0 picks a free one")->check(whole(0, 65535));
  sub->add_option("--run_id", o.run_id, "The job's identity, the same on every node (default: a new one); ranks "
                  "of another job reaching this job's port are refused");
  sub->add_option("--node_rank", o.node_rank, "This node's index (with --no_ssh or --world_info)")
      ->check(whole(0, INT32_MAX));
  sub->add_option("--world_info", o.world_info, "Set by a launcher that starts this node over ssh");
  sub->add_option("--launcher", cli->runner, "ssh (default), openmpi, mpich or slurm");
  sub->add_option("--launcher_args", o.launcher_args, "Extra arguments for mpirun/srun");
  sub->add_option("--ssh_port", o.ssh_port, "ssh port for remote nodes")->check(whole(1, 65535));
  sub->add_flag("--no_ssh", o.no_ssh, "Each node runs dscpp launch itself with --node_rank");
  sub->add_flag("--no_ssh_check", o.no_ssh_check, "Skip the passwordless-ssh check");
  sub->add_flag("--force_multi", o.force_multi, "Multi-node flow even for one host");
  sub->add_option("--enable_each_rank_log", o.each_rank_log_dir, "Write rank r's output to DIR/<time>_rank<r>.log");
  sub->add_flag("--exit_on_stdin_eof", o.exit_on_stdin_eof, "Stop when stdin closes (set on remote nodes)");
  sub->add_flag("--dry-run,--dry_run", o.dry_run, "Print the commands instead of running them");
  sub->add_option("--autotuning", cli->autotuning, "Autotune the train command instead of running it (tune), then "
                  "train with the best config (run): DeepSpeed's flag; `dscpp autotune --help` for the rest")
      ->check(CLI::IsMember({"tune", "run"}));
  sub->add_option("--kill_grace", o.kill_grace_s, "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str()->check(number(0));
  // Everything from the first positional word (or after --) is the program and its arguments, options included.
  sub->add_option("program", cli->program, "Program and arguments (after --), or a dscpp subcommand");
  sub->positionals_at_end();
  CLI::App* parent = &app;
  auto run = [sub, cli, parent]() -> int {
    if (!cli->autotuning.empty()) return launch_autotuning(*cli);
    launcher::LaunchOptions opts = cli->o;
    opts.runner = launcher::parse_runner(cli->runner);
    opts.program = cli->program;
    opts.self_exe = self_exe();
    // A dscpp subcommand name means this binary; anything else is a program looked up in PATH.
    bool is_subcommand = false;
    for (CLI::App* c : parent->get_subcommands({}))
      is_subcommand |= !opts.program.empty() && c->get_name() == opts.program[0] && c->get_name() != "launch";
    if (is_subcommand) {
      opts.program.insert(opts.program.begin(), opts.self_exe);
      if (error_locations()) opts.program.insert(opts.program.begin() + 1, "--debug");  // dscpp --debug launch
    }
    return launcher::launch(opts);
  };
  return {sub, run};
}

}  // namespace dscpp::cli
