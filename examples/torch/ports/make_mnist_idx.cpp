// Writes a synthetic MNIST into FOLDER in MNIST's IDX files (train-images-idx3-ubyte,
// train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), so that the ported
// examples read it through torch::data::datasets::MNIST unchanged where CI has no network:
// 60,000 and 10,000 images of 28 x 28 (the counts torch's reader insists on), each digit a bright
// bar at a row of its own over noise, the same bytes in every run.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "command_line.h"

namespace {

constexpr std::uint32_t kRows = 28, kColumns = 28;

// IDX stores its integers big-endian.
void put_u32(std::ofstream& out, std::uint32_t value) {
  const char bytes[4] = {static_cast<char>(value >> 24), static_cast<char>(value >> 16),
                         static_cast<char>(value >> 8), static_cast<char>(value)};
  out.write(bytes, 4);
}

// A linear congruential generator: the same bytes on every machine, unlike std's distributions.
struct Lcg {
  std::uint64_t state;
  std::uint8_t next() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint8_t>(state >> 56);
  }
};

bool write_split(const std::filesystem::path& folder, const std::string& prefix,
                 std::uint32_t count, std::uint64_t seed) {
  std::ofstream images(folder / (prefix + "-images-idx3-ubyte"), std::ios::binary);
  std::ofstream labels(folder / (prefix + "-labels-idx1-ubyte"), std::ios::binary);
  put_u32(images, 2051);
  put_u32(images, count);
  put_u32(images, kRows);
  put_u32(images, kColumns);
  put_u32(labels, 2049);
  put_u32(labels, count);
  Lcg random{seed};
  std::vector<char> pixels(kRows * kColumns);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint8_t digit = random.next() % 10;
    const std::uint32_t bar = 3 + 2 * digit;
    for (std::uint32_t row = 0; row < kRows; ++row) {
      for (std::uint32_t column = 0; column < kColumns; ++column) {
        const bool lit = row >= bar && row < bar + 3 && column >= 4 && column < 24;
        const std::uint8_t noise = random.next() / 4;
        pixels[row * kColumns + column] = static_cast<char>(lit ? 255 - noise : noise);
      }
    }
    images.write(pixels.data(), static_cast<std::streamsize>(pixels.size()));
    labels.put(static_cast<char>(digit));
  }
  return static_cast<bool>(images) && static_cast<bool>(labels);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> folder;
  if (const auto exit_code = zeroshard::cli::parse_files(
          argc, argv, "make_mnist_idx", "Writes a synthetic MNIST in IDX files into FOLDER.",
          "FOLDER", 1, folder)) {
    return *exit_code;
  }
  std::filesystem::create_directories(folder[0]);
  if (!write_split(folder[0], "train", 60000, 1) || !write_split(folder[0], "t10k", 10000, 2)) {
    std::fprintf(stderr, "make_mnist_idx: cannot write the IDX files into %s\n", folder[0].c_str());
    return 1;
  }
  return 0;
}
