// Throughput of the CPU block quantizer (qwZ's and qgZ's encode and decode) beside a copy of the
// same bytes, alternated round by round in one process: the medians and their ratio per case.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "bench_median.h"
#include "command_line.h"
#include "kernels/cpu/block_quantizer.h"
#include "precision/half_conversion.h"

namespace {

using zeroshard::DType;
using zeroshard::detail::QuantBits;

template <class Work>
double seconds_of(Work work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The copy every pass is held to: it reads what the pass reads and writes what it writes.
void copy_bytes(const std::vector<char>& from, std::vector<char>& to, std::size_t read,
                std::size_t written) {
  for (std::size_t done = 0; done < read; done += written) {
    std::memcpy(to.data(), from.data() + done, std::min(written, read - done));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t elements = 4194304;
  int rounds = 15;
  CLI::App app(
      "Times the CPU block quantizer's encode and decode (qwZ, qgZ) beside a memcpy of the bytes "
      "each pass reads, alternated round by round, and prints the medians and their ratio.",
      "zeroshard-quantizer-bench");
  app.add_option("--elements", elements, "Elements per pass")->check(CLI::Range(1, 1 << 30));
  app.add_option("--rounds", rounds, "Alternated rounds")->check(CLI::Range(1, 10000));
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  std::printf("%lld elements, %d alternated rounds, medians\n", static_cast<long long>(elements),
              rounds);
  std::printf("%-22s %12s %12s %8s\n", "case", "pass GB/s", "copy GB/s", "ratio");
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::vector<float> values(static_cast<std::size_t>(elements));
    for (std::int64_t i = 0; i < elements; ++i) {
      values[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(0.001 * i) * (1 + i % 7));
    }
    const std::size_t value_bytes = static_cast<std::size_t>(elements) * size_of(dtype);
    std::vector<char> data(value_bytes);
    zeroshard::detail::convert_from_float(values.data(), data.data(), dtype, elements);
    std::vector<char> decoded(value_bytes);
    for (const QuantBits bits : {QuantBits::kInt8, QuantBits::kInt4}) {
      const auto encoded_bytes =
          static_cast<std::size_t>(zeroshard::detail::quantized_bytes(elements, bits));
      std::vector<char> encoded(encoded_bytes);
      std::vector<char> scratch(value_bytes);
      std::vector<double> encode, decode, copy_in, copy_out;
      for (int round = 0; round < rounds; ++round) {
        encode.push_back(seconds_of([&] {
          zeroshard::detail::quantize_blocks(data.data(), dtype, elements, bits, encoded.data());
        }));
        copy_in.push_back(
            seconds_of([&] { copy_bytes(data, scratch, value_bytes, encoded_bytes); }));
        decode.push_back(seconds_of([&] {
          zeroshard::detail::dequantize_blocks(encoded.data(), bits, elements, decoded.data(),
                                               dtype);
        }));
        copy_out.push_back(
            seconds_of([&] { copy_bytes(encoded, scratch, encoded_bytes, value_bytes); }));
      }
      const double moved_in = static_cast<double>(value_bytes + encoded_bytes) / 1e9;
      const char* type = dtype == DType::kFloat32 ? "fp32" : "bf16";
      const char* width = bits == QuantBits::kInt8 ? "int8" : "int4";
      const auto line = [&](const char* what, const std::vector<double>& pass,
                            const std::vector<double>& copy) {
        const double p = zeroshard::bench::median(pass);
        const double c = zeroshard::bench::median(copy);
        char name[64];
        std::snprintf(name, sizeof name, "%s %s->%s", what, type, width);
        std::printf("%-22s %12.2f %12.2f %8.3f\n", name, moved_in / p, moved_in / c, c / p);
      };
      line("encode", encode, copy_in);
      line("decode", decode, copy_out);
    }
  }
  return 0;
}
