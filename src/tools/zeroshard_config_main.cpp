// zeroshard-config: checks a DeepSpeed-style JSON config the way the engine reads it and prints
// every key with its effective value, or the key reference of docs/config.md.
#include <iostream>
#include <string>

#include "tools/command_line.h"
#include "tools/config_override_flags.h"
#include "zeroshard/config.h"
#include "zeroshard/error.h"

namespace {

constexpr int kBadConfig = 1;

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  int world_size = 1;
  bool reference = false;
  zeroshard::ConfigOverrides overrides;
  CLI::App app(
      "Prints FILE's resolved config as JSON on stdout and notices on stderr; exits 1 when FILE "
      "is unreadable or invalid, 2 for a bad command line.",
      "zeroshard-config");
  app.add_option("FILE", file, "a DeepSpeed-style JSON config");
  app.add_option("--world-size", world_size, "data-parallel ranks the batch sizes resolve for")
      ->type_name("N")
      ->check(zeroshard::cli::integer_in(1, 1 << 24))
      ->capture_default_str();
  app.add_flag("--reference", reference, "print the key reference table of docs/config.md");
  zeroshard::tools::add_override_flags(app, overrides);
  if (const auto exit_code = zeroshard::cli::parse(app, argc, argv)) return *exit_code;
  if (reference) {
    std::cout << zeroshard::config_reference_markdown();
    return 0;
  }
  if (file.empty())
    return zeroshard::cli::bad_command_line(app.get_name(), "missing config file FILE");

  try {
    zeroshard::Config config = zeroshard::Config::from_json_file(file, world_size, overrides);
    std::cout << config.resolved_json() << "\n";
    for (const std::string& notice : config.notices()) {
      std::cerr << "zeroshard-config: " << file << ": note: " << notice << "\n";
    }
  } catch (const zeroshard::Error& error) {
    std::cerr << "zeroshard-config: " << file << ": " << error.what() << "\n";
    return kBadConfig;
  }
  return 0;
}
