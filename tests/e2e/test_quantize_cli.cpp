// `dscpp quantize`, then the quantized folder in `dscpp generate` and `dscpp perplexity` with no flag, as a user runs
// them, on a tiny Llama with a tokenizer trained on made-up text: the folder's greedy text and perplexity equal
// those of quantizing the original as it loads (the quant config keys), and the CLI's refusals name the problem.
#include <gtest/gtest.h>

#include "cli_workspace.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/data/tokenizer.h"
#include "dscpp/kernels/ops.h"
#include "tiny_models.h"

using namespace dscpp;
using dscpp::test::run_command;
namespace fs = std::filesystem;

namespace {

// stdout only (the engine's start-up lines and timings go to stderr).
std::string run_stdout(const std::string& cmd, int* rc) { return run_command("{ " + cmd + " 2>/dev/null; }", rc); }

TEST(QuantizeCli, FolderLoadsLikeAnyModelAndMatchesQuantizingAtLoad) {
  test::CliWorkspace ws("quantize_cli");
  const std::string hf = (ws.dir / "hf").string(), q4 = (ws.dir / "q4").string(), bin = test::dscpp_binary();
  ModelConfig c = test_fixtures::tiny_model_config("llama");
  c.vocab_size = Tokenizer::load_hf(ws.tokenizer).vocab_size();
  c.max_seq_len = 128;
  auto model = make_model(c);
  model->init_weights(9);
  ops::scale_inplace(model->params().flat_params(), 4.0f);  // peaked logits: greedy decoding far from ties
  HfExportOptions eo;
  eo.tokenizer_json = test::read_text(ws.tokenizer);
  export_hf_model(*model, hf, eo);
  ws.write("hf/generation_config.json", R"({"eos_token_id": []})");
  const std::string int4 = ws.write("int4.json", R"({"quant": {"weight": {"num_bits": 4}},
      "dscpp": {"quantization": {"group_size": 16}},
      "state_manager": {"max_context": 128, "memory_config": {"mode": "allocate", "size": 8}}})");

  int rc = 0;
  std::string out = run_command(bin + " quantize --hf " + hf + " --out " + q4 + " --weights int4 --group 16", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("quantizing: 100%"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(fs::path(q4) / f)) << f;
  EXPECT_FALSE(fs::exists(q4 + ".tmp"));

  const std::string gen = " generate --greedy --max-tokens 24 --prompt 'the ship sails'";
  const std::string from_folder = run_stdout(bin + gen + " --hf " + q4, &rc);
  ASSERT_EQ(rc, 0) << from_folder;
  const std::string at_load = run_stdout(bin + gen + " --hf " + hf + " --config " + int4, &rc);
  ASSERT_EQ(rc, 0) << at_load;
  EXPECT_EQ(from_folder, at_load);
  EXPECT_GT(from_folder.size(), std::string("the ship sails\n").size()) << "nothing was generated";

  const std::string ppl = " perplexity --text " + (ws.dir / "corpus.txt").string() + " --window 32 --max-windows 8";
  const std::string ppl_folder = run_stdout(bin + ppl + " --hf " + q4, &rc);
  ASSERT_EQ(rc, 0) << ppl_folder;
  const std::string ppl_at_load = run_stdout(bin + ppl + " --hf " + hf + " --config " + int4, &rc);
  ASSERT_EQ(rc, 0) << ppl_at_load;
  const std::string ppl_dense = run_stdout(bin + ppl + " --hf " + hf, &rc);
  ASSERT_EQ(rc, 0) << ppl_dense;
  auto first_line = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  EXPECT_EQ(first_line(ppl_folder), first_line(ppl_at_load));
  EXPECT_NE(first_line(ppl_folder), first_line(ppl_dense)) << "int4 scored exactly as the f32 weights";
  EXPECT_NE(ppl_folder.find("perplexity "), std::string::npos) << ppl_folder;
  EXPECT_NE(ppl_folder.find("over 248 tokens (8 windows of 32"), std::string::npos) << ppl_folder;

  // AWQ scaling from a calibration text (Note [AWQ scaling]): the search's report, and a folder that scores.
  const std::string awq = (ws.dir / "awq").string();
  out = run_command(bin + " quantize --hf " + hf + " --out " + awq + " --weights int4 --group 16 --awq-calibration " +
                        (ws.dir / "corpus.txt").string() + " --awq-tokens 256 --awq-seq 64 --awq-grid 4", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("AWQ: calibrating on 256 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("linears scaled; their output error on the calibration rows"), std::string::npos) << out;
  const std::string ppl_awq = run_stdout(bin + ppl + " --hf " + awq, &rc);
  ASSERT_EQ(rc, 0) << ppl_awq;
  EXPECT_NE(ppl_awq.find("over 248 tokens"), std::string::npos) << ppl_awq;

  // fp8 (Note [fp8 matmul]): the folder generates and scores exactly as -q fp8 on the 16-bit folder.
  const std::string f8 = (ws.dir / "fp8").string();
  out = run_command(bin + " quantize --hf " + hf + " --out " + f8 + " --weights fp8", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("wrote " + f8 + ": fp8 weights"), std::string::npos) << out;
  EXPECT_EQ(run_stdout(bin + gen + " --hf " + f8, &rc), run_stdout(bin + gen + " --hf " + hf + " -q fp8", &rc));
  const std::string ppl_f8 = run_stdout(bin + ppl + " --hf " + f8, &rc);
  ASSERT_EQ(rc, 0) << ppl_f8;
  EXPECT_EQ(first_line(ppl_f8), first_line(run_stdout(bin + ppl + " --hf " + hf + " -q fp8", &rc)));
  EXPECT_NE(first_line(ppl_f8), first_line(ppl_dense)) << "fp8 scored exactly as the f32 weights";
  EXPECT_NE(ppl_f8.find("weights fp8"), std::string::npos) << ppl_f8;

  out = run_command(bin + gen + " --hf " + q4 + " --quantization int8", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("already quantized (int4 g16"), std::string::npos) << out;
  out = run_command(bin + " quantize --hf " + hf + " --out " + q4 + " --weights int8", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("already exists"), std::string::npos) << out;
  out = run_command(bin + " quantize --hf " + hf + " --out " + (ws.dir / "q3").string() + " --weights int4 --group 7",
                    &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--group 7: must be even"), std::string::npos) << out;
}

}  // namespace
