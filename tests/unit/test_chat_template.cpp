// The chat-template interpreter (dscpp/inference/chat_template.h): the templates of tests/data/chat_templates/
// (ours, in the shapes of Llama 3, Mistral, ChatML / Qwen2 and Gemma) with the prompts written out by hand, every
// construct of the subset, jinja2's whitespace control, errors with line:column, raise_exception, and
// from_model_dir on a folder with tokenizer_config.json. tests/python/test_chat_template.py checks the same
// templates against jinja2 itself.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dscpp/inference/chat_template.h"

namespace {

using dscpp::inference::ChatTemplate;
using dscpp::inference::ChatTemplateError;
using nlohmann::json;
namespace fs = std::filesystem;

std::string R(const std::string& source, const json& messages = json::array(), bool generation_prompt = false,
              const json& extra = json::object()) {
  return ChatTemplate::parse(source).render(messages, generation_prompt, extra);
}

// The message of the ChatTemplateError that f throws ("" and a test failure when none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ChatTemplateError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ChatTemplateError";
  return "";
}

std::string file_template(const std::string& name) {
  std::ifstream f(std::string(DSCPP_SOURCE_DIR) + "/tests/data/chat_templates/" + name);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

json msg(const char* role, const char* content) { return {{"role", role}, {"content", content}}; }
const json kChat = json::array({msg("user", "Hello!"), msg("assistant", " Hi! "), msg("user", "Joke?")});
const json kTokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};

TEST(ChatTemplateModels, ChatMLAddsTheDefaultSystemTurnAndTheGenerationPrompt) {
  EXPECT_EQ(R(file_template("chatml.jinja"), kChat, true, kTokens),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\n Hi! <|im_end|>\n<|im_start|>user\nJoke?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateModels, Llama3TakesTheSystemMessageOutAndTrims) {
  json messages = kChat;
  messages.insert(messages.begin(), msg("system", " Be kind. "));
  json extra = kTokens;
  extra["date_string"] = "26 Jul 2024";
  const std::string system = "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                             "Today Date: 26 Jul 2024\n\n";
  EXPECT_EQ(R(file_template("llama3.jinja"), messages, true, extra),
            system + "Be kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>user"
                     "<|end_header_id|>\n\nJoke?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // No system message: an empty system turn; no generation prompt.
  EXPECT_EQ(R(file_template("llama3.jinja"), json::array({msg("user", "Hello!")}), false, extra),
            system + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>");
  // Without date_string the template asks strftime_now for today.
  char today[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(today, sizeof today, "%d %b %Y", &local);
  EXPECT_NE(R(file_template("llama3.jinja"), kChat, false, kTokens).find(std::string("Today Date: ") + today),
            std::string::npos);
}

TEST(ChatTemplateModels, MistralPutsTheSystemMessageInTheLastTurnAndRefusesNonAlternatingRoles) {
  json messages = kChat;
  messages.insert(messages.begin(), msg("system", "French."));
  EXPECT_EQ(R(file_template("mistral.jinja"), messages, false, kTokens),
            "<s>[INST] Hello![/INST] Hi!</s>[INST] French.\n\nJoke?[/INST]");
  // raise_exception's message comes as it is.
  EXPECT_EQ(error_of([&] { R(file_template("mistral.jinja"), json::array({msg("user", "a"), msg("user", "b")})); }),
            "Roles must alternate user/assistant/user/assistant after an optional system message!");
}

TEST(ChatTemplateModels, GemmaCallsTheAssistantModelAndRefusesASystemRole) {
  EXPECT_EQ(R(file_template("gemma.jinja"), kChat, true, kTokens),
            "<s><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>\n"
            "<start_of_turn>user\nJoke?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(error_of([&] { R(file_template("gemma.jinja"), json::array({msg("system", "s")})); }),
            "The system role is not supported");
}

TEST(ChatTemplateSyntax, WhitespaceControlAndTransformersEnvironment) {
  EXPECT_EQ(R("a  {{- 1 -}}  \n b"), "a1b");
  EXPECT_EQ(R("a  {{ 1 }}  b"), "a  1  b");
  EXPECT_EQ(R("{% if true %}\nx\n{% endif %}\ny"), "x\ny");               // trim_blocks
  EXPECT_EQ(R("  {% if true %}x{% endif %}"), "x");                        // lstrip_blocks
  EXPECT_EQ(R("a\n    {% if true %}\n    x\n    {% endif %}\nb"), "a\n    x\nb");
  EXPECT_EQ(R("  {{ 1 }}"), "  1");                                        // not for {{
  EXPECT_EQ(R("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");              // + opts out of both
  EXPECT_EQ(R("a {# note #}\nb  {#- note -#}  c"), "a bc");
  EXPECT_EQ(R("x\n"), "x");                                                // one trailing newline dropped
  EXPECT_EQ(R("x\r\ny\r\n\n"), "x\ny\n");
  EXPECT_EQ(R("a {% if true -%}   \n  b {%- endif %} c"), "a b c");
}

TEST(ChatTemplateSyntax, Literals) {
  EXPECT_EQ(R(R"({{ 'it\'s' }}|{{ "say \"hi\"" }}|{{ 'tab\there\nnew' }}|{{ "\u00e9\x41" }}|{{ 'a' "b" }}|{{ '\d' }})"),
            "it's|say \"hi\"|tab\there\nnew|\xc3\xa9" "A|ab|\\d");
  EXPECT_EQ(R("{{ 1 }} {{ 1.5 }} {{ 1e3 }} {{ 1_000 }} {{ true }} {{ False }} {{ none }} {{ [1, 'a', none] }} "
              "{{ {'k': \"it's\"} }} {{ (1, 2) }} {{ 1e-7 }} {{ 1e16 }} {{ 0.1 + 0.2 }}"),
            "1 1.5 1000.0 1000 True False None [1, 'a', None] {'k': \"it's\"} (1, 2) 1e-07 1e+16 0.30000000000000004");
}

TEST(ChatTemplateSyntax, Operators) {
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 - 4 }}"),
            "3 -4 1 2 3.5 1024 3");
  EXPECT_EQ(R("{{ 'a' + 'b' ~ 3 ~ none ~ nothing }} {{ [1] + [2] }} {{ 'ab' * 2 }}"), "ab3None [1, 2] abab");
  EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 2 >= 3 }} {{ 1 == 1.0 }} {{ 'a' != 'a' }} {{ [1, 2] == [1, 2] }}"),
            "True True False True False True");
  EXPECT_EQ(R("{{ 'ell' in 'hello' }} {{ 'z' not in ['a'] }} {{ 'k' in {'k': 1} }} {{ not true or false and true }}"),
            "True True True False");
  EXPECT_EQ(R("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ 'a' if false }}|{{ 'a' if 0 else 'b' }}"), "x y |b");
}

