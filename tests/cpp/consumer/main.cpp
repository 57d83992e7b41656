// A program linked to edsc_ext::ops (find_package(edsc_ext)) that loads nothing itself: the ops must
// be registered with the dispatcher because the program links the library, and the installed C++ API
// header must compile. Checks one hand-computed sepconv result on the CPU.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "edsc_ext/edsc_ext.h"  // the installed C++ API (include/edsc_ext/), from the target's include dirs

int main() {
  try {
    const auto o = at::TensorOptions().dtype(at::kDouble);
    // input 1 2 3 / 4 5 6 / 7 8 9; 2x2 separable kernel, vertical (1, 2), horizontal (1, 3) everywhere:
    // out[y][x] = in[y][x] + 3 in[y][x+1] + 2 in[y+1][x] + 6 in[y+1][x+1]
    const at::Tensor input = at::arange(1, 10, o).reshape({1, 1, 3, 3});
    const at::Tensor v = at::cat({at::full({1, 1, 2, 2}, 1.0, o), at::full({1, 1, 2, 2}, 2.0, o)}, 1);
    const at::Tensor h = at::cat({at::full({1, 1, 2, 2}, 1.0, o), at::full({1, 1, 2, 2}, 3.0, o)}, 1);
    const at::Tensor out = edsc_ext::deform_sepconv_forward(input, v, h, std::nullopt, std::nullopt, 2, 2, 0, 0, 1, 1,
                                                            edsc_ext::kPaddingZeros)
                               .reshape({-1});
    const std::vector<double> expected = {45, 57, 81, 93};
    bool ok = out.numel() == 4;
    for (int64_t k = 0; ok && k < 4; ++k) ok = std::abs(out[k].item<double>() - expected[k]) < 1e-12;
    std::printf("edsc_ext::deform_sepconv_forward (max kernel width %lld): %g %g %g %g (expected 45 57 81 93): %s\n",
                static_cast<long long>(edsc_ext::kMaxKernelWidth), out[0].item<double>(), out[1].item<double>(),
                out[2].item<double>(), out[3].item<double>(), ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
}
