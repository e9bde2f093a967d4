// The CUDA kernels against their plain CPU references (tests/kernel_reference.h), on sizes and
// start offsets that exercise the vector body, the scalar head and tail, and the all-scalar path.
#include <gtest/gtest.h>

#if ZEROSHARD_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_selection.h"
#include "kernel_reference.h"
#include "kernels/cuda/kernels.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using cuda::DeviceBuffer;

// Elements of T on the device starting `offset` elements into an allocation, so that tests can
// place arrays at starts that are not 16-byte aligned.
template <class T>
class DeviceArray {
 public:
  DeviceArray(const std::vector<T>& host, std::int64_t offset)
      : buffer_((host.size() + static_cast<std::size_t>(offset)) * sizeof(T)),
        data_(buffer_.as<T>() + offset),
        count_(host.size()) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  T* get() const { return data_; }

  std::vector<T> download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  DeviceBuffer buffer_;
  T* data_;
  std::size_t count_;
};

std::vector<float> random_floats(std::size_t count, unsigned seed, float low = -1.0f,
                                 float high = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

// Within 1e-6 relative (with a floor of 1e-8 absolute for values that cancel towards zero).
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size() && reported < 10; ++i) {
    const float tolerance = 1e-6f * std::max(std::abs(want[i]), 1e-2f);
    if (got[i] == want[i] || std::abs(got[i] - want[i]) <= tolerance) continue;
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    ADD_FAILURE() << what << "[" << i << "]: kernel " << got[i] << ", reference " << want[i];
    ++reported;
  }
}

// (element count, start offset of the parameter and state arrays, start offset of the gradient)
using Shape = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

class CudaUpdateRule : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
    }
    std::tie(count_, offset_, grad_offset_) = GetParam();
  }

  std::size_t count() const { return static_cast<std::size_t>(count_); }
  DeviceArray<float> device(const std::vector<float>& host) const {
    return DeviceArray<float>(host, offset_);
  }
  DeviceArray<float> device_grad(const std::vector<float>& host) const {
    return DeviceArray<float>(host, grad_offset_);
  }

  static constexpr int kSteps = 3;
  std::int64_t count_ = 0;
  std::int64_t offset_ = 0;
  std::int64_t grad_offset_ = 0;
};

StepContext context_for(std::int64_t step, double lr, double weight_decay) {
  StepContext context;
  context.step = step;
  context.lr = lr;
  context.weight_decay = weight_decay;
  return context;
}