TEST(ChatTemplateSyntax, IndexingAttributesAndSlicing) {
  const json m = json::array({msg("system", "S"), msg("user", "U"), msg("assistant", "A")});
  EXPECT_EQ(R("{{ messages[0]['role'] }} {{ messages[1].content }} {{ messages[-1].role }} {{ messages[1:] | length }}"
              " {{ messages[5] is defined }} {{ messages[0].nope is defined }} {{ messages[0]['role'][1:3] }}",
              m),
            "system U assistant 2 False False ys");
  EXPECT_EQ(R("{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-2] }} {{ 'abcdef'[:-1] }} {{ [1, 2, 3][-2:] }} {{ 'h\xc3\xa9llo'[1] }}"),
            "bcd fdb abcde [2, 3] \xc3\xa9");
}

TEST(ChatTemplateSyntax, ForLoops) {
  const json m = json::array({msg("user", "a"), msg("assistant", "b"), msg("user", "c")});
  EXPECT_EQ(R("{% for x in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
              "{{ loop.length }}{{ x.content }};{% endfor %}",
              m),
            "10TrueFalse3a;21FalseFalse3b;32FalseTrue3c;");
  EXPECT_EQ(R("{% for x in messages if x.role == 'user' %}{{ loop.index }}{{ x.content }}{{ loop.length }}{% endfor %}",
              m),
            "1a22c2");
  EXPECT_EQ(R("{% for x in [] %}no{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }},{% endfor %}"), "a=1,b=2,");
  EXPECT_EQ(R("{% for c in 'ab' %}{{ c }}.{% endfor %}{% for k in {'x': 1} %}{{ k }}{% endfor %}"), "a.b.x");
  EXPECT_EQ(R("{% for x in nothing %}x{% endfor %}"), "");
}

