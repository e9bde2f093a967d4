// Reading, splitting and windowing the example GPT's text.
#include "text_data.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

constexpr const char* kLicenceFolder = "/usr/share/common-licenses";

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<std::string> default_text_files() {
  std::vector<std::string> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(kLicenceFolder, error)) {
    if (entry.is_regular_file() && !entry.is_symlink()) files.push_back(entry.path().string());
  }
  if (error) {
    throw IoError(std::string("cannot list ") + kLicenceFolder + ": " + error.message() +
                  " (Debian's base-files package installs it; or pass --data FILE...)");
  }
  std::sort(files.begin(), files.end());
  return files;
}

TextCorpus::TextCorpus(const std::vector<std::string>& files, int seq) : seq_(seq) {
  std::string text;
  for (const std::string& path : files) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw IoError("cannot read text file " + path);
    text.append(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  std::array<std::int64_t, 256> seen{};
  for (char ch : text) ++seen[static_cast<unsigned char>(ch)];
  std::array<int, 256> id{};
  for (int byte = 0; byte < 256; ++byte) {
    if (seen[static_cast<std::size_t>(byte)] == 0) continue;
    id[static_cast<std::size_t>(byte)] = static_cast<int>(symbols_.size());
    symbols_.push_back(static_cast<unsigned char>(byte));
  }
  std::vector<std::int64_t> train_counts(symbols_.size());
  for (std::size_t k = 0; k < text.size(); ++k) {
    const int token = id[static_cast<unsigned char>(text[k])];
    const bool held_out =
        (static_cast<std::int64_t>(k) / kChunkBytes) % kValidationEvery == kValidationEvery - 1;
    if (held_out) {
      validation_.push_back(token);
    } else {
      train_.push_back(token);
      ++train_counts[static_cast<std::size_t>(token)];
    }
  }
  const std::int64_t need = seq + 1;
  if (train_tokens() < need || validation_tokens() < need) {
    throw UsageError("the text (" + std::to_string(text.size()) + " bytes from " +
                     std::to_string(files.size()) + " file(s)) leaves " +
                     std::to_string(train_tokens()) + " training and " +
                     std::to_string(validation_tokens()) +
                     " validation tokens; both need at least seq + 1 = " + std::to_string(need) +
                     ": give more text or a shorter --seq-len");
  }
  for (std::int64_t count : train_counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / static_cast<double>(train_.size());
    unigram_entropy_ -= p * std::log(p);
  }
}

void TextCorpus::window(const std::vector<int>& stream, std::int64_t start, int* tokens,
                        int* targets) const {
  std::copy_n(stream.begin() + start, seq_, tokens);
  std::copy_n(stream.begin() + start + 1, seq_, targets);
}

void TextCorpus::train_window(std::uint64_t seed, std::int64_t index, int* tokens,
                              int* targets) const {
  const std::uint64_t positions = static_cast<std::uint64_t>(train_tokens() - seq_);
  const std::uint64_t draw = mix(seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(index));
  window(train_, static_cast<std::int64_t>(draw % positions), tokens, targets);
}

void TextCorpus::validation_window(std::int64_t index, std::int64_t count, int* tokens,
                                   int* targets) const {
  const std::int64_t last_start = validation_tokens() - seq_ - 1;
  const std::int64_t start = count <= 1 ? 0 : index * last_start / (count - 1);
  window(validation_, start, tokens, targets);
}

}  // namespace zeroshard::examples
