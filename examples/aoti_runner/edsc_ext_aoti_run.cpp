// edsc_ext_aoti_run: runs an AOTInductor package (.pt2, from torch._inductor.aoti_compile_and_package) without
// Python, on tensors saved by torch.save, and writes its outputs for torch.load.
//
//   edsc_ext_aoti_run PACKAGE.pt2 INPUTS.pt OUTPUTS.pt
//   edsc_ext_aoti_run --version
//
// INPUTS.pt holds a list (or tuple) of tensors, the model's flattened forward arguments in order, as written by
// torch.save([first, second], "inputs.pt"); they are moved to the package's device (cpu or cuda). OUTPUTS.pt gets
// the outputs as a tuple of CPU tensors: torch.load("outputs.pt"). A package compiled for CUDA needs a CUDA build
// of libtorch and of the ops library.
//
// The package's kernels are compiled into it, but a custom op stays a call by name that AOTInductor's proxy
// executor makes through the dispatcher: the op has to be registered in this process. The program links
// libedsc_ext_ops (edsc_ext::ops, with --no-as-needed, since nothing here references its symbols), whose static
// initialisers register torch.ops.edsc_ext.* when the program starts.
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#ifndef EDSC_EXT_VERSION
#define EDSC_EXT_VERSION "unknown"
#endif

namespace {

constexpr const char* kName = "edsc_ext_aoti_run";
constexpr int kUsageError = 2;  // bad arguments, missing or unreadable files
constexpr int kRunError = 1;    // the package or the model failed

// One line on stderr, then the exit code.
int fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return code;
}

// The message of an exception without c10's backtrace, on one line.
std::string describe(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

bool read_file(const std::string& path, std::vector<char>& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

// The tensors of a torch.save'd list, tuple or single tensor; false when the file holds anything else.
bool to_tensors(const c10::IValue& value, std::vector<at::Tensor>& tensors) {
  if (value.isTensor()) {
    tensors.push_back(value.toTensor());
    return true;
  }
  std::vector<c10::IValue> items;
  if (value.isList()) {
    items = value.toListRef().vec();
  } else if (value.isTuple()) {
    items = value.toTupleRef().elements().vec();
  } else {
    return false;
  }
  for (const auto& item : items) {
    if (!item.isTensor()) return false;
    tensors.push_back(item.toTensor());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = std::string("usage: ") + kName + " PACKAGE.pt2 INPUTS.pt OUTPUTS.pt  (or --version)";
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("%s %s (libtorch %s, CUDA kernels in the ops library: %s)\n", kName, EDSC_EXT_VERSION, TORCH_VERSION,
#ifdef EDSC_EXT_WITH_CUDA
                "yes"
#else
                "no"
#endif
    );
    return 0;
  }
  if (argc != 4) return fail(kUsageError, usage);
  const std::string package_path = argv[1], inputs_path = argv[2], outputs_path = argv[3];

  for (const auto& path : {package_path, inputs_path}) {
    if (!std::ifstream(path, std::ios::binary)) return fail(kUsageError, "cannot read " + path);
  }
  std::vector<char> input_bytes;
  if (!read_file(inputs_path, input_bytes)) return fail(kUsageError, "cannot read " + inputs_path);
  std::vector<at::Tensor> inputs;
  try {
    if (!to_tensors(torch::jit::pickle_load(input_bytes), inputs)) {
      return fail(kUsageError, inputs_path + " holds no list of tensors (write it with torch.save([t0, t1, ...]))");
    }
  } catch (const std::exception& e) {
    return fail(kUsageError, inputs_path + " is no torch.save file of tensors: " + describe(e));
  }
  // Checked before the (long) run; the file itself is only written once there are outputs.
  const std::filesystem::path output_folder = std::filesystem::absolute(outputs_path).parent_path();
  if (!std::filesystem::is_directory(output_folder)) {
    return fail(kUsageError, "cannot write " + outputs_path + ": no folder " + output_folder.string());
  }

  try {
    torch::inductor::AOTIModelPackageLoader loader(package_path);
    const auto metadata = loader.get_metadata();
    const auto device_key = metadata.find("AOTI_DEVICE_KEY");
    const c10::Device device(device_key != metadata.end() ? device_key->second : "cpu");
    for (auto& tensor : inputs) tensor = tensor.to(device);

    const auto start = std::chrono::steady_clock::now();
    std::vector<at::Tensor> outputs = loader.run(inputs);
    // A tuple: torch.load's default weights_only unpickler accepts it; a list is pickled with a type tag
    // (torch.jit._pickle.restore_type_tag) that it refuses.
    std::vector<c10::IValue> saved;
    for (const auto& tensor : outputs) saved.emplace_back(tensor.cpu());  // .cpu() waits for a CUDA model
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

    const std::vector<char> bytes = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(saved)));
    std::ofstream out(outputs_path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) return fail(kUsageError, "cannot write " + outputs_path);
    std::printf("%s: %s on %s: %zu inputs -> %zu outputs in %.1f ms, written to %s\n", kName, package_path.c_str(),
                device.str().c_str(), inputs.size(), outputs.size(), ms, outputs_path.c_str());
    return 0;
  } catch (const std::exception& e) {
    return fail(kRunError, "running " + package_path + " failed: " + describe(e));
  }
}