TEST(ChatTemplateSyntax, IfSetNamespaceAndScopes) {
  EXPECT_EQ(R("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}"), "c");
  EXPECT_EQ(R("{% if none %}a{% else %}d{% endif %}"), "d");
  // A set inside a loop lives one iteration; inside an if, it changes the template's variable.
  EXPECT_EQ(R("{% set a = 0 %}{% for x in [1, 2] %}{{ a }}{% set a = x %}{{ a }},{% endfor %}{{ a }}"), "01,02,0");
  EXPECT_EQ(R("{% if true %}{% set c = 1 %}{% endif %}{{ c }}"), "1");
  EXPECT_EQ(R("{% set ns = namespace(n=0, s='') %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}"
              "{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}{% set ns2 = namespace() %}"
              "{% set ns2.found = true %}{{ ns2.found }}"),
            "6 123True");
  EXPECT_EQ(R("{% set messages = messages[1:] %}{{ messages | length }}", kChat), "2");
}

TEST(ChatTemplateSyntax, Macros) {
  EXPECT_EQ(R("{% set who = 'x' %}{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }} {{ who }}{% endmacro %}"
              "{% set who = 'y' %}{{ greet('Ann') }}|{{ greet('Bo', punct='?') }}|{{ greet(punct='.', name='Cy') }}"),
            "Hi Ann! y|Hi Bo? y|Hi Cy. y");
}

