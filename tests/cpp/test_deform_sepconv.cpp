// C++ test of the CMake build (run by ctest): loads the ops library the way torch.ops.load_library
// does (dlopen, which runs its TORCH_LIBRARY registrations), then calls the ops through the
// dispatcher and checks hand-computed results, on the CPU and, when present, on a GPU.
//
//   edsc_ext_cpp_test /path/to/libedsc_ext_ops.so
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using OptTensor = std::optional<at::Tensor>;
using ForwardFn = at::Tensor(const at::Tensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                             int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const OptTensor&);
using BackwardFn = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
    int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, std::array<bool, 5>, const OptTensor&, bool);
using AddFn = at::Tensor(const at::Tensor&, const at::Tensor&);

int failures = 0;
int checks = 0;

void expect_close(const std::string& what, const at::Tensor& actual, const std::vector<double>& expected) {
  ++checks;
  const at::Tensor got = actual.to(at::kCPU, at::kDouble).contiguous().reshape({-1});
  bool ok = got.numel() == static_cast<int64_t>(expected.size());
  for (int64_t k = 0; ok && k < got.numel(); ++k) {
    ok = std::abs(got[k].item<double>() - expected[k]) <= 1e-9 * (1.0 + std::abs(expected[k]));
  }
  if (!ok) {
    ++failures;
    std::printf("FAIL %s:\n  got      ", what.c_str());
    for (int64_t k = 0; k < got.numel(); ++k) std::printf(" %g", got[k].item<double>());
    std::printf("\n  expected");
    for (double v : expected) std::printf(" %g", v);
    std::printf("\n");
  } else {
    std::printf("ok   %s\n", what.c_str());
  }
}

// A (1, C, H, W) or (1, K, H, W) tensor whose K channels are the constants in `per_channel`.
at::Tensor per_channel(const std::vector<double>& per_channel, int64_t h, int64_t w, const at::TensorOptions& o) {
  std::vector<at::Tensor> planes;
  for (double v : per_channel) planes.push_back(at::full({1, 1, h, w}, v, o));
  return at::cat(planes, 1);
}

void run_cases(const at::Device device) {
  const std::string on = " [" + device.str() + "]";
  const auto o = at::TensorOptions().dtype(at::kDouble).device(device);
  auto forward =
      c10::Dispatcher::singleton().findSchemaOrThrow("edsc_ext::deform_sepconv_forward", "").typed<ForwardFn>();
  auto backward =
      c10::Dispatcher::singleton().findSchemaOrThrow("edsc_ext::deform_sepconv_backward", "").typed<BackwardFn>();
  auto vector_add = c10::Dispatcher::singleton().findSchemaOrThrow("edsc_ext::vector_add", "").typed<AddFn>();

  // input[r][c] = 3r + c + 1:  1 2 3 / 4 5 6 / 7 8 9
  const at::Tensor input = at::arange(1, 10, o).reshape({1, 1, 3, 3});

  // 1. sepconv: 2x2 kernel, vertical (1, 2), horizontal (1, 3) at every pixel, no padding.
  //    out[y][x] = 1*in[y][x] + 3*in[y][x+1] + 2*in[y+1][x] + 6*in[y+1][x+1]
  const at::Tensor v = per_channel({1, 2}, 2, 2, o), h = per_channel({1, 3}, 2, 2, o);
  const at::Tensor out =
      forward.call(input, v, h, std::nullopt, std::nullopt, 2, 2, 0, 0, 1, 1, /*zeros*/ 0, std::nullopt);
  expect_close("separable forward" + on, out, {45, 57, 81, 93});

  // Its backward with grad_output = 1: d/dinput sums V_i*H_j over the taps reading each pixel;
  // d/dV[0] at (0,0) = in[0][0] + 3*in[0][1] = 7; d/dH[1] at (0,0) = in[0][1] + 2*in[1][1] = 12.
  const at::Tensor ones = at::ones({1, 1, 2, 2}, o);
  const std::array<bool, 5> mask5 = {true, true, true, false, false};
  auto grads = backward.call(ones, input, v, h, std::nullopt, std::nullopt, 2, 2, 0, 0, 1, 1, 0, mask5, std::nullopt,
                             /*deterministic=*/false);
  expect_close("separable grad input" + on, std::get<0>(grads), {1, 4, 3, 3, 12, 9, 2, 8, 6});
  expect_close("separable grad vertical[0]" + on, std::get<1>(grads).select(1, 0), {7, 11, 19, 23});
  expect_close("separable grad horizontal[1]" + on, std::get<2>(grads).select(1, 1), {12, 15, 21, 24});

  // 2. AdaCoF-style: 1x1 kernel, offset (dy, dx) = (0.5, 0.25), mask 2. The input is linear, so
  //    inside the image bilinear sampling gives in[y][x] + 3*0.5 + 0.25; at (2, 2) the sample
  //    point (2.5, 2.25) sees only pixel (2, 2) with weight 0.5*0.75 ('zeros': 9*0.375), or is
  //    clamped onto it ('border': 9).
  const at::Tensor offset = per_channel({0.5, 0.25}, 3, 3, o), mask = at::full({1, 1, 3, 3}, 2.0, o);
  const at::Tensor zeros =
      forward.call(input, std::nullopt, std::nullopt, offset, mask, 1, 1, 0, 0, 1, 1, 0, std::nullopt);
  const at::Tensor border =
      forward.call(input, std::nullopt, std::nullopt, offset, mask, 1, 1, 0, 0, 1, 1, 1, std::nullopt);
  expect_close("offset+mask forward, zeros, pixel (0,0)" + on, zeros.select(2, 0).select(2, 0), {2 * 2.75});
  expect_close("offset+mask forward, zeros, pixel (1,1)" + on, zeros.select(2, 1).select(2, 1), {2 * 6.75});
  expect_close("offset+mask forward, zeros, pixel (2,2)" + on, zeros.select(2, 2).select(2, 2), {2 * 3.375});
  expect_close("offset+mask forward, border, pixel (2,2)" + on, border.select(2, 2).select(2, 2), {2 * 9.0});

  // 3. EDSC mode, 1x1 kernel, split offsets (dy and dx as two zero tensors): the tap sits at
  //    (y + 1, x + 1) (shift 1 - (K-1)//2 = 1), clamped into the image, and a coordinate >= 2
  //    (= size - 1) counts its border pixel twice along that axis.
  const at::Tensor zero_offset = at::zeros({1, 1, 3, 3}, o);
  const at::Tensor edsc = forward.call(input, std::nullopt, std::nullopt, zero_offset, std::nullopt, 1, 1, 0, 0, 1, 1,
                                       /*edsc*/ 2, zero_offset.clone());
  expect_close("edsc forward, split offsets" + on, edsc, {5, 12, 12, 16, 36, 36, 16, 36, 36});

  expect_close("vector_add" + on, vector_add.call(at::arange(2, o), at::full({2}, 3.0, o)), {3, 4});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s /path/to/libedsc_ext_ops.so\n", argv[0]);
    return 2;
  }
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  try {
    run_cases(at::kCPU);
    if (at::hasCUDA()) {
      run_cases(at::Device(at::kCUDA, 0));
    } else {
      std::printf("(no CUDA device: CPU cases only)\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    return 1;
  }
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
