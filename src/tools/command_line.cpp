// CLI11's errors carry exit codes of their own (105, 109, ...); every zeroshard program exits 2
// for any of them, as it always has, and names itself in the message.
#include "tools/command_line.h"

#include <charconv>
#include <cmath>
#include <iostream>

namespace zeroshard::cli {

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& help) {
    return app.exit(help);  // prints the help on stdout; exit code 0
  } catch (const CLI::ParseError& error) {
    return bad_command_line(app.get_name(), error.what());
  }
}

int bad_command_line(const std::string& program, const std::string& problem) {
  std::cerr << program << ": " << problem << "\nRun with --help for more information.\n";
  return kBadCommandLine;
}

std::optional<int> parse_files(int argc, char** argv, const char* program, const char* description,
                               const char* names, std::size_t count,
                               std::vector<std::string>& files) {
  CLI::App app(description, program);
  CLI::Option* option = app.add_option("FILES", files, names)->type_name("")->required();
  if (count > 0) option->expected(static_cast<int>(count));
  return parse(app, argc, argv);
}

CLI::Validator integer_in(std::int64_t low, std::int64_t high) {
  const std::string expected =
      high == std::numeric_limits<std::int64_t>::max()
          ? (low == 1 ? "a positive integer" : "an integer >= " + std::to_string(low))
          : "an integer in " + std::to_string(low) + ".." + std::to_string(high);
  return CLI::Validator(
      [low, high, expected](std::string& text) -> std::string {
        std::int64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error != std::errc() || end != text.data() + text.size() || value < low ||
            value > high) {
          return "got '" + text + "', expected " + expected;
        }
        return {};
      },
      "");
}

CLI::Validator stage_digits() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (!text.empty() && text.find_first_not_of("0123") == std::string::npos) return {};
        return "got '" + text + "', expected digits 0-3";
      },
      "");
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
            !(value > 0.0)) {
          return "got '" + text + "', expected a positive number";
        }
        return {};
      },
      "");
}

}  // namespace zeroshard::cli
