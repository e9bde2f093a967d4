// The command line of every zeroshard program, read with CLI11: one exit-code contract (0 after
// --help, 2 for a bad command line, with a message naming the flag) and the value checks the
// programs share.
#pragma once

#include <CLI/CLI.hpp>  // CLI::App, CLI::Option, CLI::Validator, CLI::ValidationError
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zeroshard::cli {

/// main()'s exit code for a command line it cannot use.
inline constexpr int kBadCommandLine = 2;

/// Reads `argv` into `app`. Returns main()'s exit code when the program should stop now: 0 after
/// printing --help on stdout, kBadCommandLine after printing "NAME: problem" on stderr; nothing
/// when the program goes on.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

/// Reports a problem that `program` found in its parsed command line as parse() reports its
/// own; returns kBadCommandLine.
int bad_command_line(const std::string& program, const std::string& problem);

/// The command line of a program that takes file names only: reads them into `files`, exactly
/// `count` of them (at least one when `count` is 0), shown as `names` in --help; returns as
/// parse() does.
std::optional<int> parse_files(int argc, char** argv, const char* program, const char* description,
                               const char* names, std::size_t count,
                               std::vector<std::string>& files);

/// A whole number in [low, high]; otherwise "--flag: got 'x', expected an integer >= low" (or
/// "in low..high").
CLI::Validator integer_in(std::int64_t low,
                          std::int64_t high = std::numeric_limits<std::int64_t>::max());

/// ZeRO stages as digits ("0123", "13"); otherwise "--flag: got 'x', expected digits 0-3".
CLI::Validator stage_digits();

/// A finite number > 0; otherwise "--flag: got 'x', expected a positive number".
CLI::Validator positive_number();

/// Adds option `flag`, a whole number in [low, high] stored into `target` (one that does not fit
/// `Integer` is refused too).
template <class Integer>
CLI::Option* add_integer(CLI::App& app, const std::string& flag, Integer& target,
                         const std::string& description, std::int64_t low = 1,
                         std::int64_t high = std::numeric_limits<std::int64_t>::max()) {
  return app.add_option(flag, target, description)->check(integer_in(low, high));
}

/// Adds option `name` whose text `read(text)` stores, rejecting a bad value by throwing an
/// exception whose message already names the flag (as zeroshard::UsageError's do); the message
/// is reported unchanged.
template <class Read>
CLI::Option* add_read_option(CLI::App& app, const std::string& name, Read read,
                             const std::string& description) {
  return app.add_option_function<std::string>(
      name,
      [read = std::move(read)](const std::string& text) {
        try {
          read(text);
        } catch (const CLI::Error&) {
          throw;
        } catch (const std::exception& error) {
          throw CLI::ValidationError(error.what());
        }
      },
      description);
}

}  // namespace zeroshard::cli
