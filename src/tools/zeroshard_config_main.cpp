// zeroshard-config: checks a DeepSpeed-style JSON config the way the engine reads it and prints
// every key with its effective value, or the key reference of docs/config.md.
#include <charconv>
#include <cstring>
#include <iostream>
#include <string>

#include "tools/config_override_flags.h"
#include "zeroshard/config.h"
#include "zeroshard/error.h"

namespace {

constexpr int kBadConfig = 1;
constexpr int kBadCommandLine = 2;

int usage(const char* message) {
  std::cerr << "zeroshard-config: " << message << "\n"
            << "usage: zeroshard-config FILE [--world-size N] [override flags]\n"
            << "       zeroshard-config --reference\n"
            << "Prints FILE's resolved config as JSON on stdout and notices on stderr; exits 1 "
               "when FILE is unreadable or invalid.\n"
            << "--reference prints the key reference table of docs/config.md.\n"
            << zeroshard::tools::kOverrideFlagsHelp;
  return kBadCommandLine;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  int world_size = 1;
  zeroshard::ConfigOverrides overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    const std::string flag = argument.substr(0, argument.find('='));
    if (zeroshard::tools::is_override_flag(flag)) {
      std::string value;
      if (flag.size() < argument.size()) {
        value = argument.substr(flag.size() + 1);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return usage((flag + " needs a value").c_str());
      }
      try {
        zeroshard::tools::apply_override_flag(flag, value, overrides);
      } catch (const zeroshard::UsageError& error) {
        return usage(error.what());
      }
      continue;
    }
    if (argument == "--reference") {
      std::cout << zeroshard::config_reference_markdown();
      return 0;
    }
    if (argument == "--world-size") {
      if (i + 1 == argc) return usage("--world-size needs a value");
      const char* text = argv[++i];
      const char* end = text + std::strlen(text);
      auto [stop, error] = std::from_chars(text, end, world_size);
      if (error != std::errc() || stop != end || world_size < 1) {
        return usage(
            ("--world-size: expected a positive integer, got '" + std::string(text) + "'").c_str());
      }
    } else if (argument.starts_with("-") && argument != "-") {
      return usage(("unknown option '" + argument + "'").c_str());
    } else if (file.empty()) {
      file = argument;
    } else {
      return usage("give one config file");
    }
  }
  if (file.empty()) return usage("missing config file");

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