TEST_P(CudaUpdateRule, AdamWMatchesCpuReference) {
  for (bool amsgrad : {false, true}) {
    AdamWOptions options;
    options.amsgrad = amsgrad;
    std::vector<float> param = random_floats(count(), 1);
    std::vector<float> m(count(), 0.0f), v(count(), 0.0f), v_max(count(), 0.0f);
    DeviceArray<float> d_param = device(param), d_m = device(m), d_v = device(v),
                       d_v_max = device(v_max);
    for (std::int64_t step = 1; step <= kSteps; ++step) {
      const std::vector<float> grad = random_floats(count(), 100 + static_cast<unsigned>(step));
      DeviceArray<float> d_grad = device_grad(grad);
      const StepContext context = context_for(step, 1e-3, 0.01);
      kernels::adamw_step(d_param.get(), d_grad.get(), d_m.get(), d_v.get(),
                          amsgrad ? d_v_max.get() : nullptr, count_, options, context, nullptr);
      reference::adamw_step(param, grad, m, v, v_max, options, context);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    const std::string label = amsgrad ? "amsgrad " : "";
    expect_close(d_param.download(), param, label + "param");
    expect_close(d_m.download(), m, label + "exp_avg");
    expect_close(d_v.download(), v, label + "exp_avg_sq");
    if (amsgrad) expect_close(d_v_max.download(), v_max, label + "max_exp_avg_sq");
  }
}

TEST_P(CudaUpdateRule, AdamWithL2DecayAndCycledBeta1MatchesCpuReference) {
  for (bool amsgrad : {false, true}) {
    AdamOptions options;
    options.amsgrad = amsgrad;
    std::vector<float> param = random_floats(count(), 2);
    std::vector<float> m(count(), 0.0f), v(count(), 0.0f), v_max(count(), 0.0f);
    DeviceArray<float> d_param = device(param), d_m = device(m), d_v = device(v),
                       d_v_max = device(v_max);
    for (std::int64_t step = 1; step <= kSteps; ++step) {
      const std::vector<float> grad = random_floats(count(), 200 + static_cast<unsigned>(step));
      DeviceArray<float> d_grad = device_grad(grad);
      StepContext context = context_for(step, 2e-3, 0.1);
      context.momentum = 0.85 + 0.01 * static_cast<double>(step);
      kernels::adam_step(d_param.get(), d_grad.get(), d_m.get(), d_v.get(),
                         amsgrad ? d_v_max.get() : nullptr, count_, options, context, nullptr);
      reference::adam_step(param, grad, m, v, v_max, options, context);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    const std::string label = amsgrad ? "amsgrad " : "";
    expect_close(d_param.download(), param, label + "param");
    expect_close(d_m.download(), m, label + "exp_avg");
    expect_close(d_v.download(), v, label + "exp_avg_sq");
    if (amsgrad) expect_close(d_v_max.download(), v_max, label + "max_exp_avg_sq");
  }
}

TEST_P(CudaUpdateRule, SgdMatchesCpuReferenceWithAndWithoutMomentum) {
  struct Variant {
    double momentum;
    double dampening;
    bool nesterov;
  };
  for (const Variant variant :
       {Variant{0.0, 0.0, false}, Variant{0.9, 0.1, false}, Variant{0.9, 0.0, true}}) {
    SgdOptions options;
    options.momentum = variant.momentum;
    options.dampening = variant.dampening;
    options.nesterov = variant.nesterov;
    std::vector<float> param = random_floats(count(), 3);
    std::vector<float> buffer(count(), 0.0f);
    DeviceArray<float> d_param = device(param), d_buffer = device(buffer);
    for (std::int64_t step = 1; step <= kSteps; ++step) {
      const std::vector<float> grad = random_floats(count(), 300 + static_cast<unsigned>(step));
      DeviceArray<float> d_grad = device_grad(grad);
      const StepContext context = context_for(step, 0.1, 1e-4);
      kernels::sgd_step(d_param.get(), d_grad.get(),
                        variant.momentum != 0.0 ? d_buffer.get() : nullptr, count_, options,
                        context, nullptr);
      reference::sgd_step(param, grad, buffer, options, context);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    const std::string label =
        "momentum " + std::to_string(variant.momentum) + (variant.nesterov ? " nesterov " : " ");
    expect_close(d_param.download(), param, label + "param");
    if (variant.momentum != 0.0) expect_close(d_buffer.download(), buffer, label + "buffer");
  }
}

TEST_P(CudaUpdateRule, LionMatchesCpuReference) {
  LionOptions options;
  std::vector<float> param = random_floats(count(), 4);
  std::vector<float> m(count(), 0.0f);
  DeviceArray<float> d_param = device(param), d_m = device(m);
  for (std::int64_t step = 1; step <= kSteps; ++step) {
    const std::vector<float> grad = random_floats(count(), 400 + static_cast<unsigned>(step));
    DeviceArray<float> d_grad = device_grad(grad);
    const StepContext context = context_for(step, 1e-4, 0.1);
    kernels::lion_step(d_param.get(), d_grad.get(), d_m.get(), count_, options, context, nullptr);
    reference::lion_step(param, grad, m, options, context);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  expect_close(d_param.download(), param, "param");
  expect_close(d_m.download(), m, "exp_avg");
}

TEST_P(CudaUpdateRule, AdagradMatchesCpuReferenceWithDecayAndInitialAccumulator) {
  AdagradOptions options;
  options.lr_decay = 0.01;
  options.initial_accumulator_value = 0.1;
  std::vector<float> param = random_floats(count(), 5);
  std::vector<float> sum(count(), 0.0f);
  DeviceArray<float> d_param = device(param), d_sum = device(sum);
  for (std::int64_t step = 1; step <= kSteps; ++step) {
    const std::vector<float> grad = random_floats(count(), 500 + static_cast<unsigned>(step));
    DeviceArray<float> d_grad = device_grad(grad);
    const StepContext context = context_for(step, 1e-2, 0.01);
    kernels::adagrad_step(d_param.get(), d_grad.get(), d_sum.get(), count_, options, context,
                          nullptr);
    reference::adagrad_step(param, grad, sum, options, context);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  expect_close(d_param.download(), param, "param");
  expect_close(d_sum.download(), sum, "state_sum");
}

// Offsets (1, 1): every array starts 4 bytes past 16-byte alignment, so a scalar head aligns
// them. Offsets (0, 1): the gradient's misalignment differs, so every element takes the scalar
// path.
INSTANTIATE_TEST_SUITE_P(SizesAndAlignments, CudaUpdateRule,
                         ::testing::Values(Shape{1, 0, 0}, Shape{3, 0, 0}, Shape{1001, 0, 0},
                                           Shape{(1 << 20) + 5, 0, 0}, Shape{1, 1, 1},
                                           Shape{3, 1, 1}, Shape{1001, 3, 3},
                                           Shape{(1 << 20) + 5, 1, 1}, Shape{1001, 0, 1},
                                           Shape{(1 << 20) + 5, 0, 2}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_at" +
                                  std::to_string(std::get<1>(info.param)) + "_grad_at" +
                                  std::to_string(std::get<2>(info.param));
                         });

// --- precision casts, non-finite check, sum of squares ----------------------------------------

class CudaPrecisionKernels : public ::testing::TestWithParam<std::tuple<std::int64_t, DType>> {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
    }
    std::tie(count_, dtype_) = GetParam();
  }

  // Random values over many binades plus the cases rounding gets wrong: ties, fp16 overflow,
  // fp16 subnormals, signed zeros, inf and NaN.
  std::vector<float> awkward_floats() const {
    std::vector<float> values = random_floats(static_cast<std::size_t>(count_), 7);
    std::mt19937 generator(8);
    std::uniform_int_distribution<int> exponent(-30, 20);
    for (float& value : values) value = std::ldexp(value, exponent(generator));
    const float specials[] = {0.0f,
                              -0.0f,
                              1.0f + std::ldexp(1.0f, -11),      // fp16 tie, rounds to even (down)
                              1.0f + 3 * std::ldexp(1.0f, -11),  // fp16 tie, rounds up
                              1.0f + std::ldexp(1.0f, -8),       // bf16 tie
                              65504.0f,
                              65519.0f,
                              65520.0f,  // rounds to inf in fp16
                              std::ldexp(1.0f, -24),
                              std::ldexp(1.5f, -25),
                              std::ldexp(1.0f, -26),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              3.0e38f};
    for (std::size_t i = 0; i < std::size(specials) && i < values.size(); ++i) {
      values[i * values.size() / std::size(specials)] = specials[i];
    }
    return values;
  }

  std::int64_t count_ = 0;
  DType dtype_ = DType::kFloat32;
};

std::vector<std::uint16_t> to_16_bit(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    bits[i] = dtype == DType::kFloat16 ? reference::float_to_half(values[i])
                                       : reference::float_to_bfloat16(values[i]);
  }
  return bits;
}

float from_16_bit(std::uint16_t bits, DType dtype) {
  return dtype == DType::kFloat16 ? reference::half_to_float(bits)
                                  : reference::bfloat16_to_float(bits);
}

TEST_P(CudaPrecisionKernels, CastFromFloatRoundsToNearestEvenBitForBit) {
  if (dtype_ == DType::kFloat32) GTEST_SKIP() << "fp32 to fp32 is a plain copy";
  const std::vector<float> values = awkward_floats();
  DeviceArray<float> in(values, 1);
  DeviceArray<std::uint16_t> out(std::vector<std::uint16_t>(values.size()), 1);
  kernels::cast_from_float(in.get(), out.get(), dtype_, count_, nullptr);
  const std::vector<std::uint16_t> got = out.download();
  const std::vector<std::uint16_t> want = to_16_bit(values, dtype_);
  int reported = 0;
  for (std::size_t i = 0; i < got.size() && reported < 10; ++i) {
    const bool both_nan = std::isnan(from_16_bit(got[i], dtype_)) && std::isnan(values[i]);
    if (got[i] == want[i] || both_nan) continue;
    ADD_FAILURE() << "element " << i << " = " << values[i] << ": kernel 0x" << std::hex << got[i]
                  << ", reference 0x" << want[i] << std::dec;
    ++reported;
  }
}

TEST_P(CudaPrecisionKernels, CastToFloatScaledUnscalesAndFlagsOverflow) {
  const float multiplier = 1.0f / 1024.0f;
  std::vector<float> values = random_floats(static_cast<std::size_t>(count_), 9, -100.0f, 100.0f);
  std::vector<float> want(values.size());
  int clean_flag = 0;
  int dirty_flag = 0;
  for (bool with_inf : {false, true}) {
    if (with_inf) values[values.size() - 1] = std::numeric_limits<float>::infinity();
    std::vector<float> got;
    int flag = 0;
    DeviceArray<int> d_flag(std::vector<int>{0}, 0);
    if (dtype_ == DType::kFloat32) {
      DeviceArray<float> in(values, 1);
      DeviceArray<float> out(std::vector<float>(values.size()), 1);
      kernels::cast_to_float_scaled(in.get(), dtype_, out.get(), count_, multiplier, d_flag.get(),
                                    nullptr);
      got = out.download();
      for (std::size_t i = 0; i < values.size(); ++i) want[i] = values[i] * multiplier;
    } else {
      const std::vector<std::uint16_t> bits = to_16_bit(values, dtype_);
      DeviceArray<std::uint16_t> in(bits, 1);
      DeviceArray<float> out(std::vector<float>(values.size()), 1);
      kernels::cast_to_float_scaled(in.get(), dtype_, out.get(), count_, multiplier, d_flag.get(),
                                    nullptr);
      got = out.download();
      for (std::size_t i = 0; i < values.size(); ++i) {
        want[i] = from_16_bit(bits[i], dtype_) * multiplier;
      }
    }
    flag = d_flag.download()[0];
    expect_close(got, want, with_inf ? "with inf" : "finite");
    (with_inf ? dirty_flag : clean_flag) = flag;
  }
  EXPECT_EQ(clean_flag, 0);
  EXPECT_EQ(dirty_flag, 1);
}

TEST_P(CudaPrecisionKernels, CastToFloatScaledWorksInPlaceForFp32) {
  if (dtype_ != DType::kFloat32) GTEST_SKIP() << "in place only for fp32";
  const std::vector<float> values = random_floats(static_cast<std::size_t>(count_), 10);
  DeviceArray<float> data(values, 1);
  kernels::cast_to_float_scaled(data.get(), dtype_, data.get(), count_, 0.5f, nullptr, nullptr);
  std::vector<float> want(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) want[i] = values[i] * 0.5f;
  expect_close(data.download(), want, "in place");
}

TEST_P(CudaPrecisionKernels, NonfiniteCheckFindsInfAndNanAnywhereAndNothingElse) {
  const std::vector<float> finite =
      random_floats(static_cast<std::size_t>(count_), 11, -1e4f, 1e4f);
  const float bad_values[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
  const std::size_t n = finite.size();
  std::vector<std::size_t> positions = {0, n / 2, n - 1};
  auto run = [&](const std::vector<float>& values) {
    DeviceArray<int> flag(std::vector<int>{0}, 0);
    if (dtype_ == DType::kFloat32) {
      DeviceArray<float> data(values, 1);
      kernels::check_nonfinite(data.get(), dtype_, count_, flag.get(), nullptr);
      return flag.download()[0];
    }
    DeviceArray<std::uint16_t> data(to_16_bit(values, dtype_), 1);
    kernels::check_nonfinite(data.get(), dtype_, count_, flag.get(), nullptr);
    return flag.download()[0];
  };
  EXPECT_EQ(run(finite), 0) << "finite data";
  for (std::size_t position : positions) {
    for (float bad : bad_values) {
      std::vector<float> values = finite;
      values[position] = bad;
      EXPECT_EQ(run(values), 1) << bad << " at " << position << " of " << n;
    }
  }
}

TEST_P(CudaPrecisionKernels, SumOfSquaresMatchesDoubleReference) {
  const std::vector<float> values =
      random_floats(static_cast<std::size_t>(count_), 12, -3.0f, 3.0f);
  double want = 0.0;
  DeviceArray<double> result(std::vector<double>{-1.0}, 0);
  DeviceBuffer workspace(kernels::sum_of_squares_workspace_bytes(dtype_, count_));
  if (dtype_ == DType::kFloat32) {
    for (float value : values) want += static_cast<double>(value) * value;
    DeviceArray<float> data(values, 1);
    kernels::sum_of_squares(data.get(), dtype_, count_, result.get(), workspace.data(),
                            workspace.bytes(), nullptr);
    const double got = result.download()[0];
    EXPECT_NEAR(got, want, 1e-9 * want);
  } else {
    const std::vector<std::uint16_t> bits = to_16_bit(values, dtype_);
    for (std::uint16_t b : bits) {
      const double value = from_16_bit(b, dtype_);
      want += value * value;
    }
    DeviceArray<std::uint16_t> data(bits, 1);
    kernels::sum_of_squares(data.get(), dtype_, count_, result.get(), workspace.data(),
                            workspace.bytes(), nullptr);
    const double got = result.download()[0];
    EXPECT_NEAR(got, want, 1e-9 * want);
  }
}

// Values of any dtype on the device, one element past an aligned start.
class TypedDeviceArray {
 public:
  TypedDeviceArray(const std::vector<float>& values, DType dtype)
      : dtype_(dtype),
        buffer_((values.size() + 1) * size_of(dtype)),
        data_(static_cast<char*>(buffer_.data()) + size_of(dtype)),
        count_(values.size()) {
    if (dtype == DType::kFloat32) {
      EXPECT_EQ(cudaMemcpy(data_, values.data(), count_ * 4, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      const std::vector<std::uint16_t> bits = to_16_bit(values, dtype);
      EXPECT_EQ(cudaMemcpy(data_, bits.data(), count_ * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }

  void* get() const { return data_; }

  std::vector<float> download() const {
    std::vector<float> values(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (dtype_ == DType::kFloat32) {
      EXPECT_EQ(cudaMemcpy(values.data(), data_, count_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      return values;
    }
    std::vector<std::uint16_t> bits(count_);
    EXPECT_EQ(cudaMemcpy(bits.data(), data_, count_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (std::size_t i = 0; i < count_; ++i) values[i] = from_16_bit(bits[i], dtype_);
    return values;
  }

 private:
  DType dtype_;
  DeviceBuffer buffer_;
  char* data_;
  std::size_t count_;
};

// What a value becomes when stored in `dtype`.
float round_to(float value, DType dtype) {
  if (dtype == DType::kFloat32) return value;
  return from_16_bit(to_16_bit({value}, dtype)[0], dtype);
}

TEST_P(CudaPrecisionKernels, AccumulateAddsInFloatAndRoundsOnceFromEverySourceType) {
  const std::vector<float> sums = random_floats(static_cast<std::size_t>(count_), 13, -8.0f, 8.0f);
  const std::vector<float> addends =
      random_floats(static_cast<std::size_t>(count_), 14, -8.0f, 8.0f);
  for (DType source_dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    TypedDeviceArray destination(sums, dtype_);
    const TypedDeviceArray source(addends, source_dtype);
    kernels::accumulate(destination.get(), dtype_, source.get(), source_dtype, count_, nullptr);
    std::vector<float> want(sums.size());
    for (std::size_t i = 0; i < sums.size(); ++i) {
      want[i] = round_to(round_to(sums[i], dtype_) + round_to(addends[i], source_dtype), dtype_);
    }
    EXPECT_EQ(destination.download(), want) << "source " << to_string(source_dtype);
  }
}

TEST_P(CudaPrecisionKernels, ScaleInPlaceMultipliesInFloatAndRoundsOnce) {
  const std::vector<float> values =
      random_floats(static_cast<std::size_t>(count_), 15, -100.0f, 100.0f);
  TypedDeviceArray data(values, dtype_);
  kernels::scale_in_place(data.get(), dtype_, count_, 0.3f, nullptr);
  std::vector<float> want(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    want[i] = round_to(round_to(values[i], dtype_) * 0.3f, dtype_);
  }
  EXPECT_EQ(data.download(), want);
}

std::string precision_case_name(
    const ::testing::TestParamInfo<std::tuple<std::int64_t, DType>>& info) {
  const DType dtype = std::get<1>(info.param);
  const char* type = dtype == DType::kFloat32 ? "fp32" : dtype == DType::kFloat16 ? "fp16" : "bf16";
  return "n" + std::to_string(std::get<0>(info.param)) + "_" + type;
}

INSTANTIATE_TEST_SUITE_P(SizesAndTypes, CudaPrecisionKernels,
                         ::testing::Combine(::testing::Values(1, 3, 1001, (1 << 20) + 5),
                                            ::testing::Values(DType::kFloat32, DType::kFloat16,
                                                              DType::kBFloat16)),
                         precision_case_name);

// --- argument checks: these throw before touching the device, so they run without a GPU ------

TEST(CudaKernelArguments, AmsgradWithoutMaxStateIsAUsageError) {
  float dummy = 0.0f;
  AdamWOptions options;
  options.amsgrad = true;
  EXPECT_THROW(kernels::adamw_step(&dummy, &dummy, &dummy, &dummy, nullptr, 1, options,
                                   StepContext{}, nullptr),
               UsageError);
}

TEST(CudaKernelArguments, StepZeroIsAUsageError) {
  float dummy = 0.0f;
  StepContext context;
  context.step = 0;
  EXPECT_THROW(kernels::adam_step(&dummy, &dummy, &dummy, &dummy, nullptr, 1, AdamOptions{},
                                  context, nullptr),
               UsageError);
}

TEST(CudaKernelArguments, SgdMomentumWithoutBufferIsAUsageError) {
  float dummy = 0.0f;
  SgdOptions options;
  options.momentum = 0.9;
  EXPECT_THROW(kernels::sgd_step(&dummy, &dummy, nullptr, 1, options, StepContext{}, nullptr),
               UsageError);
}

TEST(CudaKernelArguments, NegativeCountIsAUsageError) {
  EXPECT_THROW(kernels::check_nonfinite(nullptr, DType::kFloat32, -1, nullptr, nullptr),
               UsageError);
}

}  // namespace
}  // namespace zeroshard

#else  // !ZEROSHARD_WITH_CUDA

TEST(CudaKernels, NeedTheCudaBackend) {
  GTEST_SKIP() << "zeroshard was built without CUDA (ZEROSHARD_CUDA=OFF or no nvcc found)";
}

#endif
