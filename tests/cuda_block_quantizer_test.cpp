// The CUDA block quantizer of ZeRO++ against the CPU encoder: on the inputs of
// tests/block_quantizer_inputs.h, the encoded bytes, the count of non-finite blocks and every
// decoded value must be the same bits.
#include <gtest/gtest.h>

#if ZEROSHARD_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_selection.h"
#include "block_quantizer_inputs.h"
#include "kernels/cpu/block_quantizer.h"
#include "kernels/cuda/kernels.h"
#include "precision/half_conversion.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using cuda::DeviceBuffer;
using detail::QuantBits;

std::vector<std::uint8_t> download(const void* device, std::size_t bytes) {
  std::vector<std::uint8_t> host(bytes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

void upload(void* device, const void* host, std::size_t bytes) {
  ASSERT_EQ(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

// The index of the first differing byte, or -1.
std::int64_t first_difference(const std::vector<std::uint8_t>& a,
                              const std::vector<std::uint8_t>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(std::min(a.size(), b.size()));
}

using Case = quantizer_inputs::QuantizerCase;

class CudaBlockQuantizer : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
    }
  }
  QuantBits bits() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(CudaBlockQuantizer, EncodesAndDecodesBitForBitAsTheCpu) {
  for (const quantizer_inputs::QuantizerInput& input : quantizer_inputs::all_quantizer_inputs()) {
    SCOPED_TRACE(input.name);
    const auto count = static_cast<std::int64_t>(input.values.size());
    const std::size_t source_bytes = input.values.size() * size_of(dtype());
    std::vector<std::uint16_t> source(source_bytes / 2 + 1);
    detail::convert_from_float(input.values.data(), source.data(), dtype(), count);

    const auto encoded_bytes = static_cast<std::size_t>(detail::quantized_bytes(count, bits()));
    std::vector<std::uint8_t> cpu(encoded_bytes);
    const std::int64_t cpu_nonfinite =
        detail::quantize_blocks(source.data(), dtype(), count, bits(), cpu.data());

    // One element in, so that the source is not 16-byte aligned.
    const std::size_t element = size_of(dtype());
    DeviceBuffer device_source(source_bytes + element);
    DeviceBuffer device_encoded(encoded_bytes);
    DeviceBuffer counter(sizeof(int));
    auto* shifted_source = device_source.as<std::uint8_t>() + element;
    upload(shifted_source, source.data(), source_bytes);
    ASSERT_EQ(cudaMemset(counter.data(), 0, sizeof(int)), cudaSuccess);
    kernels::quantize_blocks(shifted_source, dtype(), count, bits(), device_encoded.data(),
                             counter.as<int>(), nullptr);
    const std::vector<std::uint8_t> gpu = download(device_encoded.data(), encoded_bytes);
    int gpu_nonfinite = 0;
    ASSERT_EQ(cudaMemcpy(&gpu_nonfinite, counter.data(), sizeof(int), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(gpu_nonfinite, cpu_nonfinite);
    EXPECT_EQ(first_difference(gpu, cpu), -1)
        << "first differing encoded byte (of " << encoded_bytes << ")";

    for (const DType out : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const std::size_t decoded_bytes = input.values.size() * size_of(out);
      std::vector<std::uint8_t> expected(decoded_bytes);
      detail::dequantize_blocks(cpu.data(), bits(), count, expected.data(), out);
      DeviceBuffer decoded(decoded_bytes);
      kernels::dequantize_blocks(device_encoded.data(), bits(), count, decoded.data(), out,
                                 nullptr);
      EXPECT_EQ(first_difference(download(decoded.data(), decoded_bytes), expected), -1)
          << "first differing decoded byte, decoding into " << to_string(out);
    }
  }
}

TEST_P(CudaBlockQuantizer, AddsNonFiniteBlocksToTheCounterWithoutClearingIt) {
  const std::vector<float> values = quantizer_inputs::nonfinite_inputs().front().values;
  const auto count = static_cast<std::int64_t>(values.size());
  std::vector<std::uint16_t> source(values.size() * size_of(dtype()) / 2 + 1);
  detail::convert_from_float(values.data(), source.data(), dtype(), count);
  DeviceBuffer device_source(values.size() * size_of(dtype()));
  DeviceBuffer encoded(static_cast<std::size_t>(detail::quantized_bytes(count, bits())));
  DeviceBuffer counter(sizeof(int));
  upload(device_source.data(), source.data(), device_source.bytes());
  const int start = 3;
  upload(counter.data(), &start, sizeof(int));
  for (int call = 0; call < 2; ++call) {
    kernels::quantize_blocks(device_source.data(), dtype(), count, bits(), encoded.data(),
                             counter.as<int>(), nullptr);
  }
  int total = 0;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&total, counter.data(), sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(total, start + 2 * 4);
}

INSTANTIATE_TEST_SUITE_P(BitsAndSources, CudaBlockQuantizer, quantizer_inputs::quantizer_cases(),
                         quantizer_inputs::quantizer_case_name);

TEST(CudaBlockQuantizerArguments, BadArgumentsAreUsageErrors) {
  int counter = 0;
  float dummy[2] = {};
  EXPECT_THROW(kernels::quantize_blocks(dummy, DType::kFloat32, -1, QuantBits::kInt8, dummy,
                                        &counter, nullptr),
               UsageError);
  EXPECT_THROW(kernels::quantize_blocks(dummy, DType::kFloat32, 1, QuantBits::kInt8, dummy, nullptr,
                                        nullptr),
               UsageError);
  EXPECT_THROW(
      kernels::quantize_blocks(dummy, DType::kFloat32, 1, QuantBits::kInt8,
                               reinterpret_cast<std::uint8_t*>(dummy) + 1, &counter, nullptr),
      UsageError);
  EXPECT_THROW(
      kernels::dequantize_blocks(dummy, QuantBits::kInt4, 1, dummy, DType::kFloat64, nullptr),
      UsageError);
}

}  // namespace
}  // namespace zeroshard

#else  // !ZEROSHARD_WITH_CUDA

TEST(CudaBlockQuantizer, NeedsTheCudaBackend) {
  GTEST_SKIP() << "zeroshard was built without CUDA (ZEROSHARD_CUDA=OFF or no nvcc found)";
}

#endif