TEST(ChatTemplateSyntax, Filters) {
  EXPECT_EQ(R("{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ [1, 2] | length }}|{{ 'héllo' | length }}|"
              "{{ {'a': 1} | count }}"),
            "a b|a|2|5|1");
  EXPECT_EQ(R("{{ 'aB' | upper }} {{ 'aB' | lower }} {{ 'hello wORLD' | capitalize }} {{ 'hello world' | title }}"),
            "AB ab Hello world Hello World");
  EXPECT_EQ(R("{{ nothing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ nothing | d }}|"),
            "d  d |");
  EXPECT_EQ(R("{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ 12 | string ~ 'x' }}"
              " {{ [1, 'a'] | join(', ') }} {{ [] | first is defined }}"),
            "1 3 a 12x 1, a False");
  EXPECT_EQ(R("{{ {'a': 'é', 'b': [1, 2.5, none, true, {'c': 'q\"\\n'}]} | tojson }}"),
            "{\"a\": \"é\", \"b\": [1, 2.5, null, true, {\"c\": \"q\\\"\\n\"}]}");
  EXPECT_EQ(R("{{ {'a': [1], 'b': {}} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(R("{{ {'a': 1, 'b': 'x'} | items | list }}"), "[('a', 1), ('b', 'x')]");
  const json m = json::array({msg("user", "a"), msg("assistant", "b"), msg("user", "c")});
  EXPECT_EQ(R("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join }}"
              " {{ messages | rejectattr('role', 'eq', 'user') | list | length }} {{ [0, 1, 2] | select | list }}"
              " {{ [1, 2, 3] | reject('odd') | list }} {{ ['a', 'b'] | map('upper') | list }}",
              m),
            "ac 1 [1, 2] [2] ['A', 'B']");
  EXPECT_EQ(R("{{ 'a-b' | replace('-', '+') }} {{ '3' | int + 1 }} {{ -2 | abs }} {{ 'x' | safe }}"), "a+b 4 2 x");
}

TEST(ChatTemplateSyntax, Tests) {
  EXPECT_EQ(R("{{ x is defined }} {{ x is not defined }} {{ x is undefined }} {{ none is none }} {{ 0 is not none }}",
              json::array(), false, {{"x", 1}}),
            "True False False True True");
  EXPECT_EQ(R("{{ 'a' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is integer }} {{ true is boolean }}"
              " {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ 3 is odd }} {{ 4 is even }}"
              " {{ 9 is divisibleby 3 }} {{ 'u' is equalto 'u' }} {{ 'u' is in ['u'] }}"),
            "True False True False True True True True True True True True True");
}

TEST(ChatTemplateSyntax, StringAndDictMethods) {
  EXPECT_EQ(R("{{ '  x  '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a  '.rstrip() }}|{{ 'Hello'.startswith('He') }}"
              "|{{ 'Hello'.endswith(('lo', 'z')) }}|{{ 'a b  c'.split() }}|{{ 'a,b,,c'.split(',') }}"
              "|{{ 'a,b,c'.split(',', 1) }}|{{ 'MiX'.upper() }}{{ 'MiX'.lower() }}|{{ 'a-b'.replace('-', '') }}"),
            "x|a|a|True|True|['a', 'b', 'c']|['a', 'b', '', 'c']|['a', 'b,c']|MIXmix|ab");
  EXPECT_EQ(R("{% set d = {'k': 'v', 'n': 2} %}{{ d.get('k') }} {{ d.get('z') }} {{ d.get('z', 'fb') }}"
              "{% for k, v in d.items() %} {{ k }}={{ v }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list }}"),
            "v None fb k=v n=2 ['k', 'n'] ['v', 2]");
}

TEST(ChatTemplateSyntax, Globals) {
  EXPECT_EQ(R("{{ range(3) | list }} {{ range(1, 7, 2) | join(',') }} {{ dict(a=1)['a'] }}"), "[0, 1, 2] 1,3,5 1");
  char year[8];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(year, sizeof year, "%Y", &local);
  EXPECT_EQ(R("{{ strftime_now('%Y') }}"), year);
  EXPECT_EQ(R("{{ strftime_now is defined }} {{ raise_exception is defined }}"), "True True");
  EXPECT_EQ(error_of([] { R("{% if true %}{{ raise_exception('No ' ~ 'way') }}{% endif %}"); }), "No way");
}

TEST(ChatTemplateErrors, UnsupportedConstructsAreRefusedAtParseWithLineAndColumn) {
  const auto parse_error = [](const std::string& s) { return error_of([&] { ChatTemplate::parse(s); }); };
  EXPECT_EQ(parse_error("a\n  {{ x | wordwrap }}"), "chat template 2:10: unsupported filter 'wordwrap'");
  EXPECT_EQ(parse_error("{% include 'x' %}"), "chat template 1:4: unsupported statement '{% include %}'");
  EXPECT_EQ(parse_error("{{ foo(1) }}"),
            "chat template 1:4: unsupported function 'foo' (not a macro of this template nor one of range, dict, "
            "namespace, raise_exception, strftime_now)");
  EXPECT_EQ(parse_error("{{ x.append(1) }}"), "chat template 1:5: unsupported method '.append()'");
  EXPECT_EQ(parse_error("{{ x is divisible }}"), "chat template 1:9: unsupported test 'divisible'");
  EXPECT_EQ(parse_error("\n\n{% if x %}open"), "chat template 3:4: '{% if %}' is never closed");
  EXPECT_EQ(parse_error("{{ x "), "chat template 1:1: '{{' is never closed with '}}'");
  EXPECT_EQ(parse_error("{{ 'abc }}"), "chat template 1:4: string literal is never closed");
  EXPECT_EQ(parse_error("{# x"), "chat template 1:1: comment '{#' is never closed with '#}'");
  EXPECT_EQ(parse_error("{% endfor %}"), "chat template 1:4: '{% endfor %}' closes no open block");
  EXPECT_EQ(parse_error("{% set x %}y{% endset %}"),
            "chat template 1:10: unsupported: '{% set %}' blocks ('{% set x %}...{% endset %}'); expected '=', "
            "found '%}'");
  EXPECT_EQ(parse_error("{{ a ) }}"), "chat template 1:6: unexpected ')'");
  EXPECT_EQ(parse_error("{{ a $ b }}"), "chat template 1:6: unexpected character '$'");
  EXPECT_EQ(parse_error("{% for x in y recursive %}{% endfor %}"), "chat template 1:15: unsupported: recursive for loops");
  // A function a template calls is known once it defines the macro, wherever the definition is.
  EXPECT_EQ(R("{% macro m() %}m{% endmacro %}{{ m() }}"), "m");
}

TEST(ChatTemplateErrors, RenderErrorsNameTheExpression) {
  EXPECT_EQ(error_of([] { R("{{ 'a' }}\n  {{ 1 + 'a' }}"); }),
            "chat template 2:8: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of([] { R("{{ nothing.attr }}"); }), "chat template 1:11: 'nothing' is undefined");
  EXPECT_EQ(error_of([] { R("{{ 1 / 0 }}"); }), "chat template 1:6: division by zero");
  EXPECT_EQ(error_of([] { R("{{ 'abc'.get('x') }}"); }), "chat template 1:13: 'str' object has no method 'get'");
  EXPECT_EQ(error_of([] { R("{% set x = 1 %}{% set x.y = 2 %}"); }),
            "chat template 1:19: can only assign an attribute ('x.y') of a namespace()");
  EXPECT_EQ(error_of([] { R("{{ 1 < 'a' }}"); }), "chat template 1:6: '<' is not supported between 'int' and 'str'");
  EXPECT_EQ(error_of([] { ChatTemplate::parse("x").render(json::object(), false); }),
            "messages must be an array, got object");
}

class ChatTemplateModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dscpp_chat_template_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_config(const json& j) { std::ofstream(dir_ / "tokenizer_config.json") << j.dump(2); }
  fs::path dir_;
};

TEST_F(ChatTemplateModelDir, StringTemplateAndStringTokens) {
  write_config({{"chat_template", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"},
                {"bos_token", "<|begin|>"},
                {"eos_token", "<|end|>"}});
  const ChatTemplate t = ChatTemplate::from_model_dir(dir_.string());
  EXPECT_EQ(t.bos_token(), "<|begin|>");
  EXPECT_EQ(t.eos_token(), "<|end|>");
  EXPECT_EQ(t.render(kChat, false), "<|begin|>Hello!<|end|> Hi! <|end|>Joke?<|end|>");
  EXPECT_EQ(t.render(kChat, false, {{"bos_token", "B"}}), "BHello!<|end|> Hi! <|end|>Joke?<|end|>");
}

TEST_F(ChatTemplateModelDir, NamedTemplatesAndTokenObjects) {
  write_config({{"chat_template", json::array({{{"name", "tool_use"}, {"template", "tools"}},
                                               {{"name", "default"}, {"template", "{{ bos_token }}|{{ eos_token }}"}}})},
                {"bos_token", {{"content", "<bos>"}, {"lstrip", false}, {"__type", "AddedToken"}}},
                {"eos_token", {{"content", "<eos>"}, {"special", true}}}});
  const ChatTemplate t = ChatTemplate::from_model_dir(dir_.string());
  EXPECT_EQ(t.render(json::array(), false), "<bos>|<eos>");
  EXPECT_EQ(t.bos_token(), "<bos>");
}

TEST_F(ChatTemplateModelDir, MissingOrBadTemplatesNameTheFile) {
  const std::string file = (dir_ / "tokenizer_config.json").string();
  EXPECT_NE(error_of([&] { ChatTemplate::from_model_dir(dir_.string()); }).find(file + ": missing"), std::string::npos);
  write_config({{"bos_token", "<s>"}});
  EXPECT_NE(error_of([&] { ChatTemplate::from_model_dir(dir_.string()); }).find(file + ": no chat_template"),
            std::string::npos);
  write_config({{"chat_template", json::array({{{"name", "rag"}, {"template", "x"}}})}});
  EXPECT_EQ(error_of([&] { ChatTemplate::from_model_dir(dir_.string()); }),
            file + ": chat_template has no template named \"default\" (it has \"rag\")");
  write_config({{"chat_template", "{% include 'x' %}"}});
  EXPECT_EQ(error_of([&] { ChatTemplate::from_model_dir(dir_.string()); }),
            file + ": chat template 1:4: unsupported statement '{% include %}'");
  write_config({{"eos_token", "</s>"}});
  std::ofstream(dir_ / "chat_template.jinja") << "{{ eos_token }}\n";
  EXPECT_EQ(ChatTemplate::from_model_dir(dir_.string()).render(json::array(), false), "</s>");
}

}  // namespace
