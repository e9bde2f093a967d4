// Byte-level text for the example GPT: files read whole, a vocabulary of the bytes they contain,
// a deterministic train/validation split, and the windows each rank trains and validates on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data_parallel_range.h"

namespace zeroshard::examples {

/// The licence texts Debian's base-files package installs (every regular file in
/// /usr/share/common-licenses, by name; the links to them are skipped), so every Debian machine
/// has the same corpus.
std::vector<std::string> default_text_files();

/// The files' bytes, concatenated in the given order, as token ids: the id of a byte is its rank
/// among the distinct bytes of the text. The text is cut into chunks of kChunkBytes; every
/// kValidationEvery-th chunk is held out for validation, the rest is the training stream.
class TextCorpus {
 public:
  static constexpr std::int64_t kChunkBytes = 2048;
  static constexpr std::int64_t kValidationEvery = 10;

  /// Throws IoError naming a file that cannot be read, UsageError when the text is too short to
  /// give both splits a window of `seq` + 1 tokens.
  TextCorpus(const std::vector<std::string>& files, int seq);

  int vocab() const noexcept { return static_cast<int>(symbols_.size()); }
  std::int64_t train_tokens() const noexcept { return static_cast<std::int64_t>(train_.size()); }
  std::int64_t validation_tokens() const noexcept {
    return static_cast<std::int64_t>(validation_.size());
  }
  /// The entropy of the training text's byte frequencies, in nats: the loss of the best model
  /// that ignores context, which a model that uses context must beat.
  double unigram_entropy() const noexcept { return unigram_entropy_; }

  /// Training sequence `index` of the stream `seed`: seq tokens from a position drawn from
  /// (seed, index) alone, and the seq tokens that follow each of them.
  void train_window(std::uint64_t seed, std::int64_t index, int* tokens, int* targets) const;
  /// Validation sequence `index` of `count`, spread evenly over the validation text.
  void validation_window(std::int64_t index, std::int64_t count, int* tokens, int* targets) const;

 private:
  void window(const std::vector<int>& stream, std::int64_t start, int* tokens, int* targets) const;

  int seq_;
  std::vector<unsigned char> symbols_;
  std::vector<int> train_;
  std::vector<int> validation_;
  double unigram_entropy_ = 0.0;
};

}  // namespace zeroshard::examples
